"""Generated PrefillStep / DecodeStep wiring, capture_check and the graph runner."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from relayc.compiler.writer import engine_specs
from relayc.runtime.capture import CaptureViolation, capture_check
from relayc.runtime.graph_runner import GraphRunner, StaticInput
from relayc.specs.loader import load_spec
from tests.runtime.fakes import fake_impls

ALGORITHMS = [p.stem for p in engine_specs()]  # dspark, uno: SGLang only
POOL = 64


def setup(algorithm: str, ctx: object = None):  # type: ignore[no-untyped-def]
    module = importlib.import_module(f"relayc.generated.{algorithm}")
    relay = module.FutureMap(
        POOL,
        "cpu",
        dims={"hidden": 6, "vocab": 10, "topk": 2, "num_steps": 3, "num_draft_tokens": 5}
        if "hidden" in module.DIM_DEFAULTS
        else {},
    )
    impls = fake_impls(module, relay.dims)
    prefill = module.PrefillStep(relay, impls)
    decode = module.DecodeStep(relay, impls)
    return module, relay, prefill, decode


def batch(slots: list[int]) -> dict[str, torch.Tensor]:
    return {"req_pool_indices": torch.tensor(slots), "seq_lens": torch.tensor(slots) + 7}


def recording() -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """A ctx whose fake ops record every output as `op.output` (op names are unique per
    step in the bundled specs)."""
    seen: dict[str, torch.Tensor] = {}

    def after(op, op_inputs, outputs):  # type: ignore[no-untyped-def]
        seen.update({f"{op.name}.{name}": value for name, value in outputs.items()})

    return seen, {"after": after}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_prefill_then_decode_relays_through_the_future_map(algorithm: str) -> None:
    """Each step relays what its spec stashes and returns what its `outputs:` names."""
    _module, relay, prefill, decode = setup(algorithm)
    spec = load_spec(f"relayc/specs/{algorithm}.yaml")
    ops = {step.name: step.op for step in (spec.prefill, *spec.steps)}
    inputs = batch([3, 9, 4])
    seen, ctx = recording()
    seeded = prefill(ctx, **inputs)
    resolved = relay.resolve(inputs["req_pool_indices"])
    for field_name, output in spec.prefill.stash.items():
        assert torch.equal(getattr(resolved, field_name), seen[f"{spec.prefill.op}.{output}"])
    assert [f.name for f in dataclasses.fields(seeded)] == list(spec.outputs.prefill)
    for name, ref in spec.outputs.prefill.items():
        assert getattr(seeded, name) is seen[f"{ops[ref.source]}.{ref.name}"]
    seen.clear()
    outputs = decode(ctx, **inputs)
    assert [f.name for f in dataclasses.fields(outputs)] == list(spec.outputs.decode)
    for name, ref in spec.outputs.decode.items():
        assert getattr(outputs, name) is seen[f"{ops[ref.source]}.{ref.name}"]
    after = relay.resolve(inputs["req_pool_indices"])
    for step in spec.steps:
        for field_name, output in step.stash.items():
            assert torch.equal(getattr(after, field_name), seen[f"{step.op}.{output}"])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_decode_step_passes_capture_check(algorithm: str) -> None:
    _module, _relay, prefill, decode = setup(algorithm)
    inputs = batch([5, 6])
    prefill(None, **inputs)
    host = decode.run_host(None, **inputs)
    outputs = capture_check(decode, None, inputs, host)
    assert all(v.shape[0] == 2 for v in vars(outputs).values())


def test_missing_implementations_are_named() -> None:
    module = importlib.import_module("relayc.generated.none")
    relay = module.FutureMap(8, "cpu")
    with pytest.raises(ValueError, match="DecodeStep of `none` needs implementations of sample"):
        module.DecodeStep(relay, {"target_decode": lambda ctx, **kw: {}})


@pytest.mark.parametrize(
    ("misbehave", "message"),
    [
        (lambda inputs: inputs["logits"].sum().item(), r"_local_scalar_dense.*host sync"),
        (lambda inputs: inputs["logits"].nonzero(), r"nonzero.*data-dependent"),
        (lambda inputs: inputs["logits"][inputs["logits"] > 0], r"boolean mask"),
        (lambda inputs: inputs["logits"].tolist(), r"Tensor.tolist\(\) reads a tensor on the host"),
        (lambda inputs: inputs["logits"].cpu(), r"Tensor.cpu\(\) reads a tensor on the host"),
        (lambda inputs: bool(inputs["logits"].any()), r"host sync"),
    ],
)
def test_capture_check_catches_what_graphs_cannot_hold(misbehave, message: str) -> None:  # type: ignore[no-untyped-def]
    _module, _relay, prefill, decode = setup("none")
    inputs = batch([2, 3])
    prefill(None, **inputs)

    def after(op, op_inputs, outputs):  # type: ignore[no-untyped-def]
        if op.name == "sample":
            misbehave(op_inputs)

    ctx = {"after": after}
    with pytest.raises(CaptureViolation, match=message) as info:
        capture_check(decode, ctx, inputs, {})
    assert "relayc/generated/none.py" in str(info.value)  # points at the generated step


def test_capture_check_catches_reallocated_relay_buffers() -> None:
    _module, relay, prefill, decode = setup("none")
    inputs = batch([2, 3])
    prefill(None, **inputs)

    kept = []  # keep old buffers alive so a new one cannot reuse their address

    def after(op, op_inputs, outputs):  # type: ignore[no-untyped-def]
        kept.append(relay.buffers["bonus_tokens"])
        relay.buffers["bonus_tokens"] = relay.buffers["bonus_tokens"].clone()

    with pytest.raises(CaptureViolation, match=r"reallocated relay buffers \['bonus_tokens'\]"):
        capture_check(decode, {"after": after}, inputs, {})


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_static_runner_pads_with_slot_0_and_matches_eager(algorithm: str) -> None:
    module, relay, prefill, decode = setup(algorithm)
    _, eager_relay, eager_prefill, eager_decode = setup(algorithm)
    slots = [7, 2, 11]
    inputs = batch(slots)
    prefill(None, **inputs)
    eager_prefill(None, **inputs)
    host_spec = {
        name: StaticInput(value.dtype, tuple(value.shape[1:]))
        for name, value in decode.run_host(None, **inputs).items()
    }
    runner = GraphRunner(
        decode,
        device="cpu",
        batch_sizes=[1, 4, 8],
        mode="static",
        inputs={"req_pool_indices": StaticInput(torch.int64), "seq_lens": StaticInput(torch.int64)},
        host_inputs=host_spec,
    )
    runner.capture(None)
    assert runner.bucket_for(3) == 4 and runner.bucket_for(9) is None
    for _ in range(2):
        host = decode.run_host(None, **inputs)
        got = runner.run(None, inputs, host)
        want = eager_decode(None, **inputs)
        assert type(got) is module.DecodeOutputs
        for key, value in vars(got).items():
            assert value.shape[0] == 3
            assert torch.equal(value, getattr(want, key)), key
    for info in module.FIELDS:
        got_row = getattr(relay.resolve(inputs["req_pool_indices"]), info.name)
        want_row = getattr(eager_relay.resolve(inputs["req_pool_indices"]), info.name)
        if want_row is None:  # a lazy field no step stashes (DSA seeds): never allocated
            assert got_row is None, info.name
            continue
        assert torch.equal(got_row, want_row), info.name
