"""relayc's vLLM plugin: points vLLM 0.33.0's Model Runner V2 at the generated relay.

Hand-written; `relayc compile --target vllm` copies it unchanged beside the generated
`vllm_relay.py` as `relayc_vllm_plugin.py`. vLLM calls `register()` from a
`vllm.general_plugins` entry point in every process before it builds the model runner
(docs/vllm.md); `install()` then

- points input_batch.py's five relay updates at the generated ones, in input_batch and in
  every vLLM module already loaded that imported them by name (model_runner.py, the
  samplers): those imported later read input_batch's names, which are then the generated;
- replaces `RequestState` (vllm/v1/worker/gpu/states.py) with a subclass whose speculative
  tensors, `last_sampled_tokens` and `draft_tokens`, are those of the generated state class
  for vLLM's method: vLLM's code reads and writes them as before, and the generated
  functions find the slot history their placeholder-leak check needs. The rest of
  RequestState (its staged `num_computed_tokens` and `total_len`, `all_token_ids`, the
  request maps) stays vLLM's.

vLLM is imported only inside `install()`, by name: the generated module beside this file
imports none of it, and this file imports without it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from types import ModuleType
from typing import Any

import torch

VLLM_STATES = "vllm.v1.worker.gpu.states"
VLLM_INPUT_BATCH = "vllm.v1.worker.gpu.input_batch"
# input_batch.py's relay updates; the generated module defines each under the same name.
FUNCTIONS = (
    "combine_sampled_and_draft_tokens",
    "get_num_sampled_and_rejected",
    "post_update",
    "post_update_num_computed_tokens",
    "prepare_pos_seq_lens",
)
# The environment variable naming vLLM's speculative method when vLLM's config cannot say
# (the generated state class is chosen per method; DSpark's holds the confidence relay).
METHOD_ENV = "RELAYC_VLLM_METHOD"


def relay_module() -> ModuleType:
    """The generated vllm_relay.py beside this file: its package's when in one, else the
    top-level module (both files copied onto sys.path). Looked up when used, so that this
    file's source under relayc/compiler/targets/ imports without a generated module."""
    return importlib.import_module(f"{__package__}.vllm_relay" if __package__ else "vllm_relay")


class RelayedTensor:
    """A RequestState attribute served by the generated state (`self.relay`). Reads return
    the generated state's tensor; an assignment (vLLM's `__init__` allocating its own)
    copies into it, so the tensor the generated functions registered stays the one vLLM
    passes them."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, state: Any, owner: type | None = None) -> Any:
        if state is None:
            return self
        return getattr(state.relay, self.name)

    def __set__(self, state: Any, value: torch.Tensor) -> None:
        getattr(state.relay, self.name).copy_(value)


def relay_state_class(method: str | None, num_speculative_steps: int) -> type[Any]:
    """The generated state class for vLLM's ``method``; raises RelayError for one the
    generated module was not compiled for."""
    vllm_relay = relay_module()
    if num_speculative_steps == 0:
        method = None
    elif method is None:
        raise vllm_relay.RelayError(
            f"relayc's vLLM plugin: RequestState has {num_speculative_steps} speculative "
            f"steps but the method is unknown ({METHOD_ENV} is unset and vLLM's current "
            f"config gives none); set {METHOD_ENV} to vLLM's `speculative_config.method`"
        )
    if method not in vllm_relay.STATES:
        served = ", ".join(sorted(str(m) for m in vllm_relay.STATES))
        raise vllm_relay.RelayError(
            f"relayc's vLLM plugin: vLLM runs speculative method {method!r}, for which "
            f"{vllm_relay.__name__} holds no relay state (it serves {served}); compile the "
            f"method's spec with `relayc compile --target vllm`, set {METHOD_ENV} to the "
            "method vLLM runs, or uninstall the plugin"
        )
    state: type[Any] = vllm_relay.STATES[method]
    return state


def _vllms_method() -> str | None:
    """`speculative_config.method` of vLLM's current config (set while vLLM builds the
    model runner); None when there is none to read."""
    try:
        config = importlib.import_module("vllm.config").get_current_vllm_config_or_none()
    except ImportError:
        return None
    speculative = getattr(config, "speculative_config", None)
    method = getattr(speculative, "method", None)
    return method if isinstance(method, str) else None


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    """RequestState.__init__: the generated state first, so that vLLM's own allocation of
    the relayed tensors lands in it."""
    base = type(self).vllm_request_state
    bound = inspect.signature(base.__init__).bind(self, *args, **kwargs).arguments
    steps = bound["num_speculative_steps"]
    method = type(self).relay_method or _vllms_method()
    state = relay_state_class(method, steps)
    self.relay = state(bound["max_num_reqs"], steps, bound["device"])
    base.__init__(self, *args, **kwargs)


def _add_request(self: Any, *args: Any, **kwargs: Any) -> None:
    """RequestState.add_request, then the generated state's for the slot vLLM picked."""
    base = type(self).vllm_request_state
    base.add_request(self, *args, **kwargs)
    bound = inspect.signature(base.add_request).bind(self, *args, **kwargs).arguments
    slot = self.req_id_to_index[bound["req_id"]]
    self.relay.add_request(slot, len(bound["all_token_ids"]), bound["num_computed_tokens"])


def request_state_class(base: type[Any], method: str | None = None) -> type[Any]:
    """vLLM's RequestState (``base``) with its speculative tensors served by the generated
    state class of ``method`` (None: read from vLLM's config when the state is built)."""
    relay = relay_module().__name__
    return type(
        "RelayRequestState",
        (base,),
        {
            "__doc__": f"vLLM's RequestState; last_sampled_tokens and draft_tokens are "
            f"those of {relay}'s state for the method (relayc's vLLM plugin).",
            "__module__": __name__,
            "vllm_request_state": base,
            "relay_method": method,
            "last_sampled_tokens": RelayedTensor(),
            "draft_tokens": RelayedTensor(),
            "__init__": _init,
            "add_request": _add_request,
        },
    )


def install(method: str | None = None) -> type[Any]:
    """Point vLLM's loaded modules at the generated relay (the module docstring says what);
    returns the RequestState class vLLM now builds. Idempotent: vLLM may load plugins more
    than once in a process."""
    states = importlib.import_module(VLLM_STATES)
    input_batch = importlib.import_module(VLLM_INPUT_BATCH)
    if getattr(states.RequestState, "vllm_request_state", None) is not None:
        installed: type[Any] = states.RequestState
        return installed
    vllm_relay = relay_module()
    relayed = request_state_class(states.RequestState, method)
    # By identity, not by name: another vLLM module may define its own `post_update`.
    replace: dict[int, tuple[Any, Any]] = {id(states.RequestState): (states.RequestState, relayed)}
    for name in FUNCTIONS:
        vllms = getattr(input_batch, name)
        replace[id(vllms)] = (vllms, getattr(vllm_relay, name))
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "vllm" or module_name.startswith("vllm.")):
            continue
        for attr, value in list(vars(module).items()):
            found = replace.get(id(value))
            if found is not None and found[0] is value:
                setattr(module, attr, found[1])
    return relayed


def register() -> None:
    """The `vllm.general_plugins` entry point: `install()` for the method named by
    RELAYC_VLLM_METHOD, else the one vLLM's config gives when RequestState is built."""
    install(os.environ.get(METHOD_ENV) or None)
