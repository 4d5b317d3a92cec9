"""The engine under interrupts, bad parameters, failing steps and several callers.

After any failure the pools are exactly as before the call and the next call gives
the tokens it gives on a fresh engine. Every test body runs under ``bounded``: a hang
fails the test instead of blocking the suite.
"""

from __future__ import annotations

import _thread
import faulthandler
import math
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayc.engine import Engine, FinishReason, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.core.sampling import MIN_TEMPERATURE, SamplingBatch, sample
from relayc.engine.text.bytes import VOCAB_SIZE, ByteTokenizer
from tests.engine.engine_helpers import (
    assert_idle,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)

SP = SamplingParams
ENGINE_DIR = Path(__file__).resolve().parents[2] / "relayc" / "engine"
# The scheduler loop: what one step runs on the host, where an interrupt can land.
LOOP_FILES = {
    str(ENGINE_DIR / name)
    for name in (
        "serving/scheduler.py",
        "core/kv_cache.py",
        "serving/step_batch.py",
        "serving/request.py",
        "core/sampling.py",
    )
}
FEW = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def bounded(body: Callable[[], Any], seconds: float = 120.0) -> Any:
    """Run ``body`` on a thread; fail if it does not finish in ``seconds`` (a hang)."""
    result: dict[str, Any] = {}

    def run() -> None:
        torch.set_num_threads(1)
        try:
            result["value"] = body()
        except BaseException as exc:  # re-raised on the test's thread
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"hung: still running after {seconds} s"
    if "error" in result:
        raise result["error"]
    return result.get("value")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=11)


def _engine(model: LlamaForCausalLM, **kwargs: Any) -> Engine:
    options: dict[str, Any] = {"kv_pool_tokens": 200, "max_batch_size": 4, "debug": True}
    return Engine(model, **{**options, **kwargs})


def _tokens(outs: list[Any]) -> list[list[int]]:
    return [o.token_ids for o in outs]


# -- bad parameters ---------------------------------------------------------------------------
WRONG_TYPES = [
    ("seed", 1.5),
    ("seed", "x"),
    ("seed", True),
    ("max_new_tokens", 2.0),
    ("max_new_tokens", "4"),
    ("top_k", 2.5),
    ("top_k", None),
    ("temperature", "hot"),
    ("temperature", None),
    ("temperature", math.inf),
    ("temperature", 10**400),
    ("top_p", "all"),
    ("top_p", complex(1, 0)),
    ("stop_token_ids", (1.5,)),
    ("stop_token_ids", ("a",)),
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES)
def test_a_parameter_of_the_wrong_type_fails_its_request_alone(
    model: LlamaForCausalLM, field: str, value: object
) -> None:
    good = [[5, 6, 7], [9, 9]]
    params = SP(max_new_tokens=5, temperature=0.7, seed=3)

    def body() -> None:
        with _engine(model) as engine:
            expected = _tokens(engine.generate(good, params))
            bad = SP(**{**params.__dict__, field: value})
            for _ in range(3):  # a leak would show by the third call
                outs = engine.generate([good[0], [1, 2], good[1]], [params, bad, params])
                assert_idle(engine)
                assert _tokens([outs[0], outs[2]]) == expected
                assert outs[1].finish_reason is FinishReason.ERROR and outs[1].token_ids == []
                assert outs[1].error is not None and f"`{field}`" in outs[1].error, outs[1].error

    bounded(body)


class _MismatchedTokenizer(ByteTokenizer):
    """A tokenizer that disagrees with its model: a ``bos_token_id`` of 4e9 (as a broken
    ``tokenizer.json`` or GGUF gives), and ids past the embedding for the letter z."""

    bos_id = 4_000_000_000

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = [VOCAB_SIZE + 7 if t == ord("z") else t for t in super().encode(text)]
        return [self.bos_id, *ids] if add_bos else ids


