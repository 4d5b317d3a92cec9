from __future__ import annotations

import pytest
import torch

from relayc.kernels.verify_greedy import verify_tree_greedy, verify_tree_greedy_reference
from tests.kernels.trees import DraftTrees, random_trees

# Values no kernel writes on purpose: a slot still holding one was never written.
POISON_INDEX = -99
POISON_PREDICT = -1


def agreeing_targets(trees: DraftTrees, vocab: int, agree: float, gen: torch.Generator):
    """target_predict whose argmax picks one of the node's children with probability
    ``agree`` (so paths get long) and a random token otherwise (so walks also stop)."""
    target = torch.randint(vocab, trees.candidates.shape, generator=gen)
    for b in range(trees.batch):
        for node in range(trees.num_draft):
            kids = trees.children(b, node)
            if kids and float(torch.rand((), generator=gen)) < agree:
                pick = kids[int(torch.randint(len(kids), (1,), generator=gen))]
                target[b, node] = trees.candidates[b, pick]
    return target


def run(fn, trees: DraftTrees, target: torch.Tensor, num_spec_step: int, **kw):
    predicts = torch.full((trees.batch * trees.num_draft,), POISON_PREDICT, dtype=torch.int32)
    accept_index = torch.full((trees.batch, num_spec_step), POISON_INDEX, dtype=torch.int32)
    accept_token_num = torch.full((trees.batch,), POISON_INDEX, dtype=torch.int32)
    fn(
        predicts,
        accept_index,
        accept_token_num,
        trees.candidates,
        trees.retrive_index,
        trees.retrive_next_token,
        trees.retrive_next_sibling,
        target,
        **kw,
    )
    return predicts, accept_index, accept_token_num


def assert_same(got, want):
    for name, g, w in zip(("predicts", "accept_index", "accept_token_num"), got, want, strict=True):
        assert torch.equal(g, w), f"{name} differs:\n{g}\nvs reference\n{w}"


# "auto" on CPU tensors: the host loop up to HOST_LOOP_MAX_BATCH requests, torch above.
BACKENDS = ["auto", "torch", "triton"]

CASES = [
    # (batch, num_draft, num_spec_step, max_depth, vocab)
    (1, 1, 1, 1, 4),
    (1, 1, 4, 1, 4),
    (3, 7, 4, 8, 3),
    (3, 64, 9, 8, 5),
    (64, 9, 5, 3, 3),
    (64, 16, 9, 8, 4),
    (3, 13, 2, 8, 2),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("batch", "num_draft", "num_spec_step", "max_depth", "vocab"), CASES)
def test_matches_reference(backend, batch, num_draft, num_spec_step, max_depth, vocab):
    gen = torch.Generator().manual_seed(1000 * batch + 10 * num_draft + num_spec_step)
    trees = random_trees(batch, num_draft, vocab, gen, max_depth=max_depth)
    target = agreeing_targets(trees, vocab, agree=0.8, gen=gen)
    want = run(verify_tree_greedy_reference, trees, target, num_spec_step)
    got = run(verify_tree_greedy, trees, target, num_spec_step, backend=backend)
    assert_same(got, want)
    # Every slot of accept_index and accept_token_num is written, and so is every
    # predicts entry on the accepted path (bonus included).
    predicts, accept_index, accept_token_num = got
    assert (accept_index != POISON_INDEX).all() and (accept_token_num >= 0).all()
    on_path = accept_index[accept_index >= 0].long()
    assert (predicts[on_path] != POISON_PREDICT).all()


