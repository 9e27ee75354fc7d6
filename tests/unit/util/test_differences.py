"""``same``, the one equality under the renderer of differences: settings with NaN equal to NaN,
tensors bit for bit (what the launcher holds the ranks' shared local-steps state to)."""

import math

import torch

from terngrad.util.differences import same


def test_settings_and_tensors_compare_as_the_callers_need():
    assert same({"lr": math.nan, "groups": [1, (2, 3)]}, {"lr": math.nan, "groups": [1, (2, 3)]})
    assert not same({"lr": 0.7}, {"lr": 0.71})
    t = torch.tensor([1.0, float("nan"), -0.0])
    assert same([t], [t.clone()])  # the same bits, NaN included
    assert not same(t, torch.tensor([1.0, float("nan"), 0.0]))  # -0.0 is not +0.0 bit for bit
    assert not same(t, t.double())  # another dtype
    assert not same(t, t.reshape(3, 1))  # another shape
    assert not same(t, [1.0, math.nan, -0.0])  # a tensor is not a list
    assert same({"a": [torch.ones(2, 2)[:, 0]]}, {"a": [torch.ones(2)]})  # a strided view too
