"""`relayc explain` shows what the spec's `sglang:` section makes the SGLang target do."""

from __future__ import annotations

from relayc.plan import plan_spec_file
from relayc.plan.explain import explain_plan
from relayc.specs.loader import BUNDLED_DIR


def test_explain_shows_the_sglang_members_their_flag_and_the_fallback() -> None:
    multilayer = explain_plan(plan_spec_file(BUNDLED_DIR / "eagle_multilayer.yaml"))
    assert (
        "SGLang members: EAGLE, EAGLE3, FROZEN_KV_MTP, when SGLang's speculative config sets "
        "`enable_multi_layer_eagle`" in multilayer
    )
    eagle = explain_plan(plan_spec_file(BUNDLED_DIR / "eagle.yaml"))
    assert "SGLang members: EAGLE, FROZEN_KV_MTP\n" in eagle
    assert "SGLang fallback: EAGLE3, in a module compiled without a spec" in eagle
    suffix = explain_plan(plan_spec_file(BUNDLED_DIR / "suffix.yaml"))
    assert "registered as SUFFIX" in suffix and "SGLang members" not in suffix
