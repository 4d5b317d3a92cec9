"""relayc against its peers on the same weights: Hugging Face transformers (and llama.cpp).

    python bench/peers.py [--quick] [--prompts 16] [--max-new-tokens 64] [--repeats 3]
                          [--batch-sizes 1,8] [--threads 1] [--no-overlap] [--no-llama-cpp]
    python bench/peers.py --model smollm2 [--dtypes float32,bfloat16] [--quick] ...

``--model smollm2``: the real model, SmolLM2-135M-Instruct, from the one GGUF file both
read (relayc's loader and transformers' own GGUF loader), on the held-out chat prompts
(relayc/assets/chat), at each of ``--dtypes``: relayc none / ngram / eagle3 (when a head
ships for it) -- in float32 reading the file's Q4_1 / Q8_0 blocks, plus ``none`` over float32
panels (the same bits, the bytes of float32 weights) -- against transformers' greedy
``generate`` and prompt lookup at the same
precision (no draft model shares SmolLM2's tokenizer, so no assisted generation), and
llama.cpp greedy on the same file when llama-cpp-python is installed. Requests stop at the
model's end-of-generation tokens, as a chat user's do. relayc's rows must equal relayc's
greedy ``none`` at the same precision token for token; transformers' rows are checked by
teacher forcing (each of its tokens against relayc's argmax over its own sequence: two
float implementations part ways on near-ties in long generations, so comparing two
generations says little), and the share that agrees is printed.

The shipped demo target (a 6-layer byte-level Llama) and its standalone draft model are
plain ``LlamaForCausalLM`` checkpoints, so transformers loads them unchanged. Every peer
decodes the same held-out prompts greedily (BOS + bytes, ids fed directly, no stop
token), first once untimed to check that its outputs equal relayc's greedy `none` token
for token, then timed in round robin (one run of every peer per round, best of
``--repeats``), so a slow spell of a shared CPU does not fall on one peer's runs only.

Peers, one request at a time: relayc none / ngram / standalone / eagle / eagle_multilayer;
transformers' greedy ``generate``, prompt lookup, assisted generation with the same
standalone draft (a constant 3 draft tokens, and its defaults: up to 20 tokens with a
confidence-threshold early stop), and a bare model + cache + argmax loop; llama.cpp plain
greedy when ``llama_cpp`` (llama-cpp-python) and ``gguf`` are importable. Eight at a
time: relayc's algorithms against transformers' greedy ``generate`` and the bare loop,
left-padded (transformers' assisted modes take one request only).

Each run's process CPU time over its wall time is printed: with one torch thread a run
the machine did not starve is near 1.0 (the overlap worker adds a little). A run under
``--min-cpu-share`` is flagged and never chosen as a peer's best; a peer with no
unstarved run prints ``starved`` instead of a figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from relayc.engine.checkpoints.shipped import DEMO_DIR, heldout_prompts
from relayc.engine.serving.overlap import set_cpu_threads
from relayc.engine.text.bytes import ByteTokenizer
from relayc.tools.peers import (
    HF_ASSISTED_DEFAULTS,
    HF_GREEDY,
    HF_PROMPT_LOOKUP,
    HFTarget,
    Peer,
    Timing,
    round_robin,
)


def relayc_rows(real: bool) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, algorithm, Engine arguments) of relayc's rows, from the algorithm registry:
    each algorithm's `relayc demo` runs on the toy model or a real one, then its
    benchmark-only runs (``Demo.bench_toy`` / ``bench_real``); `COUNTERPART` below names
    the HF row each of some must beat."""
    from relayc.engine.algorithms import engine_algorithms

    rows = []
    for algorithm in engine_algorithms():
        demo = algorithm.demo
        runs = (*demo.real, *demo.bench_real) if real else (*demo.toy, *demo.bench_toy)
        for run in runs:
            label = " ".join(("relayc", algorithm.name, run.label)).strip()
            rows.append((label, algorithm.name, dict(run.sizes)))
    return rows


HF_ASSISTED_CONSTANT = "hf assisted (3 const)"
COUNTERPART = {
    "relayc none": HF_GREEDY,
    "relayc ngram": HF_PROMPT_LOOKUP,
    "relayc standalone": HF_ASSISTED_CONSTANT,
}
# Rows compared with more HF rows than their counterpart at the end of the report.
ALSO_COMPARED = {"relayc standalone": (HF_ASSISTED_DEFAULTS,)}
HF_SPECULATIVE = (HF_PROMPT_LOOKUP, HF_ASSISTED_CONSTANT, HF_ASSISTED_DEFAULTS)


@dataclass
class Result:
    label: str
    outputs: list[list[int]] = field(default_factory=list)
    accepts: list[float] = field(default_factory=list)
    runs: list[Timing] = field(default_factory=list)

    def best(self, min_share: float) -> Timing | None:
        fine = [t for t in self.runs if t.share >= min_share]
        return min(fine, key=lambda t: t.wall) if fine else None

    def least_cpu(self) -> float:
        return min(t.cpu for t in self.runs)


# -- relayc -------------------------------------------------------------------------------


def relayc_peers(max_new_tokens: int, overlap: bool, graphs: str = "auto") -> list[Peer]:
    """The relayc rows, plus `none` with the overlap switched the other way (what the
    overlap worker costs or saves on this machine)."""
    from relayc.engine import Engine, SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens)
    peers = []
    other = "relayc none, overlap " + ("off" if overlap else "on")
    for label, algorithm, sizes, row_overlap in [
        *((label, algorithm, sizes, overlap) for label, algorithm, sizes in relayc_rows(False)),
        (other, "none", {}, not overlap),
    ]:
        engine = Engine(
            None, algorithm=algorithm, overlap=row_overlap, **{"graphs": graphs, **sizes}
        )
        peers.append(engine_peer(label, engine, params))
    return peers


def engine_peer(label: str, engine: Any, params: Any) -> Peer:
    """An engine as a peer: the prompts in groups of ``group`` concurrent requests."""

    # A drafter that learns across requests (suffix's global tree) starts every run empty:
    # a benchmark repeating its prompts must not draft from its own earlier answers.
    forget = getattr(getattr(engine.algorithm, "drafter", None), "forget_outputs", None)

    def run(prompts: list[list[int]], group: int) -> tuple[list[list[int]], list[float]]:
        if forget is not None:
            forget()
        outs = [
            out
            for g in range(0, len(prompts), group)
            for out in engine.generate(prompts[g : g + group], params)
        ]
        return [o.token_ids for o in outs], [float(a) for o in outs for a in o.accept_lengths]

    return Peer(label, run, close=engine.close)


# -- transformers ---------------------------------------------------------------------------


def hf_peers(max_new_tokens: int, prompt_lookup_tokens: int) -> list[Peer]:
    hf = HFTarget(max_new_tokens)
    return [
        hf.greedy(),
        hf.bare_loop(),
        hf.prompt_lookup(prompt_lookup_tokens),
        hf.assisted(constant=3),
        hf.assisted(),
    ]


# -- llama.cpp (optional) -------------------------------------------------------------------


def _unpermute_rope(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' q/k rows pair dimension ``i`` with ``i + head_dim / 2`` (rotate half);
    llama.cpp's RoPE pairs ``2i`` with ``2i + 1``: interleave the two halves of each head."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_gguf(checkpoint: Path, path: Path) -> Path:
    """The checkpoint as a float32 GGUF llama.cpp loads: the byte vocabulary as SentencePiece
    byte tokens (``<0x41>``) plus BOS / EOS / PAD, ids unchanged (prompts are fed as ids)."""
    import gguf
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    weights = load_file(str(checkpoint / "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokenizer = ByteTokenizer()
    specials = {tokenizer.bos_id: "<s>", tokenizer.eos_id: "</s>", tokenizer.pad_id: "<pad>"}
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<0x{i:02X}>" for i in range(256)] + list(specials.values()))
    writer.add_token_scores([0.0] * tokenizer.vocab_size)
    writer.add_token_types([gguf.TokenType.BYTE] * 256 + [gguf.TokenType.CONTROL] * len(specials))
    writer.add_bos_token_id(tokenizer.bos_id)
    writer.add_eos_token_id(tokenizer.eos_id)
    writer.add_pad_token_id(tokenizer.pad_id)
    writer.add_add_bos_token(False)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for layer in range(config["num_hidden_layers"]):
        for ours, theirs in per_layer.items():
            names[f"model.layers.{layer}.{ours}.weight"] = f"blk.{layer}.{theirs}.weight"
    for name, tensor in weights.items():
        tensor = tensor.float()
        if name.endswith("q_proj.weight"):
            tensor = _unpermute_rope(tensor, heads)
        elif name.endswith("k_proj.weight"):
            tensor = _unpermute_rope(tensor, kv_heads)
        writer.add_tensor(names[name], tensor.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_cpp_peer(max_new_tokens: int, threads: int, workdir: Path) -> Peer | None:
    """llama.cpp plain greedy on a GGUF written from the shipped target, or None when
    ``llama_cpp`` (llama-cpp-python) or ``gguf`` is not installed."""
    try:
        import gguf  # noqa: F401
        import llama_cpp
    except ImportError:
        return None
    path = write_gguf(DEMO_DIR / "target", workdir / "target.gguf")
    llm = llama_cpp.Llama(
        str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False
    )

    def run(prompts: list[list[int]], group: int) -> tuple[list[list[int]], list[float]]:
        outputs = []
        for prompt in prompts:
            tokens: list[int] = []
            for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
                tokens.append(int(token))
                if len(tokens) == max_new_tokens:
                    break
            outputs.append(tokens)
        return outputs, []

    return Peer("llama.cpp greedy", run, 1)


def _llama_without_extra_bufts(llama_cpp: Any, path: Path, threads: int, n_ctx: int = 2048) -> Any:
    """``llama_cpp.Llama`` on ``path`` (a context of ``n_ctx`` tokens) with the CPU backend's
    extra buffer types off (``use_extra_bufts = False``): llama-cpp-python 0.3.36 has no
    argument for that model parameter, so its default-parameters function is wrapped while
    the model loads."""
    low = llama_cpp.llama_cpp
    default = low.llama_model_default_params

    def params() -> Any:
        value = default()
        value.use_extra_bufts = False
        return value

    low.llama_model_default_params = params
    try:
        return llama_cpp.Llama(
            str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False
        )
    finally:
        low.llama_model_default_params = default


def llama_cpp_real_peers(
    max_new_tokens: int, threads: int, dtype: str, workdir: Path
) -> list[Peer]:
    """llama.cpp greedy on SmolLM2, or none when ``llama_cpp`` (llama-cpp-python) is not
    installed: on the shipped Q4_1 file as llama.cpp users run it, and on a GGUF of the
    weights relayc computes with at ``dtype`` (the Q4_1 tensors dequantized: F32, or BF16
    -- the bits relayc's bfloat16 rounds them to), written with ``gguf``, so both sides read
    the same numbers. Both with the CPU backend's extra buffer types off: with them (weights
    repacked for its own kernels) llama-cpp-python 0.3.36 crashed in ``decode`` on the Q4_1
    file on this machine (the real-model speed issue); without them it reads the file's own
    layout. Prompts go in as relayc's token ids; a request stops at the file's
    end-of-generation tokens (kept, as relayc keeps them) or after ``max_new_tokens``."""
    try:
        import llama_cpp
    except ImportError:
        return []
    from relayc.engine.checkpoints.gguf import copy_tokenizer_fields, open_gguf, save_gguf
    from relayc.engine.checkpoints.loader import load_model
    from relayc.engine.checkpoints.named import named_model_file
    from relayc.engine.text.tokenizer import tokenizer_from_gguf

    source = named_model_file("smollm2")
    eog = set(tokenizer_from_gguf(open_gguf(source)).eog_ids)
    same = workdir / f"smollm2-{dtype}.gguf"
    if dtype != "int8" and not same.is_file():
        model = load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32).model
        tensor_type = "F32" if dtype == "float32" else "BF16"
        save_gguf(
            model, same, tensor_type=tensor_type, tokenizer=copy_tokenizer_fields(open_gguf(source))
        )
    peers = []
    files = [(f"llama.cpp greedy Q4_1 {dtype}", source)]
    if dtype != "int8":  # int8 reads the Q4_1 blocks themselves: no dequantized twin
        files.append((f"llama.cpp greedy {dtype}", same))
    for label, path in files:
        llm = _llama_without_extra_bufts(llama_cpp, path, threads)

        def run(
            prompts: list[list[int]], group: int, llm: Any = llm
        ) -> tuple[list[list[int]], list[float]]:
            outputs = []
            for prompt in prompts:
                tokens: list[int] = []
                for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
                    tokens.append(int(token))
                    if int(token) in eog or len(tokens) == max_new_tokens:
                        break
                outputs.append(tokens)
            return outputs, []

        peers.append(Peer(label, run, 1, llm.close))
    return peers


# -- measurement ----------------------------------------------------------------------------


def measure(
    peers: Sequence[Peer],
    prompts: list[list[int]],
    group: int,
    repeats: int,
    reference: list[list[int]] | None,
) -> list[Result]:
    results = [Result(p.label) for p in peers]
    for peer, result in zip(peers, results, strict=True):  # the untimed check and warm-up
        result.outputs, result.accepts = peer.run(prompts, group)
        if reference is not None and result.outputs != reference:
            bad = sum(a != b for a, b in zip(result.outputs, reference, strict=True))
            print(f"  !! {peer.label}: {bad}/{len(prompts)} outputs differ from relayc none")
    runs = [lambda peer=peer: peer.run(prompts, group) for peer in peers]
    for result, timings in zip(results, round_robin(runs, repeats), strict=True):
        result.runs = timings
    return results


def report(
    results: Sequence[Result],
    reference: list[list[int]],
    tokens: int,
    min_share: float,
) -> tuple[dict[str, float], dict[str, float]]:
    """Print one table; returns tokens/s by label (unstarved peers only) and tokens per
    CPU second by label (every peer).

    ``tokens/cpu-s`` (new tokens per second of process CPU time, best run) is the figure
    that survives a crowded machine: a starved run waits longer but hardly computes more.
    """
    from relayc.specs.explain import table

    tps = {}
    for r in results:
        best = r.best(min_share)
        if best is not None:
            tps[r.label] = tokens / best.wall
    per_cpu = {r.label: tokens / r.least_cpu() for r in results}
    greedy, greedy_cpu = tps.get(HF_GREEDY), per_cpu.get(HF_GREEDY)
    rows = []
    for r in results:
        best = r.best(min_share)
        shares = " ".join(f"{t.share:.2f}" + ("*" if t.share < min_share else "") for t in r.runs)
        rate = tps.get(r.label)
        counterpart = COUNTERPART.get(r.label)
        rows.append(
            [
                r.label,
                "starved" if rate is None else f"{rate:.1f}",
                "-" if rate is None or greedy is None else f"{rate / greedy:.2f}x",
                "-"
                if rate is None or counterpart not in tps
                else f"{rate / tps[counterpart]:.2f}x {counterpart}",
                f"{per_cpu[r.label]:.1f}",
                "-" if greedy_cpu is None else f"{per_cpu[r.label] / greedy_cpu:.2f}x",
                f"{sum(r.accepts) / len(r.accepts):.2f}" if r.accepts else "-",
                shares,
                "yes" if r.outputs == reference else "NO",
            ]
        )
    print(
        table(
            [
                "peer",
                "tokens/s",
                "vs hf greedy",
                "vs counterpart",
                "tokens/cpu-s",
                "cpu vs hf greedy",
                "accept len",
                "cpu/wall per run",
                "identical",
            ],
            rows,
        )
    )
    return tps, per_cpu


def summary(by_batch: dict[int, dict[str, float]], metric: str) -> None:
    """The issue's targets, as measured ratios of ``metric`` (tokens/s, or tokens per CPU
    second when a peer had no unstarved run)."""
    print(f"\ntargets (measured ratio of {metric}):")
    for batch, tps in by_batch.items():
        if "relayc none" in tps and HF_GREEDY in tps:
            print(
                f"  {batch} at a time: relayc none / hf greedy = "
                f"{tps['relayc none'] / tps[HF_GREEDY]:.2f}x"
            )
    tps = by_batch.get(1, {})
    for ours, theirs in COUNTERPART.items():
        for other in (theirs, *ALSO_COMPARED.get(ours, ())):
            if ours in tps and other in tps:
                print(f"  {ours} / {other} = {tps[ours] / tps[other]:.2f}x")
    ours = {k: v for k, v in tps.items() if k.startswith("relayc")}
    theirs = {k: v for k, v in tps.items() if k in HF_SPECULATIVE}
    if ours and theirs:
        best_ours, best_theirs = max(ours, key=ours.get), max(theirs, key=theirs.get)  # type: ignore[arg-type]
        print(
            f"  relayc best ({best_ours}) / hf best speculative ({best_theirs}) = "
            f"{ours[best_ours] / theirs[best_theirs]:.2f}x"
        )
        if "llama.cpp greedy" in tps:
            print(
                f"  relayc best / llama.cpp greedy = "
                f"{ours[best_ours] / tps['llama.cpp greedy']:.2f}x"
            )


# -- the real model --------------------------------------------------------------------------


def real_relayc_peers(
    max_new_tokens: int, dtype: str, overlap: bool, graphs: str = "auto"
) -> tuple[list[Peer], Any]:
    """relayc's rows on SmolLM2 at ``dtype`` (one model shared by every engine), and the
    `none` engine (for the teacher-forced check)."""
    from relayc.engine import Engine, SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens)
    peers: list[Peer] = []
    first: Any = None
    for label, algorithm, sizes in relayc_rows(True):
        try:
            if first is None:
                engine = first = Engine(
                    "smollm2", dtype=dtype, overlap=overlap, **{"graphs": graphs, **sizes}
                )
            else:
                engine = Engine(
                    first.model,
                    algorithm=algorithm,
                    overlap=overlap,
                    tokenizer=first.tokenizer,
                    draft_model=None,
                    **{"graphs": graphs, **sizes},  # a row may run another mode (suffix: off)
                )
        except (ValueError, FileNotFoundError) as exc:  # no head ships for it yet
            print(f"{label} skipped: {exc}")
            continue
        peers.append(engine_peer(f"{label} {dtype}", engine, params))
    if dtype == "float32" and first is not None:
        # The file's Q4_1 / Q8_0 blocks are what float32 reads natively; the same model
        # over float32 panels (the same bits, four bytes a weight) shows what they buy.
        from relayc.engine.model.llama import prepare_cpu_decoders, use_cpu_matmul_layout
        from relayc.engine.native.blocks import forget_blocks

        panels = Engine("smollm2", dtype=dtype, overlap=overlap, graphs=graphs)
        forget_blocks(panels.model)
        use_cpu_matmul_layout(panels.model)  # the Engine packed the blocks: pack again
        prepare_cpu_decoders(panels.model)
        peers.insert(1, engine_peer("relayc none (float32 panels) float32", panels, params))
    return peers, first


def teacher_forced_agreement(
    engine: Any, prompts: list[list[int]], outputs: list[list[int]]
) -> float:
    """The share of ``outputs``' tokens that are relayc's argmax given the tokens before them
    (near-ties, a top-2 gap under 1e-3, count as agreeing: either token is right there)."""
    agree = total = 0
    for prompt, output in zip(prompts, outputs, strict=True):
        if not output:
            continue
        ids = torch.tensor(prompt + output)
        logits = engine.model.forward_dense(ids).logits[len(prompt) - 1 : -1]
        top2 = logits.topk(2, dim=-1)
        got = torch.tensor(output)
        tie = (top2.values[:, 0] - top2.values[:, 1]) < 1e-3
        agree += int(((top2.indices[:, 0] == got) | tie).sum())
        total += len(output)
    return agree / max(total, 1)


def real_model_main(args: argparse.Namespace) -> None:
    from relayc.tools.demo import chat_prompts
    from relayc.tools.peers import HFTarget

    chats = chat_prompts({"all": None, "quoting": True, "other": False}[args.chats])
    chats = chats[: args.prompts]
    workdir = Path(tempfile.mkdtemp(prefix="relayc-peers-"))
    by_batch: dict[str, dict[str, float]] = {}
    by_batch_cpu: dict[str, dict[str, float]] = {}
    for dtype in args.dtypes.split(","):
        peers, reference_engine = real_relayc_peers(
            args.max_new_tokens, dtype, not args.no_overlap, args.graphs
        )
        prompts = [reference_engine.encode(c) for c in chats]
        # transformers has no integer-dot path over GGUF blocks: int8 is compared with its
        # float32 over the same weights (llama.cpp's Q4_1 row below is int8's like-for-like).
        hf_dtype = "float32" if dtype == "int8" else dtype
        hf = HFTarget.smollm2(args.max_new_tokens, getattr(torch, hf_dtype))
        hf_rows = [hf.greedy(), hf.prompt_lookup(args.prompt_lookup_tokens)]
        for peer in hf_rows:
            peer.label = f"{peer.label} {hf_dtype}"
        if not args.no_llama_cpp:
            llama_rows = llama_cpp_real_peers(args.max_new_tokens, args.threads, dtype, workdir)
            if not llama_rows:
                print("llama.cpp skipped: `pip install llama-cpp-python` to compare with it")
            hf_rows += llama_rows
        try:
            alone = peers[0].run(prompts, 1)[0]
            for group in (int(b) for b in args.batch_sizes.split(",")):
                # Speculation must equal `none` decoding the same batch: the reference.
                reference = alone if group == 1 else peers[0].run(prompts, group)[0]
                if reference != alone:
                    differ = sum(a != b for a, b in zip(reference, alone, strict=True))
                    print(
                        f"  relayc none, {group} at a time, differs from one at a time on "
                        f"{differ} of {len(prompts)} prompts (a prefill of prompts of mixed "
                        "lengths runs through the library GEMMs, whose rows depend on the batch)"
                    )
                batch_peers = [p for p in [*peers, *hf_rows] if p.max_batch >= group]
                total = sum(len(r) for r in reference)
                print(
                    f"\nSmolLM2-135M-Instruct {dtype}: {len(prompts)} held-out chat prompts, "
                    f"{group} at a time, up to {args.max_new_tokens} new tokens ({total} in "
                    f"`none`'s answers), {args.threads} torch thread(s), best of {args.repeats} "
                    "round-robin runs"
                )
                results = measure(batch_peers, prompts, group, args.repeats, None)
                for result in results:
                    if result.label.startswith(("hf", "llama.cpp")):
                        share = teacher_forced_agreement(reference_engine, prompts, result.outputs)
                        print(
                            f"  {result.label}: {share:.1%} of its tokens are relayc's argmax "
                            "under teacher forcing"
                        )
                        if sum(map(len, result.outputs)) != total:
                            print(f"  {result.label}: answers of other lengths than `none`'s")
                key = f"{dtype}, {group} at a time"
                by_batch[key], by_batch_cpu[key] = report_real(
                    results, reference, total, args.min_cpu_share, dtype
                )
        finally:
            for peer in [*peers, *hf_rows]:
                peer.close()
    starved = any(len(tps) < len(by_batch_cpu[b]) for b, tps in by_batch.items())
    figures = by_batch_cpu if starved else by_batch
    print(f"\ntargets (measured ratio of {'tokens/cpu-s' if starved else 'tokens/s'}):")
    for key, tps in figures.items():
        dtype = key.split(",")[0]
        baseline = f"relayc none {dtype}"
        none, greedy = tps.get(baseline), tps.get(f"{HF_GREEDY} {dtype}")
        ours = {k: v for k, v in tps.items() if k.startswith("relayc") and k != baseline}
        theirs = {k: v for k, v in tps.items() if k.startswith("hf")}
        llama = {k: v for k, v in tps.items() if k.startswith("llama.cpp")}
        line = [key]
        if none and greedy:
            line.append(f"none / hf greedy = {none / greedy:.2f}x (target 1.5x)")
        if ours and none:
            best = max(ours, key=ours.get)  # type: ignore[arg-type]
            line.append(f"best speculative ({best}) / none = {ours[best] / none:.2f}x (target 2x)")
        if theirs:
            everything = {**ours, **({"relayc none": none} if none else {})}
            best_ours = max(everything, key=everything.get)  # type: ignore[arg-type]
            best_theirs = max(theirs, key=theirs.get)  # type: ignore[arg-type]
            line.append(
                f"relayc best / hf best = {everything[best_ours] / theirs[best_theirs]:.2f}x "
                "(target 2.5x)"
            )
        if llama and (ours or none):
            everything = {**ours, **({"relayc none": none} if none else {})}
            best_ours = max(everything, key=everything.get)  # type: ignore[arg-type]
            for label, rate in llama.items():
                line.append(f"relayc best / {label} = {everything[best_ours] / rate:.2f}x")
        print("  " + "; ".join(line))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"tokens_per_s": by_batch, "tokens_per_cpu_s": by_batch_cpu}, indent=1)
        )


def report_real(
    results: Sequence[Result], reference: list[list[int]], tokens: int, min_share: float, dtype: str
) -> tuple[dict[str, float], dict[str, float]]:
    """The real model's table: tokens/s over `none`'s answer tokens (every row emits the
    same answers, transformers' up to near-ties), against `none` at the same precision."""
    from relayc.specs.explain import table

    def count(r: Result) -> int:
        # llama.cpp on the Q4_1 file computes other numbers: its answers have their own
        # lengths, so its rate counts its own tokens (every other row emits `none`'s).
        return sum(map(len, r.outputs)) if r.label.startswith("llama.cpp") else tokens

    tps = {}
    for r in results:
        best = r.best(min_share)
        if best is not None:
            tps[r.label] = count(r) / best.wall
    per_cpu = {r.label: count(r) / r.least_cpu() for r in results}
    none = tps.get(f"relayc none {dtype}")
    rows = []
    for r in results:
        rate = tps.get(r.label)
        rows.append(
            [
                r.label,
                "starved" if rate is None else f"{rate:.1f}",
                "-" if rate is None or none is None else f"{rate / none:.2f}x",
                f"{per_cpu[r.label]:.1f}",
                f"{sum(r.accepts) / len(r.accepts):.2f}" if r.accepts else "-",
                " ".join(f"{t.share:.2f}" + ("*" if t.share < min_share else "") for t in r.runs),
                "yes"
                if r.outputs == reference
                else ("teacher-forced" if r.label.startswith(("hf", "llama.cpp")) else "NO"),
            ]
        )
    print(
        table(
            [
                "peer",
                "tokens/s",
                "vs relayc none",
                "tokens/cpu-s",
                "accept len",
                "cpu/wall per run",
                "identical",
            ],
            rows,
        )
    )
    return tps, per_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        choices=("toy", "smollm2"),
        default="toy",
        help="the shipped byte-level demo models (default) or SmolLM2-135M-Instruct",
    )
    parser.add_argument(
        "--dtypes", default="float32,bfloat16", help="--model smollm2: precisions, one table each"
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument(
        "--chats",
        choices=("all", "quoting", "other"),
        default="all",
        help="--model smollm2: the chat prompts that quote their input, the others, or all",
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (best of N)")
    parser.add_argument("--batch-sizes", default="1,8", help="concurrent requests, one table each")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (all peers)")
    parser.add_argument("--prompt-lookup-tokens", type=int, default=10)
    parser.add_argument("--no-overlap", action="store_true", help="relayc without overlap")
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument(
        "--graphs",
        default="auto",
        help="relayc's decode steps: auto (eager on the CPU), or tape (recorded and replayed)",
    )
    parser.add_argument(
        "--min-cpu-share",
        type=float,
        default=0.85,
        help="a run with less process CPU time per wall second was starved (flagged *)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="4 prompts, 32 tokens, 2 rounds, one at a time"
    )
    parser.add_argument("--json", help="also write the tokens/s figures here")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.max_new_tokens, args.repeats = 4, 32, 2
        args.batch_sizes = "1"
    set_cpu_threads(args.threads)
    if args.model == "smollm2":
        real_model_main(args)
        return
    tokenizer = ByteTokenizer()
    prompts = [tokenizer.encode(p, add_bos=True) for p in heldout_prompts()[: args.prompts]]
    if not prompts:
        raise SystemExit("the shipped demo models are missing: bench/peers.py compares on them")
    peers = relayc_peers(args.max_new_tokens, not args.no_overlap, args.graphs)
    peers += hf_peers(args.max_new_tokens, args.prompt_lookup_tokens)
    if not args.no_llama_cpp:
        workdir = Path(tempfile.mkdtemp(prefix="relayc-peers-"))
        llama = llama_cpp_peer(args.max_new_tokens, args.threads, workdir)
        if llama is not None:
            peers.append(llama)
        else:
            print("llama.cpp skipped: `pip install llama-cpp-python gguf` to compare with it")
    by_batch: dict[int, dict[str, float]] = {}
    by_batch_cpu: dict[int, dict[str, float]] = {}
    try:
        for group in (int(b) for b in args.batch_sizes.split(",")):
            # relayc none one request at a time is the reference every peer must equal.
            reference = peers[0].run(prompts, 1)[0]
            batch_peers = [p for p in peers if p.max_batch >= group]
            print(
                f"\n{len(prompts)} prompts, {group} at a time, {args.max_new_tokens} new tokens, "
                f"{args.threads} torch thread(s), best of {args.repeats} round-robin runs"
            )
            results = measure(batch_peers, prompts, group, args.repeats, reference)
            total = len(prompts) * args.max_new_tokens
            by_batch[group], by_batch_cpu[group] = report(
                results, reference, total, args.min_cpu_share
            )
    finally:
        for peer in peers:
            peer.close()
    starved = any(len(tps) < len(by_batch_cpu[b]) for b, tps in by_batch.items())
    if starved:
        print("\nsome peers had no unstarved run: the targets below compare CPU time")
    summary(by_batch_cpu if starved else by_batch, "tokens/cpu-s" if starved else "tokens/s")
    if args.json:
        figures = {"tokens_per_s": by_batch, "tokens_per_cpu_s": by_batch_cpu}
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
