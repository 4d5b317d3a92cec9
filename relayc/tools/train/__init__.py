"""Train the tiny demo models shipped in ``relayc/assets/demo`` (issue #8), on the CPU.

    python -m relayc.tools.train --out relayc/assets/demo          # ~70 minutes, 2 threads
    python -m relayc.tools.train --out /tmp/demo --smoke           # tiny sizes, < 60 s
    python -m relayc.tools.train --out relayc/assets/demo --measure-only

1. A corpus assembled from this Python's standard library (``*.py`` under
   ``sysconfig.get_paths()["stdlib"]``, sorted, tests / idlelib / site-packages and
   generated tables excluded, capped at a fixed size), no downloads. Its SHA-256 and
   the Python version are recorded: another Python gives another corpus. Every
   ``HOLDOUT_EVERY``-th file is held out for the held-out loss and the prompts.
2. A byte-level Llama target, trained with next-byte cross-entropy.
3. By distillation from the frozen target (loss: KL(target || draft) on the target's
   full next-token distribution): the EAGLE head, the multi-layer EAGLE (MTP)
   drafter and a standalone draft model. The heads are trained exactly the way
   the engine feeds them (see ``eagle_losses`` and ``mtp_losses``).
4. Measure acceptance with the real ``Engine`` on the held-out prompts (greedy) and
   write ``MODEL_CARD.md``.

Every model stops at its time budget (``--minutes-*``) or step cap (``--steps-*``);
the learning rate follows warmup + cosine over whichever of the two is given
(the step cap when both are). Data order and initialisation are seeded, so a run
with step caps and no binding time budget is reproducible on the same Python.
Weights are stored as float16 tensors under a float32 ``config.json``: the loaders
cast them to float32, the dtype the engine runs in.
"""

from relayc.tools.train.card import (
    model_card,
    write_outputs,
)
from relayc.tools.train.cli import (
    main,
    parse_args,
    run_training,
)
from relayc.tools.train.corpus import (
    CORPUS_EXCLUDE,
    HOLDOUT_AT,
    HOLDOUT_EVERY,
    NUM_PROMPTS,
    PROMPT_BYTES,
    Corpus,
    assemble_corpus,
    corpus_files,
    heldout_prompts,
    sample_batch,
)
from relayc.tools.train.loop import (
    draft_eval,
    make_optimizer,
    prompt_loss,
    target_heldout_loss,
    train_loop,
)
from relayc.tools.train.losses import (
    EAGLE_DEPTH,
    STEP_WEIGHTS,
    TargetOut,
    agreement,
    eagle_losses,
    mtp_losses,
    run_target,
    soft_kl,
    standalone_losses,
    weighted,
)
from relayc.tools.train.measure import (
    ENGINE_RUNS,
    eagle_chain_proposer,
    measure_acceptance,
    simulate_chain,
    standalone_chain_proposer,
)
from relayc.tools.train.plan import (
    MTP_STEPS,
    SUBDIRS,
    Plan,
    count_params,
    dir_bytes,
    full_plan,
    init_for_training,
    smoke_plan,
    store_half,
)

__all__ = [
    "CORPUS_EXCLUDE",
    "EAGLE_DEPTH",
    "ENGINE_RUNS",
    "HOLDOUT_AT",
    "HOLDOUT_EVERY",
    "MTP_STEPS",
    "NUM_PROMPTS",
    "PROMPT_BYTES",
    "STEP_WEIGHTS",
    "SUBDIRS",
    "Corpus",
    "Plan",
    "TargetOut",
    "agreement",
    "assemble_corpus",
    "corpus_files",
    "count_params",
    "dir_bytes",
    "draft_eval",
    "eagle_chain_proposer",
    "eagle_losses",
    "full_plan",
    "heldout_prompts",
    "init_for_training",
    "main",
    "make_optimizer",
    "measure_acceptance",
    "model_card",
    "mtp_losses",
    "parse_args",
    "prompt_loss",
    "run_target",
    "run_training",
    "sample_batch",
    "simulate_chain",
    "smoke_plan",
    "soft_kl",
    "standalone_chain_proposer",
    "standalone_losses",
    "store_half",
    "target_heldout_loss",
    "train_loop",
    "weighted",
    "write_outputs",
]
