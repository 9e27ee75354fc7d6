"""DiLoCo across nodes of several ranks (2 nodes of 2 gloo ranks): DDP keeps each node's
replica in step inside the node, the outer exchange runs across nodes with each parameter
crossing once per node, every rank of every node holds the same anchor after each outer step,
and the outer step is DiLoCo's on the mean of the nodes' pseudo-gradients."""

import diloco_workers
import nodes_workers as w
import pytest
import torch
from ranks import run

from terngrad.comm.front.nodes import shares
from terngrad.util.differences import same

STEPS, H, WORLD, PER_NODE = 8, 4, 4, 2


@pytest.fixture(scope="module")
def ternary():
    return run(w.train, WORLD, STEPS, H, {}, PER_NODE)


def test_a_node_is_one_replica_and_every_rank_meets_at_the_outer_step(ternary):
    ranks = ternary
    for step in range(STEPS):
        outer = (step + 1) % H == 0
        assert [r["outer"][step] for r in ranks] == [outer] * WORLD
        # inside a node, DDP: the same parameters after every step (the batch-norm statistics
        # are each rank's own until the outer step, as DDP leaves them)
        n = len(list(w.model().parameters()))
        for a, b in ((0, 1), (2, 3)):
            assert same(ranks[a]["params"][step][:n], ranks[b]["params"][step][:n]), step
        # across nodes: apart between outer steps; after one, every rank holds the same
        # parameters and buffers
        assert same(ranks[0]["params"][step][:n], ranks[2]["params"][step][:n]) == outer, step
        if outer:
            assert all(same(ranks[0]["params"][step], r["params"][step]) for r in ranks[1:])
    assert all(same(ranks[0]["final"], r["final"]) for r in ranks[1:])


def test_each_parameter_crosses_the_slow_link_once_per_node(ternary):
    """The node's ranks share the parameters out: what a node sends across is what one rank
    of a flat 2-rank DiLoCo sends (the same tensors, the same exchange), and the shares stay
    inside the node."""
    flat = run(diloco_workers.train, 2, STEPS, H, {})
    node = sum(r["stats"].bytes_sent for r in ternary[:PER_NODE])
    assert node == flat[0]["stats"].bytes_sent > 0
    assert all(r["stats"].node_bytes_sent > 0 for r in ternary)
    assert all(r["stats"].outer_steps == STEPS // H for r in ternary)


def test_the_outer_step_is_nesterov_sgd_on_the_mean_of_the_nodes_pseudo_gradients():
    """fp32 outer gradients: the anchor moves as SGD with Nesterov momentum along the mean over
    the nodes of anchor − the node's replica, written out here."""
    ranks = run(w.train, WORLD, 2 * H, H, {"quantizer": "fp32", "topology": "allgather"},
                PER_NODE)  # fmt: skip
    anchor = [p.detach().clone() for p in w.model().parameters()]
    momentum = [torch.zeros_like(a) for a in anchor]
    n = len(anchor)
    for k in range(2):
        replicas = [ranks[r]["before_outer"][k][:n] for r in (0, 2)]  # one rank per node
        for i, a in enumerate(anchor):
            delta = sum(a - rep[i] for rep in replicas) / 2
            momentum[i] = 0.9 * momentum[i] + delta
            a -= 0.7 * (delta + 0.9 * momentum[i])
        after = ranks[3]["params"][(k + 1) * H - 1][:n]
        for a, p in zip(anchor, after, strict=True):
            assert torch.allclose(a, p, rtol=1e-5, atol=1e-6), k


def test_overlap_across_nodes_ends_with_one_model():
    ranks = run(w.train, WORLD, STEPS, H, {"overlap": True}, PER_NODE)
    assert all(same(ranks[0]["final"], r["final"]) for r in ranks[1:])
    assert all(r["stats"].outer_steps == STEPS // H for r in ranks)


def test_nodes_of_unequal_size_are_refused_in_one_line_on_every_rank():
    said = run(w.unequal_nodes, WORLD)
    assert (
        said
        == [
            "terngrad: the nodes of DiLoCo across nodes: nodes of unequal size (1, 3 ranks): give "
            "every node as many ranks"
        ]
        * WORLD
    )


def test_a_model_that_is_not_what_across_nodes_says_is_refused():
    said = run(w.mismatched, WORLD)[0]
    assert said[0].startswith("this DDP model trains over 2 of the 4 ranks: give DiLoCo "
                              "across_nodes=True")  # fmt: skip
    assert said[1].startswith("DiLoCo across nodes trains each node as one replica: give it a "
                              "DDP model over the ranks of one node")  # fmt: skip


def test_the_shares_balance_the_elements_the_largest_first():
    assert shares([10, 100, 30, 80], 2) == [0, 0, 1, 1]
    assert shares([5, 5, 5], 3) == [0, 1, 2]
    owner = shares([1000, 10, 10, 10, 990], 2)
    load = [sum(s for s, o in zip([1000, 10, 10, 10, 990], owner, strict=True) if o == p)
            for p in (0, 1)]  # fmt: skip
    assert load == [1010, 1010]