def test_a_prompt_the_tokenizer_cannot_run_fails_alone(model: LlamaForCausalLM) -> None:
    """Ids a tokenizer makes are checked against the model at submission, and a string no
    tokenizer encodes (a lone surrogate) is that request's error: the requests beside them
    get the tokens they get alone, overlapped or not."""
    innocent = [[5, 6, 7], [9, 9, 4, 1]]
    params = [SP(max_new_tokens=6), SP(max_new_tokens=6, temperature=0.8, seed=2)]

    def body() -> None:
        for overlap in (True, False):
            with _engine(model, overlap=overlap, tokenizer=_MismatchedTokenizer()) as engine:
                alone = [
                    engine.generate([p], q)[0].token_ids
                    for p, q in zip(innocent, params, strict=True)
                ]
                for bad, message in [
                    ("hello", r"the tokenizer gave token ids \[4000000000\] outside"),
                    ([3, 4], None),  # a good one between them
                    ("lone \ud800 surrogate", r"lone surrogate U\+D800 at character 5"),
                ]:
                    outs = engine.generate(
                        [innocent[0], bad, innocent[1]], [params[0], SP(), params[1]]
                    )
                    assert_idle(engine)
                    assert [outs[0].token_ids, outs[2].token_ids] == alone
                    if message is None:
                        assert outs[1].finish_reason is not FinishReason.ERROR
                    else:
                        assert outs[1].finish_reason is FinishReason.ERROR, outs[1]
                        assert outs[1].error is not None
                        assert re.search(message, outs[1].error), outs[1].error
                with pytest.raises(ValueError, match=r"ids \[4000000000, 266\] outside"):
                    engine.encode("hz")

    bounded(body)


def test_stop_token_ids_must_be_a_sequence() -> None:
    for value in (5, "ab", None):
        with pytest.raises(TypeError, match=r"`stop_token_ids` must be a sequence of token ids"):
            SP(stop_token_ids=value)  # type: ignore[arg-type]


def test_huge_integers_are_valid_where_they_mean_something(model: LlamaForCausalLM) -> None:
    """A top_k beyond the vocabulary keeps every token (as 0 does); any int is a seed."""

    def body() -> None:
        with _engine(model) as engine:
            base = SP(max_new_tokens=6, temperature=0.9, seed=4)
            (off,) = engine.generate([[3, 4]], base)
            (huge,) = engine.generate([[3, 4]], SP(**{**base.__dict__, "top_k": 10**30}))
            assert huge.error is None and huge.token_ids == off.token_ids
            outs = engine.generate([[3, 4]] * 2, [SP(seed=10**30), SP(seed=-(2**70))])
            assert all(o.error is None and len(o.token_ids) == 32 for o in outs)
            assert_idle(engine)

    bounded(body)


_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.just(10**400),
)


@FEW
@given(
    fields=st.fixed_dictionaries(
        {},
        optional={
            name: _ANY_VALUE for name in ("max_new_tokens", "temperature", "top_k", "top_p", "seed")
        },
    ),
    stop=st.lists(
        st.one_of(st.integers(-5, 300), st.floats(0, 10), st.text(max_size=1)), max_size=2
    ),
)
def test_any_sampling_params_either_run_or_fail_alone(
    model: LlamaForCausalLM, fields: dict[str, object], stop: list[object]
) -> None:
    """Whatever a request's params hold, it runs or gets an error naming a field; the
    other requests of the call are untouched and nothing leaks."""
    if isinstance(fields.get("max_new_tokens"), int) and fields["max_new_tokens"] > 8:
        fields["max_new_tokens"] = 8  # valid but slow; the pool would reject most anyway
    good, good_params = [[7, 8, 9]], SP(max_new_tokens=4)

    def body() -> None:
        with _engine(model, max_context=64) as engine:
            expected = _tokens(engine.generate(good, good_params))
            other = SP(**fields, stop_token_ids=stop)  # type: ignore[arg-type]
            outs = engine.generate([good[0], [1, 2]], [good_params, other])
            assert_idle(engine)
            assert _tokens(outs[:1]) == expected
            out = outs[1]
            if out.finish_reason is FinishReason.ERROR:
                assert out.error is not None and "`" in out.error, out.error
            else:
                assert out.error is None and 1 <= len(out.token_ids) <= 32
            assert _tokens(engine.generate(good, good_params)) == expected

    bounded(body)


