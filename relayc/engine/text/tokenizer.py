"""A model's own tokenizer, built by the ``tokenizers`` library (no hand-written BPE).

Sources:

- a GGUF file's metadata (``tokenizer.ggml.*``): a GPT-2-style byte-level BPE
  (``tokenizer.ggml.model == "gpt2"``: tokens, merges, token types) is built directly, its
  pre-tokenizer chosen by ``tokenizer.ggml.pre`` the way llama.cpp chooses its regexes;
  other tokenizer models (SentencePiece ``llama``, ...) go through transformers' GGUF
  tokenizer conversion when transformers is installed;
- a checkpoint folder's ``tokenizer.json`` (with ``tokenizer_config.json`` for the chat
  template and special tokens, ``generation_config.json`` / ``config.json`` for the
  end-of-generation ids).

End of generation: every id the model declares (``eos``, ``eot``, ``eom`` in GGUF; the
``eos_token_id`` list of the generation config) plus control tokens whose text marks the
end of a turn (``<|im_end|>``, ``<|eot_id|>``, ...), as llama.cpp does, so a chat model
stops at the end of its answer whichever of them it samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from relayc.engine.errors import CheckpointError, GGUFError
from relayc.engine.text.chat import ChatError, render_chat

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer


class GGUFMetadata(Protocol):
    """What the tokenizer reads of an open GGUF file (``relayc.engine.checkpoints.gguf``'s
    ``GGUFFile``, a room above this one): its path and its metadata values by key."""

    @property
    def path(self) -> Path: ...

    def get(self, key: str, default: Any = None) -> Any: ...

    def optional(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any: ...


# Control-token texts that end a turn in the chat formats in use (llama.cpp's list).
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "</s>",
        "<|eom_id|>",
        "<|return|>",
        "<|call|>",
    }
)
# GGUF token types (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4
# The GPT-2 split, and llama.cpp's digit-first variant (starcoder, smollm, ...).
_GPT2_PRE = ("gpt2", "default", "", None)
_DIGITS_FIRST_PRE = ("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone")
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_REGEX_PRE = {"llama-bpe": _LLAMA3_REGEX, "llama3": _LLAMA3_REGEX, "qwen2": _QWEN2_REGEX}


class TokenizerError(CheckpointError):
    """A tokenizer that cannot be built from a checkpoint; the message names the file and why."""


class Tokenizer:
    """A model's tokenizer: ``encode`` / ``decode`` text, special ids, the chat template.

    ``encode(text)`` gives the text's tokens alone; ``encode_prompt(text)`` adds the BOS
    token when the model expects one (what the engine does with a string prompt).
    ``decode`` drops special tokens, as a generated answer is shown.
    """

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_id: int | None,
        eos_id: int | None,
        eog_ids: Iterable[int],
        add_bos: bool,
        chat_template: str | None,
        source: str,
    ) -> None:
        self.backend = backend
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.eog_ids = tuple(sorted({int(t) for t in eog_ids}))
        self.chat_template = chat_template
        self.source = source

    def __repr__(self) -> str:
        return f"Tokenizer({self.source}, vocab={self.vocab_size}, eog={list(self.eog_ids)})"

    def token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def encode(self, text: str) -> list[int]:
        """The tokens of ``text`` (special-token texts in it become their ids); no BOS."""
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_prompt(self, text: str) -> list[int]:
        ids = self.encode(text)
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # Ids past the tokenizer's own vocabulary (a model's padded embedding rows) decode to
        # nothing, as in transformers; negative ones are a caller's mistake.
        ids = list(ids)
        bad = [t for t in ids if not isinstance(t, int) or t < 0]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are not token ids (non-negative integers)")
        return str(self.backend.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of ``messages`` in the model's chat format; ``ChatError`` if the
        model has no template or the messages are not a chat."""
        if not self.chat_template:
            raise ChatError(
                f"this model's tokenizer ({self.source}) has no chat template; "
                "pass the prompt text or token ids instead"
            )
        try:
            return render_chat(
                self.chat_template,
                messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._text(self.bos_id),
                eos_token=self._text(self.eos_id),
            )
        except ChatError as exc:  # the file the template came from, for the fix
            raise ChatError(f"{self.source}: {exc}") from exc

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """The prompt tokens of ``messages``: the rendered template, whose special-token texts
        become their ids (the template writes any BOS itself)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))

    def _text(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.id_to_token(token_id) or ""


def _eog_from_texts(tokens: Sequence[str], types: Sequence[int] | None) -> set[int]:
    return {
        i
        for i, text in enumerate(tokens)
        if text in _EOG_TEXTS and (types is None or types[i] in (_CONTROL, _USER_DEFINED))
    }


def _pre_tokenizer(pre: str | None, where: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _GPT2_PRE:
        return byte_level
    if pre in _DIGITS_FIRST_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _REGEX_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_REGEX_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise TokenizerError(
        f"{where}: `tokenizer.ggml.pre` is {pre!r}, a pre-tokenizer relayc does not know "
        f"(known: {', '.join(str(p) for p in (*_GPT2_PRE[:2], *_DIGITS_FIRST_PRE, *_REGEX_PRE))})"
    )


def tokenizer_from_gguf(file: GGUFMetadata) -> Tokenizer:
    """The tokenizer in ``file``'s metadata; ``TokenizerError`` when it has none or one that
    cannot be built (a key of the wrong type or length, an id outside the vocabulary)."""
    where = str(file.path)
    kind = _gguf_value(file, "tokenizer.ggml.model", str)
    tokens = _gguf_list(file, "tokenizer.ggml.tokens", str)
    if kind is None or not tokens:
        raise TokenizerError(f"{where} holds no tokenizer (no `tokenizer.ggml.model` / tokens)")
    types = _gguf_list(file, "tokenizer.ggml.token_type", int)
    if types is not None and len(types) != len(tokens):
        raise TokenizerError(
            f"{where}: `tokenizer.ggml.token_type` has {len(types)} entries for "
            f"{len(tokens)} tokens; one a token"
        )
    ids: dict[str, int | None] = {}
    for name in ("bos", "eos", "eot", "eom"):
        key = f"tokenizer.ggml.{name}_token_id"
        value = _gguf_value(file, key, int)
        if value is not None and value < 0:  # ids past the vocabulary: checked per request
            raise TokenizerError(f"{where}: `{key}` is {value}, not a token id")
        ids[name] = value
    add_bos = _gguf_value(file, "tokenizer.ggml.add_bos_token", bool)
    template = _gguf_value(file, "tokenizer.chat_template", str)
    if kind == "gpt2":
        backend = _gpt2_backend(file, tokens, types)
    else:
        backend = _converted_backend(file, kind)
    eog = {t for t in (ids["eos"], ids["eot"], ids["eom"]) if t is not None}
    eog |= _eog_from_texts(tokens, types)
    return Tokenizer(
        backend,
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        eog_ids=eog,
        add_bos=add_bos if add_bos is not None else kind == "llama",
        chat_template=template,
        source=Path(where).name,
    )


def _gguf_value(file: GGUFMetadata, key: str, kind: type) -> Any:
    """``file``'s ``key`` when it is a ``kind`` (a bool is no int), None when absent."""
    try:
        return file.optional(key, kind, None)
    except GGUFError as exc:
        raise TokenizerError(str(exc)) from None


