"""The EAGLE-3 draft head: multi-layer target features, its own layer, vocabulary and d2t map.

SGLang 0.5.23's ``LlamaForCausalLMEagle3`` (``models/llama_eagle3.py``), one layer:

- the target returns the inputs of three of its decoder layers (SGLang's
  ``set_eagle3_layers_to_capture``: ``[2, L // 2, L - 3]`` by default, or ``id + 1`` for
  each id of the head's ``eagle_config.eagle_aux_hidden_state_layer_ids``), concatenated
  in layer order: ``[T, 3 * hidden]`` (``ForwardOutput.aux_hidden_states``);
- draft extend projects them with ``fc`` (``3 * hidden -> hidden``); draft steps after it
  feed the head's own output ``g`` back instead (hidden wide: no ``fc``, SGLang's shape
  test in ``LlamaModel.forward``);
- the layer (``midlayer``) normalises the token embedding (``input_layernorm``, the
  target's embedding) and the hidden input (``hidden_norm``) separately and attends over
  their concatenation ``[embed; hidden]`` (q/k/v read ``2 * hidden``); the hidden input
  is the residual; ``g`` is its output *before* the final ``norm``, as SGLang relays it;
- ``lm_head`` scores the head's own reduced vocabulary; ``d2t[i]`` is the offset that
  takes draft id ``i`` to target id ``i + d2t[i]`` (SGLang's ``hot_token_id``).

Draft ids stay draft ids through drafting -- the relayed ``topk_index`` and the tree's
``draft_tokens`` -- and :meth:`Eagle3Head.to_target_ids` maps them where a target id is
needed: the embedding of the next draft step, and the ``draft_to_target`` step before the
tree is built (``relayc/specs/eagle3.yaml``). Drafting itself (``draft_tree``, the KV
layout, scratch slots) is :class:`EagleHead`'s, through :meth:`step` and :meth:`logits`.

Checkpoints use the EAGLE-3 layout SGLang and SpecForge read: ``config.json`` (a Llama
config with ``num_hidden_layers: 1``, ``draft_vocab_size`` and optionally ``eagle_config``)
and safetensors holding ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``,
``d2t`` (int64 offsets) and ``t2d`` (bool, which target ids the draft vocabulary holds).
An ``embed_tokens.weight`` in the file is ignored: SGLang replaces it with the target's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from relayc.engine.core.attention import PagedAttend, dense_causal_attention
from relayc.engine.core.config import (
    ConfigError,
    ModelConfig,
    config_list,
    config_value,
    shown,
    whole_number,
)
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.core.layers import (
    AttendFn,
    Linear,
    RMSNorm,
    RotaryEmbedding,
)
from relayc.engine.decoder.head import (
    NativeHead,
    NativeLinear,
    native_head_eligible,
    native_head_library,
)
from relayc.engine.decoder.packing import NATIVE_DTYPES
from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.layers import (
    Eagle3Layer,
    TargetParts,
    check_head_config,
    eagle3_layer_shapes,
)
from relayc.engine.draft.native_draft import NativeDraft
from relayc.engine.draft.paged import (
    gather_rows,
    last_rows,
    padded_extend_batch,
    padding_rows_zeroed,
    top_k_probs,
)
from relayc.engine.draft.weights import check_draft_tensors, init_module_random
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import read_json_object, reading_safetensors

ARCHITECTURE = "LlamaForCausalLMEagle3"
NUM_FEATURE_LAYERS = 3  # the eagle3 spec's `3*hidden` features (SGLang's default count)
LAYER_IDS_KEY = "eagle_aux_hidden_state_layer_ids"
# config.json options of SGLang's EAGLE-3 head this one does not implement, each a clear error.
_UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output", "bias")


def capture_layers(num_layers: int, layer_ids: Sequence[int] | None = None) -> tuple[int, ...]:
    """The target layers whose *inputs* EAGLE-3 reads, as SGLang 0.5.23's
    ``LlamaForCausalLM.set_eagle3_layers_to_capture`` picks them: ``[2, L // 2, L - 3]``
    without ``layer_ids``, else ``id + 1`` per id (the output of layer ``id``). Three
    distinct layers in ``0..L-1``, in layer order, or a ValueError saying what to set."""
    if layer_ids is None:
        chosen = [2, num_layers // 2, num_layers - 3]
        source = f"SGLang's default [2, L // 2, L - 3] for the target's L = {num_layers} layers"
    else:
        ids = list(layer_ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"`eagle_config.{LAYER_IDS_KEY}` must list layer ids; got {ids}")
        chosen = [i + 1 for i in ids]
        source = f"`eagle_config.{LAYER_IDS_KEY}` {ids} (+1 each, as SGLang reads them)"
    if (
        len(chosen) != NUM_FEATURE_LAYERS
        or len(set(chosen)) != len(chosen)
        or not all(0 <= i < num_layers for i in chosen)
    ):
        raise ValueError(
            f"EAGLE-3 reads the inputs of {NUM_FEATURE_LAYERS} distinct target layers in "
            f"0..{num_layers - 1}; {source} gives {chosen}. Name {NUM_FEATURE_LAYERS} layer ids "
            f"in 0..{num_layers - 2} as `eagle_config.{LAYER_IDS_KEY}` in the head's config.json"
        )
    return tuple(sorted(chosen))


class Eagle3ExtendOutput(NamedTuple):
    """What EAGLE-3's draft extend relays: the next top-k (draft ids) and the head's last g."""

    topk_p: torch.Tensor  # [B, topk] float32
    topk_index: torch.Tensor  # [B, topk] int64, ids of the head's draft vocabulary
    hidden_states: torch.Tensor  # [B, hidden] model dtype, the head's g at the last position


class Eagle3Head(EagleHead):
    """A one-layer EAGLE-3 head over ``target``'s embedding, with its own LM head.

    ``config`` describes the head's layer (``hidden_size`` and ``vocab_size`` are the
    target's); ``capture`` the target layers it reads (:func:`capture_layers`). Weights
    start uninitialised: use :meth:`random` or :meth:`load`. Tree drafting is
    :class:`EagleHead`'s; the embedding of a draft step looks up ``to_target_ids(ids)``.
    """

    DRAFT_TYPE = "eagle3"
    native_draft: NativeDraft  # always one: draft extend and chains in one native call each
    extend_gathers_rows = True  # extend takes `feature_rows` (the verify's accepted nodes)

    def __init__(
        self,
        config: ModelConfig,
        target: LlamaForCausalLM,
        *,
        draft_vocab_size: int,
        capture: Sequence[int],
    ) -> None:
        # EagleHead's drafting, not its layer: its constructor would build an EAGLE layer.
        nn.Module.__init__(self)
        check_head_config(config, target)
        if not 0 < draft_vocab_size <= config.vocab_size:
            raise ValueError(
                f"`draft_vocab_size` must lie in 1..{config.vocab_size} (the target's "
                f"vocabulary); got {draft_vocab_size}"
            )
        self.config = config.replace(num_layers=1)
        self.target = TargetParts.of(target)
        self.capture = tuple(capture)
        hidden, dtype = config.hidden_size, config.dtype
        self.fc = Linear(len(self.capture) * hidden, hidden, dtype)
        self.midlayer = Eagle3Layer(self.config)
        self.norm = RMSNorm(hidden, config.rms_norm_eps, dtype)
        self.lm_head = Linear(hidden, draft_vocab_size, dtype)
        self.d2t: torch.Tensor
        self.t2d: torch.Tensor
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position)
        self._native_head: NativeHead | None = None
        self._native_fc: NativeLinear | None = None
        self.native_draft = NativeDraft()
        self.to(target.device)

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def set_vocabulary(self, target_ids: Sequence[int] | torch.Tensor) -> None:
        """Make draft id ``i`` stand for target id ``target_ids[i]`` (sets ``d2t`` and ``t2d``)."""
        ids = torch.as_tensor(target_ids, dtype=torch.int64, device=self.d2t.device)
        check_vocabulary(ids, self.config.vocab_size, self.draft_vocab_size, "`target_ids`")
        with torch.no_grad():
            self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
            self.t2d.zero_()
            self.t2d[ids] = True

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of draft ids (any shape): ``i + d2t[i]``, SGLang's ``hot_token_id[i]``."""
        return draft_ids + self.d2t[draft_ids]

    @classmethod
    def random(  # type: ignore[override]
        cls,
        target: LlamaForCausalLM,
        seed: int,
        *,
        draft_vocab_size: int | None = None,
        layer_ids: Sequence[int] | None = None,
        config: ModelConfig | None = None,
    ) -> Eagle3Head:
        """A seeded random head (tests; untrained). Its draft vocabulary is
        ``draft_vocab_size`` target ids drawn by the seed (default: all, in order)."""
        config = config or target.config
        size = draft_vocab_size or config.vocab_size
        head = cls(
            config,
            target,
            draft_vocab_size=size,
            capture=capture_layers(target.config.num_layers, layer_ids),
        )
        init_module_random(head, seed)
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(config.vocab_size, generator=generator)[:size].sort().values
        head.set_vocabulary(chosen if size < config.vocab_size else torch.arange(size))
        return head

    def save(self, directory: str | Path) -> Path:
        """``config.json`` + ``model.safetensors`` in the EAGLE-3 layout SGLang loads."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        header = {
            **self.config.to_hf_config(),
            "architectures": [ARCHITECTURE],
            "num_hidden_layers": 1,
            "tie_word_embeddings": False,
            "draft_vocab_size": self.draft_vocab_size,
            "eagle_config": {LAYER_IDS_KEY: [i - 1 for i in self.capture]},
        }
        (directory / "config.json").write_text(json.dumps(header, indent=2, sort_keys=True) + "\n")
        tensors = {
            name: tensor.detach().to("cpu").contiguous()
            for name, tensor in sorted(self.state_dict().items())
        }
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory

    @staticmethod
    def tensor_shapes(  # type: ignore[override]
        config: ModelConfig, draft_vocab_size: int, num_features: int
    ) -> dict[str, tuple[int, ...]]:
        """The head's state-dict names and shapes (``num_features`` target layers read),
        without building it."""
        hidden = config.hidden_size
        midlayer = {
            f"midlayer.{name}": shape for name, shape in eagle3_layer_shapes(config).items()
        }
        return {
            "d2t": (draft_vocab_size,),
            "fc.weight": (hidden, num_features * hidden),
            "lm_head.weight": (draft_vocab_size, hidden),
            **midlayer,
            "norm.weight": (hidden,),
            "t2d": (config.vocab_size,),
        }

    @classmethod
    def load(cls, directory: str | Path, target: LlamaForCausalLM) -> Eagle3Head:
        """An EAGLE-3 head from ``directory`` (SGLang / SpecForge layout), for ``target``;
        the config's sizes are checked against the safetensors headers before it is built."""
        directory = Path(directory)
        header = _read_config(directory)
        where = directory / "config.json"
        try:
            config = ModelConfig.from_hf_config(header).replace(dtype=target.config.dtype)
            check_head_config(config, target)
            eagle_config = config_value(header, "eagle_config", dict, {})
            layer_ids = config_list(
                eagle_config,
                LAYER_IDS_KEY,
                int,
                max_items=(NUM_FEATURE_LAYERS, "EAGLE-3 reads that many target layers"),
                within="eagle_config",
            )
            capture = capture_layers(target.config.num_layers, layer_ids)
            # its bound is the safetensors headers' (the draft LM head's rows), checked next
            draft_vocab_size = whole_number(header, "draft_vocab_size", config.vocab_size)
        except ValueError as exc:  # ConfigError among them
            raise CheckpointError(str(exc), where) from None
        check_draft_tensors(
            directory,
            lambda: cls.tensor_shapes(config, draft_vocab_size, len(capture)),
            kind="an EAGLE-3 head",
            files=_weight_files(directory),
            # d2t defaults to no offsets where the draft vocabulary is the target's; t2d
            # follows from d2t; the embedding is the target's (SGLang's loader drops it).
            optional={"t2d"} | ({"d2t"} if draft_vocab_size == config.vocab_size else set()),
            ignored=("embed_tokens.weight",),
        )
        try:
            head = cls(config, target, draft_vocab_size=draft_vocab_size, capture=capture)
        except ValueError as exc:
            raise CheckpointError(f"{where}: {exc}") from exc
        _load_tensors(head, directory)
        return head

    def make_kv_cache(self, size: int) -> KVCache:
        return KVCache.for_model(self.config, size, self.device)

    def step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step over flat tokens: ``input_ids`` are *draft* ids, ``hidden`` the
        head's previous g. ``(logits [T, draft_vocab] float32, g [T, hidden])``."""
        embeds = self.target.embed_tokens(self.to_target_ids(input_ids))
        out = self.midlayer(embeds, hidden, positions, self.rotary, attend)
        return self.logits(out), out

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """``[..., draft_vocab]`` float32 logits of ``g``: the native decoder's LM head on
        the CPU (its own vocabulary is most of the head's weights: the library GEMM is
        several times slower on the few rows drafting has), else the modules."""
        lib = native_head_library(g, self.lm_head.weight.dtype)
        if lib is not None:
            head = self._native_head = NativeHead.reuse(self._native_head, self.norm, self.lm_head)
            return head.logits(lib, g)
        return self.lm_head(self.norm(g)).float()

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``fc`` of the target features ``[..., 3 * hidden]``: the native decoder's GEMM on
        the CPU (``NativeLinear``: the library GEMM took several times as long on a draft
        extend's few rows), else the module."""
        weight = self.fc.weight
        lib = native_head_library(features, weight.dtype)
        if lib is not None and weight.device.type == "cpu" and weight.dtype in NATIVE_DTYPES:
            fc = self._native_fc = NativeLinear.reuse(self._native_fc, self.fc)
            return fc(lib, features)
        return self.fc(features)

    def prepare_native(self) -> bool:
        """Pack the head's LM head and ``fc`` for the native decoder now rather than at the
        first draft (``relayc.engine.model.llama.prepare_cpu_decoders``); False where they would
        not run natively."""
        if not native_head_eligible(self.norm, self.lm_head):
            return False
        self._native_head = NativeHead.reuse(self._native_head, self.norm, self.lm_head)
        if self.fc.weight.device.type == "cpu" and self.fc.weight.dtype in NATIVE_DTYPES:
            self._native_fc = NativeLinear.reuse(self._native_fc, self.fc)
        return True

    @torch.no_grad()
    def extend(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        target_features: torch.Tensor,
        lens: torch.Tensor,
        prefix_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        *,
        topk: int,
        max_prefix_len: int,
        out_cache_loc: torch.Tensor | None = None,
        feature_rows: torch.Tensor | None = None,
    ) -> Eagle3ExtendOutput:
        """Draft extend, as :meth:`EagleHead.extend` lays it out: ``input_ids [B, W]`` are
        *target* ids (the tokens after the ones ``target_features [B, W, 3 * hidden]`` were
        computed at), ``fc`` projects the features. The next top-k is in draft ids.

        ``feature_rows [B, W]``: ``target_features`` are a verify's ``[..., 3 * hidden]``
        and row ``(b, i)`` reads its row ``feature_rows[b, i]`` (of the rows flattened; a
        real row's must be one of them, a padding row's is not read) -- the accepted nodes'
        features, gathered in the native call instead of copied out first."""
        batch_size, width = input_ids.shape
        if topk > self.draft_vocab_size:
            raise ValueError(
                f"`topk` ({topk}) exceeds the EAGLE-3 head's draft vocabulary "
                f"({self.draft_vocab_size} tokens)"
            )
        made = self.native_draft.extend(
            self,
            input_ids,
            target_features,
            lens,
            prefix_lens,
            req_pool_indices,
            req_to_token,
            kv_cache,
            max_prefix_len,
            out_cache_loc,
            feature_rows,
        )
        if made is not None:  # the same values in one native call
            out, logits = made
            topk_p, topk_index, _ = top_k_probs(logits, topk)
            return Eagle3ExtendOutput(topk_p, topk_index, out)
        if feature_rows is not None:  # padding rows' entries are not read
            real = torch.arange(width, device=lens.device)[None, :] < lens[:, None]
            target_features = gather_rows(target_features, torch.where(real, feature_rows, -1))
        input_ids, target_features = padding_rows_zeroed(lens, input_ids, target_features)
        batch = padded_extend_batch(
            input_ids,
            lens,
            prefix_lens,
            req_pool_indices,
            req_to_token,
            kv_cache,
            max_prefix_len,
            out_cache_loc,
            self.config.max_position,
        )
        features = target_features.reshape(batch_size * width, -1).to(self.fc.weight.dtype)
        out = self.midlayer(
            self.target.embed_tokens(batch.input_ids),
            self.project(features),
            batch.positions,
            self.rotary,
            PagedAttend.build(batch),
        )[last_rows(lens, width)]
        topk_p, topk_index, _ = top_k_probs(self.logits(out), topk)
        return Eagle3ExtendOutput(topk_p, topk_index, out)

    @torch.no_grad()
    def forward_dense(
        self, input_ids: torch.Tensor, target_features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft extend's reference: one sequence ``[S]`` of target ids from position 0 with
        its features ``[S, 3 * hidden]``, no cache: ``(logits [S, draft_vocab], g [S, hidden])``."""
        positions = torch.arange(input_ids.numel(), device=input_ids.device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return dense_causal_attention(q, k, v)

        hidden = self.fc(target_features.to(self.fc.weight.dtype))
        out = self.midlayer(
            self.target.embed_tokens(input_ids), hidden, positions, self.rotary, attend
        )
        return self.logits(out), out


def check_vocabulary(target_ids: torch.Tensor, vocab_size: int, size: int, what: str) -> None:
    """``target_ids`` (one per draft id) must be ``size`` distinct ids of the target."""
    if target_ids.shape != (size,):
        raise ValueError(f"{what} must hold {size} target ids; got shape {list(target_ids.shape)}")
    bad = (target_ids < 0) | (target_ids >= vocab_size)
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{what} maps draft id {first} to target id {int(target_ids[first])}, outside the "
            f"target's vocabulary 0..{vocab_size - 1}"
        )
    if target_ids.unique().numel() != size:
        raise ValueError(f"{what} maps two draft ids to the same target id")


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"EAGLE-3 head directory {directory} has no config.json")
    header = read_json_object(path)
    try:
        architectures = config_list(
            header, "architectures", str, max_items=(8, "it names a model class")
        )
        eagle_config = config_value(header, "eagle_config", dict, {})
    except ConfigError as exc:
        raise CheckpointError(str(exc), path) from None
    if architectures and not any("Eagle3" in a for a in architectures):
        raise CheckpointError(
            f"`architectures` is {shown(architectures)}, not an EAGLE-3 head "
            f"({ARCHITECTURE}); for an EAGLE-1 head use algorithm='eagle'",
            path,
        )
    problems = []
    if header.get("num_hidden_layers", 1) != 1:
        problems.append(f"`num_hidden_layers: {shown(header['num_hidden_layers'])}` (one only)")
    if header.get("tie_word_embeddings"):
        problems.append("`tie_word_embeddings: true` (the head needs its own lm_head)")
    target_hidden = header.get("target_hidden_size")
    if target_hidden is not None and target_hidden != header.get("hidden_size"):
        problems.append(
            f"`target_hidden_size: {shown(target_hidden)}` unlike the head's `hidden_size`"
        )
    for flag in _UNSUPPORTED_FLAGS:
        if header.get(flag) or eagle_config.get(flag):
            problems.append(f"`{flag}: true`")
    if problems:
        raise CheckpointError(
            "relayc's EAGLE-3 head does not implement " + "; ".join(problems), path
        )
    return header


def _weight_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        found = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
        raise CheckpointError(
            f"EAGLE-3 head directory {directory} has no *.safetensors file (found: {found}); "
            "convert a pytorch_model.bin with safetensors.torch.save_file"
        )
    return files


def _load_tensors(head: Eagle3Head, directory: Path) -> None:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(directory):
        with reading_safetensors(path):
            tensors.update(load_file(str(path)))
    tensors.pop("embed_tokens.weight", None)  # SGLang uses the target's embedding instead
    expected = head.state_dict()
    if "d2t" not in tensors and head.draft_vocab_size == head.config.vocab_size:
        tensors["d2t"] = torch.zeros(head.draft_vocab_size, dtype=torch.int64)
    if "t2d" not in tensors:  # optional: derived from d2t
        tensors["t2d"] = torch.zeros(head.config.vocab_size, dtype=torch.bool)
        if "d2t" in tensors:
            ids = tensors["d2t"].long() + torch.arange(tensors["d2t"].numel())
            tensors["t2d"][ids.clamp(0, head.config.vocab_size - 1)] = True
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        parts = [f"lacks {', '.join(f'`{n}`' for n in missing)}"] if missing else []
        parts += [f"has unexpected {', '.join(f'`{n}`' for n in unexpected)}"] if unexpected else []
        raise CheckpointError(f"EAGLE-3 head {directory} " + " and ".join(parts))
    with torch.no_grad():
        for name, param in expected.items():
            tensor = tensors[name]
            if tensor.shape != param.shape:
                raise CheckpointError(
                    f"tensor `{name}` in {directory} has shape {list(tensor.shape)}, the "
                    f"config needs {list(param.shape)}"
                )
            param.copy_(tensor.to(param.dtype))
    try:
        ids = head.d2t + torch.arange(head.draft_vocab_size, device=head.d2t.device)
        check_vocabulary(ids, head.config.vocab_size, head.draft_vocab_size, "`d2t`")
        if not torch.equal(head.t2d.nonzero()[:, 0].sort().values, ids.sort().values):
            raise ValueError("`t2d` does not mark exactly the target ids `d2t` maps to")
    except ValueError as exc:
        raise CheckpointError(f"EAGLE-3 head {directory}: {exc}") from exc