# -- tiny temperatures ------------------------------------------------------------------------
@FEW
@given(
    temperature=st.one_of(
        st.just(1e-45),
        st.just(5e-324),
        st.floats(min_value=0.0, max_value=MIN_TEMPERATURE, exclude_max=True, allow_subnormal=True),
    )
)
def test_temperatures_below_the_minimum_are_greedy(
    model: LlamaForCausalLM, temperature: float
) -> None:
    def body() -> None:
        with _engine(model) as engine:
            prompts = [[1, 2, 3], [40, 50]]
            greedy = engine.generate(prompts, SP(max_new_tokens=12))
            tiny = engine.generate(prompts, SP(max_new_tokens=12, temperature=temperature))
            assert _tokens(tiny) == _tokens(greedy)

    bounded(body)


@FEW
@given(
    temperature=st.floats(min_value=MIN_TEMPERATURE, max_value=1e-4),
    seed=st.integers(0, 2**40),
)
def test_small_temperatures_at_or_above_the_minimum_sample_without_collapsing(
    temperature: float, seed: int
) -> None:
    """Well-separated logits: the argmax wins. Two tied leaders: the draws split between
    them across positions (greedy would always take the lower id)."""
    generator = torch.Generator().manual_seed(seed % 2**32)
    logits = torch.randperm(50, generator=generator).float()[None, :].repeat(64, 1) * 0.05
    params = [SP(temperature=temperature, seed=seed)] * 64
    batch = SamplingBatch.build(params, [seed] * 64, "cpu")
    positions = torch.arange(64)
    assert torch.equal(sample(logits, batch, positions), logits.argmax(-1))
    leader = int(logits[0].argmax())
    tied = logits.clone()
    tied[:, (leader + 1) % 50] = tied[0, leader]
    drawn = set(sample(tied, batch, positions).tolist())
    assert drawn == {leader, (leader + 1) % 50}


# -- construction ------------------------------------------------------------------------------
BAD_DIMS = [
    (  # the spec's rule, its line, the values and the bound they give
        {"algorithm": "eagle", "topk": 4, "num_draft_tokens": 100},
        r"rule `num_draft_tokens <= 1 \+ topk \+ \(num_steps - 1\) \* topk \* topk` "
        r"\(relayc/specs/eagle.yaml:\d+\) does not hold for num_draft_tokens=100, topk=4, "
        r"num_steps=3: .*\(`num_draft_tokens` must be at most 37\)",
    ),
    ({"algorithm": "eagle", "num_steps": 0}, r"`num_steps` must be a positive integer; got 0"),
    ({"algorithm": "eagle", "topk": 1.5}, r"`topk` must be a positive integer; got 1.5"),
    ({"algorithm": "eagle", "num_draft_tokens": True}, r"`num_draft_tokens` must be a positive"),
    (
        {"algorithm": "eagle_multilayer", "num_draft_tokens": 9},
        r"rule `num_draft_tokens <= 1 \+ topk \* num_steps` .*must be at most 4\)",
    ),
    (
        {"algorithm": "standalone", "num_draft_tokens": 3},
        r"rule `num_draft_tokens == num_steps \+ 1` \(relayc/specs/standalone.yaml:\d+\) does "
        r"not hold for num_draft_tokens=3, num_steps=3: .*\(set `num_draft_tokens` to 4\)",
    ),
    ({"algorithm": "ngram", "num_draft_tokens": 0}, r"`num_draft_tokens` must be a positive"),
    (
        {"algorithm": "ngram", "num_draft_tokens": 1},
        r"rule `num_draft_tokens >= 2` .*must be at least 2\)",
    ),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_DIMS)
def test_bad_decode_dims_raise_before_anything_is_built(
    model: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], message: str
) -> None:
    def built(*args: object, **kw: object) -> None:
        raise AssertionError("the engine built something before checking its dims")

    monkeypatch.setattr("relayc.engine.serving.engine.load_model", built)
    monkeypatch.setattr("relayc.engine.serving.engine.make_algorithm", built)
    with pytest.raises(ValueError, match=message):
        Engine("random", **kwargs)


