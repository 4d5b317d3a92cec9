"""Llama-architecture GGUF files (llama.cpp's format): the config, the weights, the tokenizer.

Read by ``relayc.engine.checkpoints.gguf_reader`` (the format as the ``gguf`` package reads
it, in a tenth of the time), which memory-maps the file: each tensor is dequantized on its
own (``gguf.quants.dequantize``, F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 /
Q2_K..Q6_K and the rest it knows) straight into the model's parameter, so the file is never
copied whole and at most one dequantized tensor is alive besides the model.

A float32 model also keeps each Q4/Q5/Q8 and Q4_K-Q6_K matrix's blocks, attached to its
parameter (``relayc.engine.native.blocks``): float32 holds those weights exactly, and
the native decoder reads the blocks instead of four bytes a weight.

llama.cpp's converter (``convert_hf_to_gguf.py``) permutes the rows of q_proj and k_proj
(for its interleaved-pair RoPE); they are permuted back here, so the weights are the
Hugging Face layout this model and transformers use.

Every problem -- not a GGUF file, a truncated one, another architecture, a metadata value
of the wrong type or out of range, a tensor type ``gguf`` cannot dequantize, a missing,
unexpected or misshapen tensor -- is one ``GGUFError`` naming the file and the key or
tensor. The sizes the metadata gives are checked against the tensor table
(``relayc.engine.core.limits``) before the model is built from them, so a hostile
count is an error, not gigabytes allocated; nothing half-loaded escapes.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relayc.engine.core.config import ModelConfig, check_context, finite_positive
from relayc.engine.core.limits import check_tensor_table
from relayc.engine.errors import GGUFError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import expected_tensors
from relayc.engine.native.blocks import BLOCK_TYPES, BlockWeight, attach, dequantize_gguf

if TYPE_CHECKING:
    import numpy as np
    from gguf import GGUFWriter

    from relayc.engine.checkpoints.gguf_reader import GGUFContents

MAGIC = b"GGUF"
ARCHITECTURES = ("llama",)  # `general.architecture` values this model runs

# GGUF tensor name (after `blk.N.`) -> Hugging Face name (after `model.layers.N.`).
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors llama.cpp may store that this model recomputes or does not use.
_IGNORED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


# A metadata value in a message, as Python spells it: arrays cut to their first entries and
# strings to 40 characters before they are rendered (a 10**7-entry array costs no more).
_REPR = reprlib.Repr()  # its keyword arguments are Python 3.12's
_REPR.maxlevel, _REPR.maxlist, _REPR.maxstring, _REPR.maxother = 2, 4, 40, 40


def _shown(value: Any) -> str:
    return _REPR.repr(value)


@dataclass
class GGUFFile:
    """An opened GGUF file: its metadata (plain Python values) and its tensors (views of
    the file's bytes, read into memory)."""

    path: Path
    reader: GGUFContents  # fields and tensors (relayc.engine.checkpoints.gguf_reader)
    metadata: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str, kind: type | tuple[type, ...]) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata key `{key}` is missing; the file is incomplete")
        return self.optional(key, kind, None)

    def optional(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        """``metadata[key]`` when it is a ``kind`` (a bool is no number), ``default`` when
        absent; ``GGUFError`` naming the key when it is another type (an array where a
        number belongs)."""
        if key not in self.metadata:
            return default
        value = self.metadata[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise GGUFError(
                f"{self.path}: metadata key `{key}` has {type(value).__name__} {_shown(value)}, "
                f"expected {' or '.join(k.__name__ for k in kinds)}"
            )
        return value

    def count(self, key: str, default: int | None = None) -> int:
        """``metadata[key]``, a whole number > 0 (required unless ``default`` is given)."""
        if default is not None and key not in self.metadata:
            return default
        value = self.require(key, int)
        if value <= 0:
            raise GGUFError(f"{self.path}: metadata key `{key}` is {value}; it must be positive")
        return int(value)

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture", str))


def open_gguf(path: str | Path) -> GGUFFile:
    """Read ``path`` and its metadata; ``GGUFError`` if it is no GGUF file
    or is cut short."""
    try:
        from relayc.engine.checkpoints.gguf_reader import read_gguf
    except ImportError as exc:  # pragma: no cover - gguf is a dependency
        raise GGUFError(f"reading {path} needs the `gguf` package: pip install gguf") from exc
    path = Path(path)
    if not path.is_file():
        raise GGUFError(
            f"{path} is not a regular file" if path.exists() else f"GGUF file {path} does not exist"
        )
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != MAGIC:
        raise GGUFError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not {MAGIC!r}); "
            "pass a .gguf file written by llama.cpp's tools or the `gguf` package"
        )
    try:
        reader = read_gguf(path)
    except Exception as exc:
        raise GGUFError(
            f"{path} cannot be read as GGUF ({type(exc).__name__}: {exc}); a file cut short "
            "by an interrupted download or copy, or damaged, gives this: copy it again"
        ) from exc
    metadata = {key: entry.contents() for key, entry in reader.fields.items()}
    return GGUFFile(path, reader, metadata)


