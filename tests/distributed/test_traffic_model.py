"""The performance model's traffic is what a real run moves: for every method of the table, at
2 and 4 ranks, each step's bytes sent and received and messages sent at each rank, as the hook
counts them (PyTorch's hooks: the tensors handed to their all-reduces), equal the model's
(:mod:`terngrad.bench.traffic_model`) — warm-up steps, PowerSGD's plain first steps and the
steps where LocalVarianceAdamW averages its variances included. Local-steps methods are counted
at H = 2 (``traffic_workers.COUNTED_H``): two outer steps, as at their own H, in 4 steps, not
32."""

import pytest
import traffic_workers as w
from ranks import run

from terngrad.bench import perf_model, traffic_model
from terngrad.comm.spec import methods

STEPS = 5  # PowerSGD compresses from step 3; the variances are averaged at steps 1, 2 and 4


@pytest.fixture(scope="module", params=[2, 4])
def counted(request):
    world = request.param
    return world, run(w.counted_steps, world, list(methods.METHODS), STEPS)


@pytest.mark.parametrize("name", list(methods.METHODS))
def test_the_model_predicts_every_step_of_every_method(counted, name):
    world, ranks = counted
    prof = perf_model.profile(w.lenet(), w.SHAPE, "lenet")
    steps = len(ranks[0][name])  # local steps: two outer steps
    for step in range(1, steps + 1):
        predicted = traffic_model.step_traffic(prof, w.counted(name), world, step, w.WARMUP_STEPS)
        for rank, found in enumerate(ranks):
            p = predicted[rank]
            assert (p.sent, p.received, p.messages) == found[name][step - 1], (step, rank)


def test_the_counts_are_not_empty(counted):
    """The comparison means something: every method moved bytes every step (local steps:
    every outer step, nothing between)."""
    _, ranks = counted
    for name, steps in ranks[0].items():
        h = w.counted(name).local_steps
        assert all((c[0] > 0) == ((s + 1) % h == 0) for s, c in enumerate(steps)), name