@settings(FEW, max_examples=16)
@given(
    algorithm=st.sampled_from(["eagle", "eagle_multilayer", "ngram", "standalone"]),
    num_steps=st.integers(-1, 4),
    topk=st.integers(0, 3),
    num_draft_tokens=st.integers(0, 24),
)
def test_decode_dims_are_accepted_exactly_when_they_run(
    model: LlamaForCausalLM, algorithm: str, num_steps: int, topk: int, num_draft_tokens: int
) -> None:
    dims = {"num_steps": num_steps, "topk": topk, "num_draft_tokens": num_draft_tokens}

    def body() -> None:
        try:
            engine = Engine(model, algorithm=algorithm, kv_pool_tokens=400, debug=True, **dims)
        except ValueError as exc:
            assert "`" in str(exc)
            return
        with engine:
            prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [9, 8]]
            for temperature in (0.0, 0.8):
                outs = engine.generate(prompts, SP(max_new_tokens=7, temperature=temperature))
                assert all(o.error is None and len(o.token_ids) == 7 for o in outs)
            assert_idle(engine)

    bounded(body)


def test_the_fault_injection_traces_files_that_exist() -> None:
    # a moved file would leave the tracer matching nothing, and the fault tests vacuous
    missing = sorted(name for name in LOOP_FILES if not Path(name).is_file())
    assert not missing, f"LOOP_FILES names files that do not exist: {missing}"