def _gguf_list(file: GGUFMetadata, key: str, item: type) -> list[Any] | None:
    """``file``'s array ``key`` when every element is an ``item``, None when absent."""
    values = _gguf_value(file, key, list)
    if values is None:
        return None
    for index, value in enumerate(values):
        if not isinstance(value, item) or (isinstance(value, bool) and item is not bool):
            raise TokenizerError(
                f"{file.path}: `{key}[{index}]` is {type(value).__name__} {value!r:.40}, "
                f"expected {item.__name__}"
            )
    return values


def _gpt2_backend(
    file: GGUFMetadata, tokens: Sequence[str], types: Sequence[int] | None
) -> HFTokenizer:
    from tokenizers import AddedToken, decoders, models
    from tokenizers import Tokenizer as HFTokenizer

    where = str(file.path)
    merges_text = _gguf_list(file, "tokenizer.ggml.merges", str) or []
    merges: list[tuple[str, str]] = []
    for index, merge in enumerate(merges_text):
        left, sep, right = merge.partition(" ")
        if not sep:
            raise TokenizerError(
                f"{where}: `tokenizer.ggml.merges[{index}]` is {merge!r}, not 'a b'"
            )
        merges.append((left, right))
    vocab = {text: i for i, text in reversed(list(enumerate(tokens)))}
    try:
        backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    except Exception as exc:
        raise TokenizerError(f"{where}: the BPE vocabulary and merges do not fit ({exc})") from exc
    backend.pre_tokenizer = _pre_tokenizer(_gguf_value(file, "tokenizer.ggml.pre", str), where)
    backend.decoder = decoders.ByteLevel()
    added = [
        AddedToken(tokens[i], special=t == _CONTROL, normalized=False)
        for i, t in enumerate(types or [])
        if t in (_CONTROL, _USER_DEFINED)
    ]
    backend.add_tokens(added)
    return backend


