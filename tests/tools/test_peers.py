"""relayc/tools/peers.py: transformers on the shipped models decodes what relayc's greedy
`none` decodes, in every mode `relayc demo` and bench/peers.py use."""

from __future__ import annotations

import sys

import pytest

from relayc.tools.peers import HFTarget, left_padded, round_robin, transformers_missing


def test_round_robin_times_every_run_once_per_round_in_order() -> None:
    calls: list[str] = []
    timings = round_robin([lambda: calls.append("a"), lambda: calls.append("b")], 3)
    assert calls == ["a", "b"] * 3
    assert [len(t) for t in timings] == [3, 3]
    assert all(t.wall >= 0 and t.cpu >= 0 for times in timings for t in times)


def test_left_padded_pads_on_the_left_and_masks_the_padding() -> None:
    ids, mask = left_padded([[5, 6, 7], [8]])
    assert ids[1, -1].item() == 8 and ids[0].tolist() == [5, 6, 7]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_transformers_missing_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert "transformers is not importable" in (transformers_missing() or "")


def test_every_hf_mode_equals_relayc_greedy_none() -> None:
    pytest.importorskip("transformers", reason="the HF peers need transformers (a test extra)")
    from relayc.engine import Engine, SamplingParams
    from relayc.engine.checkpoints.shipped import heldout_prompts
    from relayc.engine.text.bytes import ByteTokenizer

    tokens = 8
    prompts = [ByteTokenizer().encode(p, add_bos=True) for p in heldout_prompts()[:2]]
    engine = Engine(None, algorithm="none", overlap=False)
    try:
        reference = [
            o.token_ids for o in engine.generate(prompts, SamplingParams(max_new_tokens=tokens))
        ]
    finally:
        engine.close()
    hf = HFTarget(tokens)
    peers = [hf.greedy(), hf.bare_loop(), hf.prompt_lookup(), hf.assisted(constant=3)]
    peers.append(hf.assisted())
    for peer in peers:
        outputs, accepts = peer.run(prompts, 1)
        assert outputs == reference, peer.label
        # accept length: new tokens per target forward, one request at a time only
        assert (accepts == []) if peer.label == "hf bare loop" else len(accepts) == 2
        assert all(a >= 1.0 for a in accepts), peer.label
        if peer.max_batch > 1:  # both prompts at once, left-padded
            assert peer.run(prompts, 2)[0] == reference, peer.label