# -- interrupts and failing steps -------------------------------------------------------------
class _RaiseAtLine:
    """A trace function raising ``exc`` at the ``n``-th line run in the scheduler loop.

    Raised from the tracer, the exception appears at that line of the traced frame,
    as ``KeyboardInterrupt`` from a signal handler would (and Python then unsets the
    tracer: one fault per ``run``).
    """

    def __init__(self, n: int, exc: type[BaseException]) -> None:
        self.left, self.exc, self.raised = n, exc, None

    def __call__(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename not in LOOP_FILES:
            return None
        return self._line

    def _line(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line" and self.raised is None:
            self.left -= 1
            if self.left <= 0:
                self.raised = self.exc(f"injected in {frame.f_code.co_name}")
                raise self.raised
        return self._line

    def run(self, body: Callable[[], Any]) -> Any:
        before = sys.gettrace()
        sys.settrace(self)
        try:
            return body()
        finally:
            sys.settrace(before)


@settings(FEW, max_examples=24)
@given(
    line=st.integers(1, 3500),  # a generate call runs about 3000 loop lines
    in_recovery=st.none() | st.integers(1, 120),  # and the recovery about 110
    overlap=st.booleans(),
    exc=st.sampled_from([KeyboardInterrupt, RuntimeError]),
    work_seed=st.integers(0, 1000),
)
def test_an_exception_anywhere_in_the_scheduler_loop_leaks_nothing(
    model: LlamaForCausalLM,
    line: int,
    in_recovery: int | None,
    overlap: bool,
    exc: type[BaseException],
    work_seed: int,
) -> None:
    """One fault: the pools are back when the call raises. A second one inside the
    recovery: the next call recovers first. Either way it gives the same tokens."""
    work = random_workload(work_seed, 5, max_prompt=10, max_new=10, last_arrival=3)

    def body() -> None:
        with _engine(model, overlap=overlap, kv_pool_tokens=60, max_batch_size=3) as engine:
            expected = _tokens(engine.generate(work.prompts, work.params))
            fault = _RaiseAtLine(line, exc)
            second = _RaiseAtLine(in_recovery or 0, KeyboardInterrupt)
            recover = engine.scheduler.recover

            def interrupted_recover(*args: Any) -> Any:
                engine.scheduler.recover = recover  # type: ignore[method-assign]
                return second.run(lambda: recover(*args))

            if in_recovery is not None:
                engine.scheduler.recover = interrupted_recover  # type: ignore[method-assign]
            try:
                outs = fault.run(
                    lambda: engine.generate(work.prompts, work.params, arrivals=work.arrivals)
                )
            except (exc, KeyboardInterrupt) as raised:
                assert raised in (fault.raised, second.raised)
            else:
                assert fault.raised is None and _tokens(outs) == expected
            engine.scheduler.recover = recover  # type: ignore[method-assign]
            if second.raised is None:
                assert_idle(engine)
            assert _tokens(engine.generate(work.prompts, work.params)) == expected
            assert_idle(engine)

    bounded(body)


@settings(FEW, max_examples=8)
@given(failing_call=st.integers(1, 12), overlap=st.booleans())
def test_a_failing_decode_step_leaks_nothing(
    model: LlamaForCausalLM, failing_call: int, overlap: bool
) -> None:
    """A decode hook that raises (on the forward worker with overlap): the call raises it."""
    work = random_workload(5, 4, max_prompt=8, max_new=9, last_arrival=2)

    def body() -> None:
        with _engine(model, overlap=overlap) as engine:
            expected = _tokens(engine.generate(work.prompts, work.params))
            decode = engine.algorithm.decode
            calls = 0

            def failing(step: Any) -> Any:
                nonlocal calls
                calls += 1
                if calls == failing_call:
                    raise RuntimeError("decode failed")
                return decode(step)

            engine.algorithm.decode = failing  # type: ignore[method-assign]
            try:
                engine.generate(work.prompts, work.params)
            except RuntimeError as exc:
                assert "decode failed" in str(exc)
            else:
                assert calls < failing_call
            assert_idle(engine)
            engine.algorithm.decode = decode  # type: ignore[method-assign]
            assert _tokens(engine.generate(work.prompts, work.params)) == expected

    bounded(body)


def test_an_interrupt_in_the_first_eagle_step_leaks_nothing(model: LlamaForCausalLM) -> None:
    def body() -> None:
        with _engine(model, algorithm="eagle", topk=2, num_draft_tokens=5) as engine:
            prompts, params = [[1, 2, 3], [4, 5]], SP(max_new_tokens=6)
            expected = _tokens(engine.generate(prompts, params))
            decode = engine.algorithm.decode

            def interrupted(step: Any) -> Any:
                raise KeyboardInterrupt

            engine.algorithm.decode = interrupted  # type: ignore[method-assign]
            with pytest.raises(KeyboardInterrupt):
                engine.generate(prompts, params)
            assert_idle(engine)
            engine.algorithm.decode = decode  # type: ignore[method-assign]
            assert _tokens(engine.generate(prompts, params)) == expected

    bounded(body)


# -- several callers --------------------------------------------------------------------------
def _workloads(n: int) -> list[tuple[list[list[int]], list[SamplingParams]]]:
    out = []
    for i in range(n):
        work = random_workload(100 + i, 3, max_prompt=9, max_new=10, last_arrival=0)
        params = [
            SP(**{**p.__dict__, "temperature": 0.8 * (i % 2), "seed": i}) for p in work.params
        ]
        out.append((work.prompts, params))
    return out


@settings(FEW, max_examples=10)
@given(order=st.lists(st.integers(0, 2), min_size=1, max_size=60), overlap=st.booleans())
def test_streams_iterated_in_turn_get_their_own_tokens(
    model: LlamaForCausalLM, order: list[int], overlap: bool
) -> None:
    calls = _workloads(3)

    def body() -> None:
        with _engine(model, overlap=overlap) as engine:
            expected = [_tokens(engine.generate(p, sp)) for p, sp in calls]
            streams = [engine.stream(p, sp) for p, sp in calls]
            got: list[list[list[int]]] = [[[] for _ in p] for p, _ in calls]
            done = [False] * 3

            def pull(i: int) -> None:
                delta = next(streams[i], None)
                if delta is None:
                    done[i] = True
                else:
                    got[i][delta.index].extend(delta.token_ids)

            for i in order:  # the drawn interleaving, then round-robin to the end
                if not done[i]:
                    pull(i)
            while not all(done):
                for i in range(3):
                    if not done[i]:
                        pull(i)
            assert got == expected
            assert_idle(engine)

    bounded(body)


@pytest.mark.parametrize("overlap", [True, False])
def test_threads_calling_generate_and_stream_get_their_own_outputs(
    model: LlamaForCausalLM, overlap: bool
) -> None:
    calls = _workloads(6)

    def body() -> None:
        with _engine(model, overlap=overlap) as engine:
            expected = [_tokens(engine.generate(p, sp)) for p, sp in calls]
            results: dict[int, list[list[int]]] = {}
            errors: list[BaseException] = []
            start = threading.Barrier(len(calls))

            def caller(i: int) -> None:
                prompts, params = calls[i]
                try:
                    start.wait(timeout=30)
                    for _ in range(2):
                        if i % 2:
                            results[i] = _tokens(engine.generate(prompts, params))
                        else:
                            tokens: list[list[int]] = [[] for _ in prompts]
                            for delta in engine.stream(prompts, params):
                                tokens[delta.index].extend(delta.token_ids)
                            results[i] = tokens
                        assert results[i] == expected[i]
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(calls))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(90)
            assert not any(t.is_alive() for t in threads), "a caller hung"
            assert not errors, errors
            assert results == dict(enumerate(expected))
            assert_idle(engine)

    bounded(body, 180)


def test_an_exception_in_a_stream_consumer_leaves_the_engine_usable(
    model: LlamaForCausalLM,
) -> None:
    calls = _workloads(2)

    def body() -> None:
        with _engine(model) as engine:
            expected = [_tokens(engine.generate(p, sp)) for p, sp in calls]
            stream = engine.stream(*calls[0])
            with pytest.raises(ZeroDivisionError):
                for _ in stream:
                    raise ZeroDivisionError  # the loop's frame keeps `stream` alive
            assert _tokens(engine.generate(*calls[1])) == expected[1]
            # The abandoned stream is still open: it resumes where it stopped.
            rest: list[list[int]] = [[] for _ in calls[0][0]]
            for delta in stream:
                rest[delta.index].extend(delta.token_ids)
            assert all(r == e[len(e) - len(r) :] for r, e in zip(rest, expected[0], strict=True))
            assert_idle(engine)
            stream = engine.stream(*calls[0])
            next(stream)
            del stream  # collected: aborted, slots back
            assert_idle(engine)

    bounded(body)


def test_a_failure_in_one_call_stops_the_open_calls_with_an_error(
    model: LlamaForCausalLM,
) -> None:
    calls = _workloads(2)

    def body() -> None:
        with _engine(model) as engine:
            expected = _tokens(engine.generate(*calls[1]))
            other = engine.stream(*calls[0])
            next(other)
            decode = engine.algorithm.decode

            def interrupted(step: Any) -> Any:
                raise KeyboardInterrupt

            engine.algorithm.decode = interrupted  # type: ignore[method-assign]
            with pytest.raises(KeyboardInterrupt):
                engine.generate(*calls[1])
            engine.algorithm.decode = decode  # type: ignore[method-assign]
            finals = [d for d in other if d.finish_reason is not None]
            assert {d.finish_reason for d in finals} <= {FinishReason.ERROR, FinishReason.LENGTH}
            assert any("KeyboardInterrupt" in (d.error or "") for d in finals)
            assert_idle(engine)
            assert _tokens(engine.generate(*calls[1])) == expected

    bounded(body)


def test_random_interleavings_of_everything(model: LlamaForCausalLM) -> None:
    """Streams opened, pulled, abandoned and closed at random, with generate calls between."""
    rng = random.Random(7)
    calls = _workloads(4)

    def body() -> None:
        with _engine(model) as engine:
            expected = [_tokens(engine.generate(p, sp)) for p, sp in calls]
            open_streams: list[tuple[int, Iterator[Any], list[list[int]]]] = []
            for _ in range(60):
                action = rng.random()
                if action < 0.25 or not open_streams:
                    i = rng.randrange(4)
                    tokens: list[list[int]] = [[] for _ in calls[i][0]]
                    open_streams.append((i, engine.stream(*calls[i]), tokens))
                elif action < 0.35:
                    i = rng.randrange(4)
                    assert _tokens(engine.generate(*calls[i])) == expected[i]
                elif action < 0.45:
                    open_streams.pop(rng.randrange(len(open_streams)))[1].close()  # type: ignore[attr-defined]
                else:
                    k = rng.randrange(len(open_streams))
                    i, stream, tokens = open_streams[k]
                    delta = next(stream, None)
                    if delta is None:
                        assert tokens == expected[i]
                        open_streams.pop(k)
                    else:
                        tokens[delta.index].extend(delta.token_ids)
            for _, stream, _ in open_streams:
                stream.close()  # type: ignore[attr-defined]
            assert_idle(engine)

    bounded(body, 180)


@pytest.mark.parametrize("where", ["step", "forward"])
def test_a_stream_collected_while_the_engine_is_busy_is_aborted_later(
    model: LlamaForCausalLM, where: str
) -> None:
    """The garbage collector may close a dropped stream on any thread: inside this
    thread's own step (which holds the engine), or on the forward worker that step is
    waiting for. Its requests are aborted at the next chance, never a deadlock."""
    calls = _workloads(2)

    def body() -> None:
        with _engine(model, overlap=True) as engine:
            expected = _tokens(engine.generate(*calls[1]))
            holder = [engine.stream(*calls[0])]
            next(holder[0])
            owner, name = (
                (engine.scheduler, "step") if where == "step" else (engine.algorithm, "decode")
            )
            original = getattr(owner, name)

            def dropping_the_stream(*args: Any) -> Any:
                holder.clear()  # the last reference: the stream is closed right here
                return original(*args)

            setattr(owner, name, dropping_the_stream)
            assert _tokens(engine.generate(*calls[1])) == expected
            setattr(owner, name, original)
            assert _tokens(engine.generate(*calls[1])) == expected
            assert_idle(engine)

    bounded(body)


def test_a_leak_fails_loudly_instead_of_waiting_forever(model: LlamaForCausalLM) -> None:
    """Should a slot ever leak, a request that no longer fits an idle engine raises (and the
    reset gives the slots back) instead of waiting for a release that never comes."""

    def body() -> None:
        with _engine(model, kv_pool_tokens=40) as engine:
            params = SP(max_new_tokens=20)
            expected = _tokens(engine.generate([[1] * 20], params))
            engine.scheduler.kv_unreserved -= 5  # as a lost reservation would
            with pytest.raises(RuntimeError, match="broken invariant: an idle scheduler has 35"):
                engine.generate([[1] * 20], params)
            assert_idle(engine)
            assert _tokens(engine.generate([[1] * 20], params)) == expected

    bounded(body)


@settings(FEW, max_examples=10)
@given(delay=st.floats(0.0, 0.4), overlap=st.booleans())
def test_a_real_ctrl_c_leaks_nothing(model: LlamaForCausalLM, delay: float, overlap: bool) -> None:
    """``KeyboardInterrupt`` delivered to the main thread, as Ctrl-C is, wherever it lands.

    It must run on the main thread, so ``bounded`` cannot guard it: a hang ends the
    process with a traceback (faulthandler) instead.
    """
    work = random_workload(9, 6, max_prompt=10, max_new=16, last_arrival=2)
    faulthandler.dump_traceback_later(120, exit=True)
    try:
        with _engine(model, overlap=overlap) as engine:
            expected = _tokens(engine.generate(work.prompts, work.params))
            timer = threading.Timer(delay, _thread.interrupt_main)
            outs = None
            try:
                try:
                    timer.start()  # with no delay the interrupt may land in here
                    outs = engine.generate(work.prompts, work.params)
                finally:
                    timer.join()
                    time.sleep(0.01)  # an interrupt after the call is delivered here
            except KeyboardInterrupt:
                pass
            if outs is not None:
                assert _tokens(outs) == expected
            assert_idle(engine)
            assert _tokens(engine.generate(work.prompts, work.params)) == expected
            assert_idle(engine)
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_closing_the_engine_aborts_the_open_calls(model: LlamaForCausalLM) -> None:
    calls = _workloads(2)

    def body() -> None:
        engine = _engine(model)
        stream = engine.stream(*calls[0])
        first = next(stream)
        engine.close()
        assert_idle(engine)
        rest = [first, *stream]
        finals = {d.index: d.finish_reason for d in rest if d.finish_reason is not None}
        assert sorted(finals) == list(range(len(calls[0][0])))
        assert FinishReason.ABORT in finals.values()

    bounded(body)
