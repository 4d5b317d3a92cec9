"""The block-drafter specs (DFLASH, DSPARK, UNO from SGLang 0.5.23): what they relay, and
that the reference engine refuses DSPARK and UNO by name until it has their drafters."""

from __future__ import annotations

import pytest

from relayc.engine.algorithms import lookup
from relayc.specs.loader import BUNDLED_DIR, load_spec

BLOCK_DRAFTERS = ("dflash", "dspark", "uno")


@pytest.mark.parametrize("algorithm", BLOCK_DRAFTERS)
def test_block_drafters_relay_the_bonus_and_the_lengths_only(algorithm: str) -> None:
    """SGLang 0.5.23's FutureMap relays nothing of these drafters but output_tokens_buf and
    new_seq_lens_buf (need_topk() is False for them), DSA seeds when a payload carries them,
    and DSPARK's confidence to the host; the specs say the same."""
    spec = load_spec(BUNDLED_DIR / f"{algorithm}.yaml")
    own = {"dspark": ["confidence"]}
    assert set(spec.fields) == {
        "bonus_tokens", "new_seq_lens", "dsa_topk_indices", *own.get(algorithm, [])
    }  # fmt: skip
    assert spec.algorithm == algorithm


def test_dspark_relays_confidence_to_the_host_two_publishes_late() -> None:
    """SGLang 0.5.23's ConfidenceRelay: a ring of 3 pinned copies, read 2 publishes late,
    each with the pool's req_generation."""
    host = load_spec(BUNDLED_DIR / "dspark.yaml").fields["confidence"].host_mirror
    assert host is not None
    assert (host.lag, host.depth, host.generation_check) == (2, 3, True)


@pytest.mark.parametrize("algorithm", ("dspark", "uno"))  # dflash runs: test_engine_dflash.py
def test_engine_refuses_a_spec_without_a_drafter(algorithm: str) -> None:
    with pytest.raises(ValueError, match=rf"cannot run `{algorithm}` yet: relayc/specs/"):
        lookup(algorithm, engine=True)