def chain(tokens: list[int]) -> DraftTrees:
    """One request whose tree is the chain root -> tokens[1] -> tokens[2] -> ..."""
    n = len(tokens)
    next_token = torch.tensor([[*range(1, n), -1]])
    return DraftTrees(
        candidates=torch.tensor([tokens]),
        retrive_index=torch.arange(n)[None],
        retrive_next_token=next_token,
        retrive_next_sibling=torch.full((1, n), -1),
        parent=torch.tensor([[-1, *range(n - 1)]]),
        depth=torch.arange(n)[None],
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_edge_cases(backend):
    trees = chain([7, 1, 2, 3])
    all_agree = torch.tensor([[1, 2, 3, 4]])
    none_agree = torch.tensor([[5, 2, 3, 4]])

    predicts, accept_index, num = run(verify_tree_greedy, trees, all_agree, 4, backend=backend)
    assert num.tolist() == [3] and accept_index.tolist() == [[0, 1, 2, 3]]
    assert predicts.tolist() == [1, 2, 3, 4]  # the last one is the bonus token

    # S + 1 = 3 slots: the walk stops after two drafts even though the third agrees.
    predicts, accept_index, num = run(verify_tree_greedy, trees, all_agree, 3, backend=backend)
    assert num.tolist() == [2] and accept_index.tolist() == [[0, 1, 2]]
    assert predicts.tolist() == [1, 2, 3, POISON_PREDICT]

    predicts, accept_index, num = run(verify_tree_greedy, trees, none_agree, 4, backend=backend)
    assert num.tolist() == [0] and accept_index.tolist() == [[0, -1, -1, -1]]
    assert predicts.tolist() == [5, POISON_PREDICT, POISON_PREDICT, POISON_PREDICT]


@pytest.mark.parametrize("backend", BACKENDS)
def test_later_sibling_is_accepted(backend):
    # root has children 3 -> 1 -> 2 in sibling order (index order differs on purpose).
    trees = DraftTrees(
        candidates=torch.tensor([[0, 11, 12, 13]]),
        retrive_index=torch.arange(4)[None],
        retrive_next_token=torch.tensor([[3, -1, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, 2, -1, 1]]),
        parent=torch.tensor([[-1, 0, 0, 0]]),
        depth=torch.tensor([[0, 1, 1, 1]]),
    )
    target = torch.tensor([[12, 20, 21, 22]])
    predicts, accept_index, num = run(verify_tree_greedy, trees, target, 3, backend=backend)
    assert num.tolist() == [1] and accept_index.tolist() == [[0, 2, -1]]
    assert predicts.tolist() == [12, POISON_PREDICT, 21, POISON_PREDICT]


def test_rejects_wrong_dtype():
    trees = chain([0, 1])
    with pytest.raises(
        TypeError,
        match=r"`target_predict` must be torch\.int64 or torch\.int32; got torch\.float32",
    ):
        run(verify_tree_greedy, trees, torch.tensor([[1.0, 2.0]]), 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int32_tree_tensors_give_the_int64_result(backend):
    trees = chain([0, 1, 2])
    target = torch.tensor([[1, 2, 5]])
    want = run(verify_tree_greedy, trees, target, 3, backend=backend)
    narrow = DraftTrees(**{k: v.to(torch.int32) for k, v in trees.__dict__.items()})
    got = run(verify_tree_greedy, narrow, target.to(torch.int32), 3, backend=backend)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_argmax_ties_go_to_the_lowest_token(backend):
    # The kernel takes target_predict as given; the contract is that the caller's
    # argmax breaks ties towards the lowest id, which torch.argmax does. Tokens 1 and 3
    # tie at the root, and the child drafting 1 is accepted although 3 is tried first.
    trees = DraftTrees(
        candidates=torch.tensor([[0, 3, 1]]),
        retrive_index=torch.arange(3)[None],
        retrive_next_token=torch.tensor([[1, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, 2, -1]]),
        parent=torch.tensor([[-1, 0, 0]]),
        depth=torch.tensor([[0, 1, 1]]),
    )
    logits = torch.tensor([[[0.0, 2.0, 0.0, 2.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]])
    target = logits.argmax(-1)
    predicts, accept_index, num = run(verify_tree_greedy, trees, target, 3, backend=backend)
    assert num.tolist() == [1] and accept_index.tolist() == [[0, 2, -1]]
    assert predicts.tolist() == [1, POISON_PREDICT, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sibling_cycle_ends(backend):
    # A malformed tree whose siblings form a cycle: every path stops after N - 1 visits.
    trees = DraftTrees(
        candidates=torch.tensor([[0, 5, 6]]),
        retrive_index=torch.arange(3)[None],
        retrive_next_token=torch.tensor([[1, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, 2, 1]]),
        parent=torch.tensor([[-1, 0, 0]]),
        depth=torch.tensor([[0, 1, 1]]),
    )
    target = torch.tensor([[9, 9, 9]])
    predicts, accept_index, num = run(verify_tree_greedy, trees, target, 3, backend=backend)
    assert num.tolist() == [0] and accept_index.tolist() == [[0, -1, -1]]
    assert predicts.tolist() == [9, POISON_PREDICT, POISON_PREDICT]


def test_auto_runs_the_host_loop_on_small_cpu_batches():
    from relayc.kernels import _backend

    assert _backend.host_loops("auto", "cpu", 1)
    assert not _backend.host_loops("auto", "cpu", _backend.HOST_LOOP_MAX_BATCH + 1)
    assert not _backend.host_loops("torch", "cpu", 1)
    with _backend.graph_safe_paths():
        assert not _backend.host_loops("auto", "cpu", 1)
    assert _backend.host_loops("auto", "cpu", 1)
