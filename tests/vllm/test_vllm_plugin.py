"""relayc's vLLM plugin against vLLM 0.33.0's own modules: vLLM's plugin loader finds it
through a `vllm.general_plugins` entry point, and it points vLLM's names at the generated
relay and serves RequestState's speculative tensors from the generated state.

Runs in the vLLM venv (scripts/test-vllm.sh). model_runner.py, which imports the five
functions and RequestState by name, does not import on a CPU without vLLM's config stack
(pydantic, transformers, zmq, ...): a module standing in for it imports the same names the
same way. RequestState's own `__init__` and `add_request` cannot run here (its staged
buffers ask for pinned memory, docs/vllm.md); the relayed tensors are checked with vLLM's
kernels and vLLM's own statements on them.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

try:
    vllm_plugins: types.ModuleType | None = importlib.import_module("vllm.plugins")
except ImportError:
    if os.environ.get("RELAYC_REQUIRE_VLLM"):
        raise
    vllm_plugins = None
pytestmark = pytest.mark.skipif(
    vllm_plugins is None,
    reason="vLLM 0.33.0 is not importable here; the plugin test runs in its own venv "
    "(scripts/test-vllm.sh, docs/vllm.md)",
)

from relayc.vllm_generated import relayc_vllm_plugin as plugin  # noqa: E402
from relayc.vllm_generated import vllm_relay as gen  # noqa: E402

NAMES = (*plugin.FUNCTIONS, "RequestState")
BY_NAME = "vllm.v1.worker.gpu.relayc_by_name_importer"  # model_runner.py's stand-in
SLOTS = 6


class Vllm(types.SimpleNamespace):
    input_batch: types.ModuleType
    states: types.ModuleType
    by_name: types.ModuleType
    own: dict[str, object]  # vLLM's originals of NAMES


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Vllm]:
    """vLLM's modules, each name the plugin may replace restored afterwards (the
    differential test needs vLLM's own functions), and an entry point for the plugin."""
    assert vllm_plugins is not None
    input_batch = importlib.import_module(plugin.VLLM_INPUT_BATCH)
    states = importlib.import_module(plugin.VLLM_STATES)
    own = {name: getattr(input_batch, name) for name in plugin.FUNCTIONS}
    own["RequestState"] = states.RequestState
    by_name = types.ModuleType(BY_NAME)
    for name, value in own.items():  # `from ...input_batch import post_update, ...`
        setattr(by_name, name, value)
    monkeypatch.setitem(sys.modules, BY_NAME, by_name)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("vllm.") and module is not None:
            for attr in NAMES:
                if attr in vars(module):
                    monkeypatch.setattr(module, attr, getattr(module, attr))
    dist = tmp_path / "relayc_vllm_plugin_test-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: relayc-vllm-plugin-test\n")
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\nrelayc = {plugin.__name__}:register\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(vllm_plugins, "plugins_loaded", False)
    yield Vllm(input_batch=input_batch, states=states, by_name=by_name, own=own)


def test_vllms_plugin_loader_installs_the_generated_relay(
    vllm: Vllm, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert vllm_plugins is not None
    monkeypatch.setenv(plugin.METHOD_ENV, "eagle3")
    vllm_plugins.load_general_plugins()  # vLLM's loader, through the entry point
    for name in plugin.FUNCTIONS:
        assert getattr(vllm.input_batch, name) is getattr(gen, name), name
        assert getattr(vllm.by_name, name) is getattr(gen, name), name
        assert vllm.own[name] is not getattr(gen, name)
    relayed = vllm.states.RequestState
    assert relayed is vllm.by_name.RequestState and relayed is not vllm.own["RequestState"]
    assert issubclass(relayed, vllm.own["RequestState"]) and relayed.relay_method == "eagle3"
    # vLLM may load plugins more than once in a process: nothing is wrapped twice.
    monkeypatch.setattr(vllm_plugins, "plugins_loaded", False)
    vllm_plugins.load_general_plugins()
    assert vllm.states.RequestState is relayed


def test_request_states_speculative_tensors_are_the_generated_states(
    vllm: Vllm, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = plugin.install("eagle")
    # What RequestState.__init__ does first, here without vLLM's pinned-memory buffers.
    req_states = object.__new__(cls)
    req_states.relay = plugin.relay_state_class(cls.relay_method, 2)(SLOTS, 2, "cpu")
    assert type(req_states.relay) is gen.EagleRelayState
    # vLLM's own allocation statements in RequestState.__init__ land in the generated state.
    req_states.last_sampled_tokens = torch.zeros(SLOTS, 1, dtype=torch.int64)
    req_states.draft_tokens = torch.zeros(SLOTS, 2, dtype=torch.int64)
    assert req_states.last_sampled_tokens is req_states.relay.last_sampled_tokens
    assert req_states.draft_tokens is req_states.relay.draft_tokens
    # vLLM's own post_update kernel, given RequestState's attributes as model_runner passes
    # them, writes the generated state's tensors.
    req_states.relay.add_request(3, 5, 5)
    total_len = torch.full((SLOTS,), 5, dtype=torch.int32)
    vllm.own["post_update"](
        torch.tensor([3], dtype=torch.int32),  # idx_mapping
        torch.full((SLOTS,), 5, dtype=torch.int32),  # num_computed_tokens
        req_states.last_sampled_tokens,
        None,  # output_bin_counts
        torch.tensor([[17, -1, -1]]),  # sampled_tokens
        torch.tensor([1], dtype=torch.int32),  # num_sampled
        torch.tensor([0], dtype=torch.int32),  # num_rejected
        torch.tensor([0, 1], dtype=torch.int32),  # query_start_loc
        torch.zeros(SLOTS, 16, dtype=torch.int32),  # all_token_ids
        total_len,
        torch.tensor([[21, 22]]),  # draft_tokens
        req_states.draft_tokens,  # draft_tokens_out
    )
    assert int(req_states.relay.last_sampled_tokens[3, 0]) == 17
    assert req_states.relay.draft_tokens[3].tolist() == [21, 22]
    # vLLM's add_request resets the slot's drafts on RequestState's attribute: the generated
    # state's row.
    req_states.draft_tokens[3].zero_()
    assert req_states.relay.draft_tokens[3].tolist() == [0, 0]
    # The installed combine (vLLM's name, the generated function) finds the slot history
    # through RequestState's tensor: a fresh slot's placeholder is refused.
    monkeypatch.setattr(gen.runtime, "VALUE_CHECKS", True)
    req_states.relay.add_request(4, 5, 5)
    with pytest.raises(gen.RelayError, match="reads its last sampled token"):
        vllm.input_batch.combine_sampled_and_draft_tokens(
            torch.full((8,), -9, dtype=torch.int32),
            torch.tensor([4], dtype=torch.int32),
            req_states.last_sampled_tokens,
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([6], dtype=torch.int32),
            torch.full((SLOTS,), 5, dtype=torch.int32),
            req_states.draft_tokens,
            torch.tensor([0, 1], dtype=torch.int32),
            1,
        )
