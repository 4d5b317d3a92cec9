"""Draft models for speculative decoding, standalone components the decode steps call.

tree.py        the EAGLE drafting layout build_tree consumes: beam levels, selection,
               the multi-layer (MTP) and chain layouts, trees from parent pointers
layers.py      DraftLayer (fc + decoder layer + norm) and the target parts heads share
paged.py       fixed-shape draft forwards on a draft KV cache (padded extend, scratch steps)
eagle.py       EagleHead: one decoder layer over fc(cat(embed, target hidden)); tree drafting
eagle3.py      Eagle3Head: fc over three target layers' inputs, its own vocabulary and d2t map
mtp.py         MtpDrafter: one draft layer per step, all steps drafted in draft extend
standalone.py  StandaloneDrafter: a small Llama with its own cache, chain drafting
ngram.py       NgramIndex / NgramProposer: host-side suffix-match trees, lag-keyed proposals
dflash.py      DFlashDrafter: one non-causal forward over [bonus, masks] drafts a block
dflash_config.py  a DFlash checkpoint's config.json: block size, tapped layers, mask token
weights.py     seeded init and config.json + model.safetensors checkpoints of the heads
speculative.py Drafting: a drafter and its decode KV window; the size rules
"""

from __future__ import annotations

from relayc.engine.draft.eagle import EagleExtendOutput, EagleHead
from relayc.engine.draft.eagle3 import Eagle3ExtendOutput, Eagle3Head
from relayc.engine.draft.mtp import MtpDrafter, MtpExtendOutput
from relayc.engine.draft.ngram import (
    NgramIndex,
    NgramProposals,
    NgramProposer,
    NgramTree,
    pack_tree,
    propose,
    splice_proposals,
    unpack_rows,
)
from relayc.engine.draft.paged import extend_cache_loc
from relayc.engine.draft.standalone import StandaloneDrafter, StandaloneExtendOutput
from relayc.engine.draft.tree import (
    ChainDraft,
    DraftTree,
    TreeLayout,
    chain_tree,
    mtp_select,
    organize_draft_results,
    select_level,
    tree_from_parents,
)

__all__ = [
    "ChainDraft",
    "DraftTree",
    "Eagle3ExtendOutput",
    "Eagle3Head",
    "EagleExtendOutput",
    "EagleHead",
    "MtpDrafter",
    "MtpExtendOutput",
    "NgramIndex",
    "NgramProposals",
    "NgramProposer",
    "NgramTree",
    "StandaloneDrafter",
    "StandaloneExtendOutput",
    "TreeLayout",
    "chain_tree",
    "extend_cache_loc",
    "mtp_select",
    "organize_draft_results",
    "pack_tree",
    "propose",
    "select_level",
    "splice_proposals",
    "tree_from_parents",
    "unpack_rows",
]
