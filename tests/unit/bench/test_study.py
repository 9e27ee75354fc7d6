"""``terngrad study``: the measures (variance, bias, angle, zeros, bits), totals over tensors,
kinds of tensors, the report."""

import json
import math

import pytest
import torch
from torch import nn

from terngrad import quantize
from terngrad.bench import study as st
from terngrad.bench.study_report import findings, write_report


def _bell(n=1000, seed=0, tail=0.0):
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    if tail:
        g[: int(n * tail)] *= 8.0  # a few large entries, as real gradients have
    return g


def _mlp_batches(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(20, 4, generator=gen)
    for _ in range(n):
        x = torch.randn(32, 20, generator=gen)
        yield x, (x @ w).argmax(1)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))


METHODS = ["fp16", "terngrad", "terngrad-noclip", "qsgd-3", "linear-3", "orq-3", "signsgd"]


@pytest.fixture(scope="module")
def small_study():
    return st.study(_mlp(), nn.functional.cross_entropy, _mlp_batches(9), steps=8,
                    capture_at=[0, 4, 8], methods=METHODS, draws=4, title="mlp")  # fmt: skip


def test_terngrad_variance_matches_its_formula_and_the_draws():
    g = _bell()
    q = quantize.get("terngrad", clip=None)
    m = st.measure(q, g, draws=2000, seed=1)
    s = g.abs().max()
    exact = float((s * g.abs() - g.square()).sum())  # E(t - g)^2 = s|g| - g^2, element-wise
    assert m.sq_error == pytest.approx(exact, rel=1e-4)
    assert m.sampled_sq_error == pytest.approx(exact, rel=0.03)  # 2000 draws: SE well under 1%
    assert m.zeros == pytest.approx(1 - float((g.abs() / s).mean()), abs=0.01)
    assert m.bits_per_element == 8 * q.message_nbytes(1000) / 1000  # the exact frame
    assert 8 * (1000 // 5) / 1000 == 1.6  # of which payload: base 3, five digits a byte


@pytest.mark.parametrize("method", ["terngrad-noclip", "qsgd-5", "linear-5", "orq-5"])
def test_unbiased_methods_show_no_bias_beyond_the_noise(method):
    name, options = st.check_methods([method])[method]
    m = st.measure(quantize.get(name, **options), _bell(seed=2, tail=0.02), draws=200, seed=3)
    t = st.combine([m])
    assert t.bias <= 3 * t.bias_floor + 1e-3  # the sample mean's own noise removed
    assert t.sampled_normalized_variance == pytest.approx(t.normalized_variance, rel=0.1)


def test_biased_methods_show_their_bias():
    g = _bell(seed=4, tail=0.02)
    sign = st.combine([st.measure(quantize.get("signsgd"), g, draws=8)])
    assert sign.bias > 0.3 and sign.bias_floor == 0.0  # deterministic: one draw, no noise
    clipped = st.combine([st.measure(quantize.get("terngrad"), g, draws=400, seed=5)])
    # E Q(g) = clip(g) exactly, so the bias is the clipping's ‖clip(g) - g‖ / ‖g‖
    sigma = float(g.double().std(unbiased=False))
    expected = float((g.double().clamp(-2.5 * sigma, 2.5 * sigma) - g).norm() / g.double().norm())
    assert clipped.bias == pytest.approx(expected, abs=3 * clipped.bias_floor)
    assert clipped.bias > 5 * clipped.bias_floor


def test_totals_add_tensors_and_fp32_is_exact():
    a, b = _bell(300, seed=6), _bell(700, seed=7) * 0.1
    q = quantize.get("terngrad", clip=None)
    ma, mb = st.measure(q, a, 4), st.measure(q, b, 4)
    t = st.combine([ma, mb])
    assert t.numel == 1000
    assert t.normalized_variance == pytest.approx(
        (ma.sq_error + mb.sq_error) / (ma.sq_norm + mb.sq_norm)
    )
    exact = st.combine([st.measure(quantize.get("fp32"), a, 4)])
    assert exact.normalized_variance == 0.0 and exact.bias == 0.0
    assert exact.angle_degrees == pytest.approx(0.0, abs=1e-3)
    assert exact.bits_per_element > 32  # the frame's header on 300 elements
    g = _bell(seed=8, tail=0.02).double()
    sigma, share, angle = st.clip_effect(g)
    c = g.clamp(-2.5 * sigma, 2.5 * sigma)
    assert sigma == pytest.approx(float(g.std(unbiased=False)))
    assert share == float((g.abs() > 2.5 * sigma).double().mean()) and 0 < share < 0.05
    assert angle == pytest.approx(math.degrees(math.acos(float(c @ g / (c.norm() * g.norm())))))
    assert st.clip_effect(torch.full((10,), 0.5)) == (0.0, 1.0, 90.0)  # σ = 0 wipes it out
    assert st.clip_effect(torch.zeros(10)) == (0.0, 0.0, 0.0)


def test_study_captures_the_steps_and_measures_everything(small_study):
    s = small_study
    assert [c.step for c in s.captures] == [0, 4, 8]
    assert s.layers == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert len(s.measures) == 3 * len(METHODS) * 4
    assert s.captures[-1].loss < s.captures[0].loss  # it trained
    for step in (0, 4, 8):  # clipping lowers TernGrad's variance on every capture
        assert (
            s.total(step, "terngrad").normalized_variance
            <= s.total(step, "terngrad-noclip").normalized_variance
        )


def test_tensor_kinds_group_the_blocks_of_a_transformer_only():
    block = {"ln.weight": (8,), "attn.weight": (24, 8), "mlp.0.weight": (32, 8)}
    shapes = {"token.weight": (10, 8), **{f"blocks.{i}.{k}": s for i in range(3)
                                          for k, s in block.items()}}  # fmt: skip
    kinds = st.tensor_kinds(shapes)
    assert list(kinds) == ["token.weight", "blocks.*.ln.weight", "blocks.*.attn.weight",
                           "blocks.*.mlp.0.weight"]  # fmt: skip
    assert kinds["blocks.*.mlp.0.weight"] == [f"blocks.{i}.mlp.0.weight" for i in range(3)]
    # an nn.Sequential's layers differ in shape: each stays its own kind
    layers = {"0.weight": (64, 20), "0.bias": (64,), "2.weight": (4, 64), "2.bias": (4,)}
    assert list(st.tensor_kinds(layers)) == list(layers)
    # one block holding another tensor breaks the likeness: no grouping
    shapes["blocks.1.extra"] = (3,)
    assert "blocks.*.ln.weight" not in st.tensor_kinds(shapes)


def test_kinds_add_up_to_the_model(small_study):
    s, step = small_study, 8
    norms = {k: s.sq_norm(step, names) for k, names in s.kinds.items()}
    assert sum(norms.values()) == pytest.approx(s.sq_norm(step))
    errors = sum(s.total(step, "terngrad", n).normalized_variance * norms[k]
                 for k, n in s.kinds.items())  # fmt: skip
    assert errors == pytest.approx(s.total(step, "terngrad").normalized_variance * s.sq_norm(step))


def test_study_refuses_bad_input():
    with pytest.raises(ValueError, match="unknown method 'topk'"):
        st.study(_mlp(), nn.functional.cross_entropy, _mlp_batches(3), steps=2, methods=["topk"])
    with pytest.raises(ValueError, match="the study cannot run method powersgd"):
        st.check_methods(["fp16", "powersgd"])
    with pytest.raises(ValueError, match="capture steps must lie"):
        st.study(_mlp(), nn.functional.cross_entropy, _mlp_batches(3), steps=2, capture_at=[5])
    with pytest.raises(ValueError, match="batches ran out at step 3"):
        st.study(_mlp(), nn.functional.cross_entropy, _mlp_batches(3), steps=4, methods=["fp16"])
    with pytest.raises(ValueError, match="draws must be"):
        st.study(_mlp(), nn.functional.cross_entropy, _mlp_batches(3), steps=2, draws=1)


def test_report_has_all_its_parts(small_study, tmp_path):
    html_path = write_report(small_study, tmp_path, "terngrad study --model mlp")
    html = html_path.read_text()
    assert html.count("data:image/png;base64,") == 3  # self-contained: figures embedded
    parts = ("Findings", "Summary at the last step", "Per kind of tensor", "Per tensor",
             "Gradient histograms and clipping", "Over training", "terngrad study")  # fmt: skip
    for part in parts:
        assert part in html
    md = (tmp_path / "report.md").read_text()
    for figure in ("histograms.png", "pareto.png", "over-steps.png"):
        assert f"]({figure})" in md and (tmp_path / figure).stat().st_size > 5_000
    numbers = json.loads((tmp_path / "study.json").read_text())
    assert set(numbers["totals"]) == {"0", "4", "8"}
    assert set(numbers["totals"]["8"]) == set(METHODS)
    facts = findings(small_study)
    assert any("With 3 levels ORQ" in f for f in facts)
    assert any("Clipping at 2.5σ" in f for f in facts)
    ranking = next(f for f in facts if f.startswith("Quantized with terngrad on its own"))
    assert "0.weight" in ranking and "largest share" in ranking
    assert numbers["kinds"] == {n: [n] for n in small_study.layers}
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries
