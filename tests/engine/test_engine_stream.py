"""Streaming deltas, the forward runners, and `relayc generate`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from relayc.cli import main
from relayc.engine import Engine, FinishReason, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.serving.overlap import InlineRunner, ThreadRunner
from relayc.tools.terminal import printable
from tests.engine.engine_helpers import (
    assert_idle,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=9)


def test_deltas_add_up_to_the_outputs(model: LlamaForCausalLM) -> None:
    work = random_workload(31, 10, max_prompt=12, max_new=16, last_arrival=4)
    prompts = [*work.prompts, [], "héllo ✓"]  # one rejected, one with multi-byte text
    params = [*work.params, SamplingParams(), SamplingParams(max_new_tokens=9)]
    arrivals = [*work.arrivals, 0, 1]
    with Engine(model) as engine:
        outs = engine.generate(prompts, params, arrivals=arrivals)
        deltas = list(engine.stream(prompts, params, arrivals=arrivals))
    assert deltas[0].finish_reason is FinishReason.ERROR and deltas[0].index == 10
    for out in outs:
        mine = [d for d in deltas if d.index == out.index]
        assert [d.finish_reason for d in mine] == [None] * (len(mine) - 1) + [out.finish_reason]
        assert [t for d in mine for t in d.token_ids] == out.token_ids
        # Text decoded piecewise (a UTF-8 character may span deltas) equals the whole.
        assert "".join(d.text for d in mine) == out.text
    assert any("\ufffd" in o.text or any(t >= 128 for t in o.token_ids) for o in outs)


def test_closing_a_stream_early_aborts_and_frees_everything(model: LlamaForCausalLM) -> None:
    work = random_workload(32, 6, max_prompt=8, max_new=30, last_arrival=3)
    with Engine(model, debug=True) as engine:
        expected = [o.token_ids for o in engine.generate(work.prompts, work.params)]
        stream = engine.stream(work.prompts, work.params, arrivals=work.arrivals)
        for _ in range(4):
            next(stream)
        stream.close()
        assert_idle(engine)
        assert [o.token_ids for o in engine.generate(work.prompts, work.params)] == expected


def test_the_thread_runner_returns_before_the_job_runs_and_keeps_order() -> None:
    release = threading.Event()
    order: list[int] = []

    def job(n: int) -> int:
        assert release.wait(timeout=10), "the host never got control back"
        order.append(n)
        return n

    runner = ThreadRunner()
    pending = [runner.submit(lambda n=n: job(n)) for n in range(5)]
    release.set()  # reached only because submit did not wait for the job
    assert [p.wait() for p in pending] == [0, 1, 2, 3, 4] == order
    runner.close()
    done = threading.Event()
    inline = InlineRunner().submit(lambda: done.set() or 7)
    assert done.is_set() and inline.wait() == 7


def test_the_thread_runner_runs_one_request_jobs_inline_after_the_queued_ones() -> None:
    release = threading.Event()
    order: list[str] = []
    runner = ThreadRunner()
    assert not runner.overlaps(1) and runner.overlaps(2)
    assert ThreadRunner(inline_rows=0).overlaps(1) and InlineRunner().overlaps(5) is False

    def queued() -> str:
        assert release.wait(timeout=10), "the host never got control back"
        order.append("queued")
        return "queued"

    first = runner.submit(queued)
    threading.Timer(0.05, release.set).start()
    caller = threading.current_thread()
    inline = runner.run_inline(lambda: order.append("inline") or threading.current_thread())
    assert order == ["queued", "inline"] and inline.wait() is caller and first.wait() == "queued"
    runner.close()


def test_overlap_outputs_are_the_same_with_one_request_jobs_inline_or_on_the_worker() -> None:
    sampled = SamplingParams(max_new_tokens=12, temperature=0.8, seed=3)
    with Engine(seed=0, overlap=False) as engine:
        free = engine.generate(["Hello"], SamplingParams(max_new_tokens=12))[0].token_ids
    stopped = SamplingParams(max_new_tokens=12, stop_token_ids=(free[2],))
    runs = []
    for inline_rows in (1, 0):
        with Engine(seed=0, overlap=True) as engine:
            engine.runner.close()
            engine.runner = engine.scheduler.runner = ThreadRunner(inline_rows=inline_rows)
            one = [engine.generate([p], sampled)[0].token_ids for p in ("Hello", "ab")]
            both = [o.token_ids for o in engine.generate(["Hello", "ab"], sampled)]
            rows = engine.scheduler.stats.decode_rows
            stop = engine.generate(["Hello"], stopped)[0].token_ids
            runs.append((one, both, stop, engine.scheduler.stats.decode_rows - rows))
    (one, both, stop, inline_rows_run), (one_w, both_w, stop_w, worker_rows_run) = runs
    assert one == both == one_w == both_w and stop == stop_w == free[: free.index(free[2]) + 1]
    # Inline, a one-request job is processed in its own iteration: the stop costs no extra row.
    assert inline_rows_run == worker_rows_run - 1


def _generate_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["generate", *argv])  # usage errors: one line and 2, from relayc's main
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_relayc_generate_streams_text_and_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    # --toy: the engine's default model (the CLI's default is SmolLM2)
    with Engine(seed=0) as engine:
        (out,) = engine.generate(["Hello"], SamplingParams(max_new_tokens=6, seed=0))
    code, stdout, stderr = _generate_cli(
        ["--toy", "--prompt", "Hello", "--max-new-tokens", "6"], capsys
    )
    assert code == 0 and stdout == printable(out.text) + "\n"
    assert "6 tokens in " in stderr and "finish: length, overlap on)" in stderr
    # the prefill's wait apart from the decoding speed
    assert re.search(r"\(first token after \d+\.\d\d s, then \d+\.\d tokens/s; ", stderr)
    # the summary, then which native path decoded (the toy runs float32)
    summary, path = stderr.rstrip().splitlines()[-2:]
    assert summary.endswith("algorithm none, mean accept length 1.00")
    assert path.startswith("decoded with float32 ")
    code, _, stderr = _generate_cli(["--toy", "--prompt", "x", "--algorithm", "beam"], capsys)
    assert code == 2 and "unknown algorithm `beam`" in stderr
    code, same, _ = _generate_cli(
        ["--toy", "--prompt", "Hello", "--max-new-tokens", "6", "--no-overlap"], capsys
    )
    assert code == 0 and same == stdout
    sampled = ["--toy", "--prompt", "Hi", "--temperature", "0.9", "--top-k", "40", "--top-p", "0.9"]
    assert (
        _generate_cli([*sampled, "--seed", "4"], capsys)[1]
        == _generate_cli([*sampled, "--seed", "4"], capsys)[1]
    )
    code, stdout, stderr = _generate_cli(["--prompt", "x", "--top-p", "0"], capsys)
    assert code == 2 and stdout == ""
    assert "relayc generate: error: argument --top-p: must be a finite number in (0, 1]" in stderr
    code, _, stderr = _generate_cli(["--prompt", "x", "--model", "/no/such/dir"], capsys)
    assert code == 2 and "no model '/no/such/dir'" in stderr
    assert printable("a\x1b[31m\n") == "a\\x1b[31m\n"


def test_a_stream_never_iterated_queues_nothing(model: LlamaForCausalLM) -> None:
    with Engine(model) as engine:
        stream = engine.stream([[1, 2, 3]], SamplingParams(max_new_tokens=3))
        with pytest.raises(TypeError, match="not a string"):
            engine.stream("Hello")  # type: ignore[arg-type]  # call mistakes raise at once
        assert not engine.scheduler.has_work()
        del stream
        (out,) = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))
        assert len(out.token_ids) == 3 and engine.scheduler.stats.forwards == 3


def test_the_generate_command_module_does_not_import_torch() -> None:
    """relayc's command line imports it for every command, `relayc validate` included."""
    root = Path(__file__).resolve().parents[2]
    code = "import sys, relayc.tools.generate; sys.exit('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(root)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0
