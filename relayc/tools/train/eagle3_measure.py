"""Acceptance of EAGLE-3 heads with the real ``Engine``: greedy, the accept length per
verify and per draft depth, beside ``none`` (the outputs must be identical) and any other
algorithms measured on the same run (the shipped EAGLE head)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

MeasureRun = tuple[str, str, dict[str, Any]]  # label, algorithm, Engine keyword arguments


def depth_rates(accepts: Sequence[int], num_steps: int) -> list[float]:
    """Per draft depth ``d = 1..num_steps``: the fraction of verifies that accepted at least
    ``d`` drafted tokens (an accept length counts the bonus token, hence ``> d``)."""
    total = max(len(accepts), 1)
    return [round(sum(a > d for a in accepts) / total, 4) for d in range(1, num_steps + 1)]


def summarize(accepts: Sequence[int], num_steps: int) -> dict[str, Any]:
    return {
        "mean_accept_length": round(sum(accepts) / max(len(accepts), 1), 3),
        "verifies": len(accepts),
        "accepted_at_depth": depth_rates(accepts, num_steps),
    }


def measure_runs(
    runs: Sequence[MeasureRun],
    generate: Callable[[Any], list[Any]],
    make_engine: Callable[..., Any],
    num_steps: int,
) -> dict[str, Any]:
    """For each run, ``make_engine(algorithm=..., **kwargs)`` then ``generate(engine)``.
    The first run must be ``none``: the others' outputs are compared with it."""
    results: dict[str, Any] = {}
    reference = None
    for label, algorithm, kwargs in runs:
        start = time.perf_counter()
        engine = make_engine(algorithm=algorithm, num_steps=num_steps, **kwargs)
        outs = generate(engine)
        engine.close()
        tokens = [o.token_ids for o in outs]
        errors = [o.error for o in outs if getattr(o, "error", None)]
        if errors:
            raise RuntimeError(f"{label}: {errors[0]}")
        if reference is None:
            reference = tokens
        accepts = [a for o in outs for a in o.accept_lengths]
        results[label] = {
            "algorithm": algorithm,
            **{k: v for k, v in kwargs.items() if k != "draft_model"},
            **summarize(accepts, num_steps),
            "new_tokens": sum(len(t) for t in tokens),
            "identical_to_none": tokens == reference,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {results[label]}", flush=True)
    return results