def config_from_gguf(file: GGUFFile) -> ModelConfig:
    """The model's shape from the file's ``{arch}.*`` metadata."""
    arch = file.architecture
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{file.path}: `general.architecture` is {_shown(arch)}; relayc's model runs "
            f"{', '.join(repr(a) for a in ARCHITECTURES)} (Llama-architecture) files only"
        )
    scaling = file.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "", None):
        raise GGUFError(
            f"{file.path}: `{arch}.rope.scaling.type` is {_shown(scaling)}; only plain RoPE is "
            "supported"
        )

    num_heads = file.count(f"{arch}.attention.head_count")
    hidden = file.count(f"{arch}.embedding_length")
    kv_key = f"{arch}.attention.head_count_kv"
    if isinstance(file.get(kv_key), list):  # a per-layer list (variable GQA) is not this model
        raise GGUFError(
            f"{file.path}: `{kv_key}` is {_shown(file.get(kv_key))}; one value for every layer is "
            "supported"
        )
    kv_heads = file.count(kv_key, num_heads)
    rope_dims = file.count(f"{arch}.rope.dimension_count", max(hidden // num_heads, 1))
    head_dim = file.count(f"{arch}.attention.key_length", rope_dims)
    tokens = file.optional("tokenizer.ggml.tokens", list, None)
    vocab = file.count(f"{arch}.vocab_size", len(tokens) if tokens else 0) or _tensor_rows(
        file, "token_embd.weight"
    )
    tied = not any(t.name == "output.weight" for t in file.reader.tensors)
    number = (int, float)
    try:
        return ModelConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=file.count(f"{arch}.feed_forward_length"),
            num_layers=file.count(f"{arch}.block_count"),
            num_heads=num_heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=finite_positive(
                file.optional(f"{arch}.rope.freq_base", number, 10000.0), f"{arch}.rope.freq_base"
            ),
            rms_norm_eps=finite_positive(
                file.optional(f"{arch}.attention.layer_norm_rms_epsilon", number, 1e-5),
                f"{arch}.attention.layer_norm_rms_epsilon",
            ),
            max_position=check_context(
                file.count(f"{arch}.context_length", 2048), f"{arch}.context_length"
            ),
            tie_word_embeddings=tied,
        )
    except ValueError as exc:
        raise GGUFError(f"{file.path}: the model's metadata is inconsistent: {exc}") from exc


def _tensor_rows(file: GGUFFile, name: str) -> int:
    for tensor in file.reader.tensors:
        if tensor.name == name:
            return int(tensor.shape[-1])
    raise GGUFError(f"{file.path}: tensor `{name}` is missing")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face state-dict name of a GGUF tensor; None for one this model ignores."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    if gguf_name in _IGNORED:
        return None
    prefix, _, rest = gguf_name.partition(".")
    if prefix == "blk":
        layer, _, suffix = rest.partition(".")
        if layer.isdigit() and suffix in _LAYER_TENSORS:
            return f"model.layers.{layer}.{_LAYER_TENSORS[suffix]}"
    return ""  # unknown: the caller reports it


def unpermute_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: within each head, its converter interleaves
    the rows of the two rotary halves (``reshape(heads, 2, d/2, in).swapaxes(1, 2)``)."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _dequantize(file: GGUFFile, tensor: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    qtype = tensor.tensor_type
    try:
        if qtype == GGMLQuantizationType.BF16:
            # `data` holds the raw 16-bit words; bfloat16 is the top half of a float32.
            import numpy as np

            words = np.asarray(tensor.data).view(np.uint16).astype(np.uint32) << 16
            return words.view(np.float32)
        return quants.dequantize(tensor.data, qtype)
    except NotImplementedError as exc:
        raise GGUFError(
            f"{file.path}: tensor `{tensor.name}` has type {qtype.name}, which the `gguf` "
            f"package cannot dequantize ({exc}); convert the file to another type "
            "(llama-quantize) or upgrade `gguf`"
        ) from exc


def _raw_blocks(tensor: Any, shape: tuple[int, ...]) -> torch.Tensor | None:
    """A matrix's bytes ``[rows, row bytes]`` when its type is one the native decoder reads
    as blocks (``BLOCK_TYPES``), else None."""
    import numpy as np

    kind = getattr(tensor.tensor_type, "name", "")
    if kind not in BLOCK_TYPES or len(shape) != 2:
        return None
    block, size, _ = BLOCK_TYPES[kind]
    data = np.asarray(tensor.data)
    if (
        shape[1] % block
        or data.dtype != np.uint8
        or data.size != shape[0] * shape[1] // block * size
    ):
        return None
    return torch.from_numpy(data.reshape(shape[0], -1).copy())


def load_gguf_model(
    file: GGUFFile, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> LlamaForCausalLM:
    """Build the model of ``file``: float32 weights unless ``dtype`` says otherwise."""
    if file.reader.byte_order != "<":
        raise GGUFError(
            f"{file.path} is a big-endian GGUF file (its tensors' numbers are byte-swapped); "
            "relayc loads little-endian files: convert it with the `gguf` package's "
            "gguf-convert-endian script (`gguf-convert-endian FILE little`)"
        )
    config = config_from_gguf(file)
    if dtype is not None:
        config = config.replace(dtype=dtype)
    # Every size the metadata gives is checked against the tensor table (whose bytes the
    # reader checked against the file) before the model is built from them.
    table: dict[str, tuple[int, ...]] = {}
    gguf_names: dict[str, str] = {}
    for tensor in file.reader.tensors:
        name = hf_name(tensor.name)
        if name == "":
            raise GGUFError(
                f"{file.path}: unexpected tensor `{tensor.name}` for a "
                f"{config.num_layers}-layer Llama model"
            )
        if name is not None:
            # GGUF lists dimensions innermost first: [in, out] is torch's [out, in].
            table[name] = tuple(int(d) for d in reversed(tensor.shape))
            gguf_names[name] = tensor.name
    try:
        check_tensor_table(config, table, f"{file.architecture}.block_count", gguf_names)
    except ValueError as exc:
        raise GGUFError(f"{file.path}: {exc}") from None
    model = LlamaForCausalLM(config, device=device)
    expected = expected_tensors(model)
    with torch.no_grad():
        for tensor in file.reader.tensors:
            name = hf_name(tensor.name)
            if name is None:
                continue
            target = expected[name]
            want = tuple(target.shape)
            raw = _raw_blocks(tensor, want)
            values = None
            if raw is not None and len(want) == 2:
                values = dequantize_gguf(raw, tensor.tensor_type.name, want[0], want[1])
            if values is None:
                values = torch.from_numpy(_dequantize(file, tensor).copy()).reshape(want)
            if name.endswith("q_proj.weight"):
                values = unpermute_rope_rows(values, config.num_heads)
                raw = None if raw is None else unpermute_rope_rows(raw, config.num_heads)
            elif name.endswith("k_proj.weight"):
                values = unpermute_rope_rows(values, config.num_kv_heads)
                raw = None if raw is None else unpermute_rope_rows(raw, config.num_kv_heads)
            target.copy_(values)
            if raw is not None and target.dtype == torch.float32 and target.device.type == "cpu":
                # float32 holds these weights exactly: the native (CPU) decoder may read
                # the blocks instead (relayc.engine.native.blocks)
                attach(
                    model.get_parameter(name), BlockWeight(tensor.tensor_type.name, raw, want[1])
                )
    return model


def permute_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's q/k row permutation (what its converter writes): the inverse of
    :func:`unpermute_rope_rows`."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def save_gguf(
    model: LlamaForCausalLM,
    path: str | Path,
    *,
    tensor_type: str = "F32",
    tokenizer: Callable[[GGUFWriter], None] | None = None,
) -> Path:
    """Write ``model`` as a Llama GGUF file llama.cpp and :func:`load_gguf_model` read.

    ``tensor_type``: the matrices' type, any the ``gguf`` package can quantize (``F32``,
    ``F16``, ``BF16``, ``Q8_0``, ``Q4_0``, ``Q4_1``, ...; norms stay F32, as llama.cpp
    keeps them). ``tokenizer`` writes the ``tokenizer.ggml.*`` keys (see
    :func:`copy_tokenizer_fields`); without one the file has no tokenizer.
    """
    import gguf
    import numpy as np

    config = model.config
    qtype = gguf.GGMLQuantizationType[tensor_type]
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_vocab_size(config.vocab_size)
    if tokenizer is not None:
        tokenizer(writer)
    names = {hf: name for name, hf in _GLOBAL_TENSORS.items()}
    for layer in range(config.num_layers):
        for name, hf in _LAYER_TENSORS.items():
            names[f"model.layers.{layer}.{hf}"] = f"blk.{layer}.{name}"
    for name, tensor in sorted(expected_tensors(model).items()):
        values = tensor.detach().float().cpu()
        if name.endswith("q_proj.weight"):
            values = permute_rope_rows(values, config.num_heads)
        elif name.endswith("k_proj.weight"):
            values = permute_rope_rows(values, config.num_kv_heads)
        array = values.contiguous().numpy()
        if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(names[name], array)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(names[name], array.astype(np.float16))
        else:
            writer.add_tensor(names[name], gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def copy_tokenizer_fields(source: GGUFFile) -> Callable[[GGUFWriter], None]:
    """A ``save_gguf`` tokenizer that copies ``source``'s ``tokenizer.*`` keys (the same
    model re-saved at another precision keeps its tokenizer and chat template)."""
    from gguf import GGUFValueType

    def write(writer: GGUFWriter) -> None:
        for key, entry in source.reader.fields.items():
            if not key.startswith("tokenizer."):
                continue
            value = source.metadata[key]
            if entry.types[0] == GGUFValueType.ARRAY:
                writer.add_array(key, value)
            else:
                writer.add_key_value(key, value, entry.types[0])

    return write