def _converted_backend(file: GGUFMetadata, kind: str) -> HFTokenizer:
    """Tokenizer models other than GPT-2 BPE, through transformers' GGUF conversion (its
    public ``AutoTokenizer.from_pretrained(folder, gguf_file=...)``)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerError(
            f"{file.path}: its `{kind}` tokenizer is built by transformers' GGUF conversion: "
            "pip install transformers gguf (or pass token ids)"
        ) from exc
    try:
        converted = AutoTokenizer.from_pretrained(file.path.parent, gguf_file=file.path.name)
        backend: HFTokenizer = converted.backend_tokenizer
    except Exception as exc:
        raise TokenizerError(
            f"{file.path}: transformers could not convert its `{kind}` tokenizer ({exc})"
        ) from exc
    return backend


def tokenizer_from_dir(directory: Path, vocab_size: int) -> Tokenizer | None:
    """The tokenizer of a Hugging Face checkpoint folder; None when it has no
    ``tokenizer.json`` (the engine then takes token ids only)."""
    from tokenizers import Tokenizer as HFTokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        backend = HFTokenizer.from_file(str(path))
    except Exception as exc:
        raise TokenizerError(f"{path} cannot be read by `tokenizers` ({exc})") from exc
    settings = _json_file(directory / "tokenizer_config.json")
    generation = _json_file(directory / "generation_config.json")
    config = _json_file(directory / "config.json")

    def token_id(value: Any) -> int | None:
        if isinstance(value, Mapping):
            value = value.get("content")
        if isinstance(value, str):
            return backend.token_to_id(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    bos = token_id(settings.get("bos_token")) or token_id(config.get("bos_token_id"))
    eos = token_id(settings.get("eos_token"))
    eog: set[int] = set()
    for source in (generation.get("eos_token_id"), config.get("eos_token_id"), eos):
        for value in source if isinstance(source, list) else [source]:
            if (found := token_id(value)) is not None:
                eog.add(found)
    # ids as the vocabulary gives them, never a list as long as the largest id (one id of
    # 1.5e9 in a hostile tokenizer.json would be a 12 GB list)
    vocab = backend.get_vocab(with_added_tokens=True)
    special = {tok.content for tok in backend.get_added_tokens_decoder().values() if tok.special}
    eog |= {index for text, index in vocab.items() if text in _EOG_TEXTS and text in special}
    eog = {t for t in eog if 0 <= t < vocab_size}
    for name, value, source in (
        ("bos", bos, "tokenizer_config.json / config.json"),
        ("eos", eos, "tokenizer_config.json"),
    ):
        if value is not None and value < 0:  # ids past the vocabulary: checked per request
            raise TokenizerError(
                f"{directory}: the {name} token's id is {value} ({source} `{name}_token` / "
                f"`{name}_token_id`), not a token id"
            )
    template = settings.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    jinja = directory / "chat_template.jinja"
    if template is None and jinja.is_file():
        try:
            template = jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerError(
                f"{jinja}: not UTF-8 text (byte {exc.start}); save the template as UTF-8"
            ) from None
        except OSError as exc:
            raise TokenizerError(f"{jinja}: cannot read: {exc.strerror or exc}") from None
    return Tokenizer(
        backend,
        bos_id=bos,
        eos_id=eos if eos is not None else (min(eog) if eog else None),
        eog_ids=eog,
        add_bos=bool(settings.get("add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None,
        source=directory.name,
    )


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: JSON, UTF-8, digits
        raise TokenizerError(f"{path} is not valid JSON ({exc}); fix or remove it") from exc
    if not isinstance(value, dict):
        raise TokenizerError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value
