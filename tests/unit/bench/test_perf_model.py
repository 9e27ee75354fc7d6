"""The performance model's formulas, its calibration round trip, the auto policy's rule, and
the ``terngrad model`` commands."""

import json
import math

import pytest
import torch
from torch import nn

from terngrad import quantize
from terngrad.bench import perf_model as M
from terngrad.bench import scaling, traffic_model, validation
from terngrad.cli import main
from terngrad.comm.exchanges.traffic import grid_traffic, ring_bytes
from terngrad.comm.rank.policy import Estimate, decide
from terngrad.quantize import Layout


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)  # 8x8x8 outputs of 27 MACs each
        self.fc1 = nn.Linear(512, 600)
        self.fc2 = nn.Linear(600, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(torch.relu(self.conv(x)).flatten(1))))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return M.profile(Tiny(), (3, 8, 8), "tiny")


def _one_bucket(numel, ready):
    return M.Profile("one", (M.Param("w", (numel,), ready, False),), 1.0)


def _summary(prof, bandwidth, rate, host, kappas, compute=1.5):
    cluster = M.Cluster(4, rate, host)
    return {
        "ranks": 4, "bandwidth": bandwidth, "model": prof.model, "compute_seconds": compute,
        "link_probe": {"bytes_per_second": rate},
        "methods": [
            {"method": m, "step_seconds": M.predict(prof, m, cluster, compute, k).seconds}
            for m, k in kappas.items()
        ],
    }  # fmt: skip


def test_profile_counts_flops_and_orders_gradients_as_backward_makes_them(tiny):
    conv, fc1, fc2 = 2 * 512 * 27, 2 * 600 * 512, 2 * 10 * 600
    assert tiny.forward_flops == conv + fc1 + fc2
    names = [p.name for p in tiny.params]
    assert names[:2] == ["fc2.bias", "fc2.weight"] and names[-2:] == ["conv.bias", "conv.weight"]
    ready = {p.name: p.ready for p in tiny.params}
    total = conv + fc1 + fc2
    assert ready["fc2.weight"] == pytest.approx(fc2 / total)
    assert ready["fc1.weight"] == pytest.approx((fc2 + fc1) / total)
    assert ready["conv.weight"] == pytest.approx(1.0)
    assert {p.name for p in tiny.params if p.last_layer} == {"fc2.weight", "fc2.bias"}
    assert tiny.numel == sum(p.numel() for p in Tiny().parameters())


def test_buckets_follow_ddp_caps(tiny):
    # caps in bytes of fp32: first 4 kB (fc2's 6,010 elements overflow it), then 8 kB
    buckets = tiny.buckets(cap_bytes=8_000, first_cap_bytes=4_000)
    assert [[p.name for p in b] for b in buckets] == [
        ["fc2.bias", "fc2.weight"],
        ["fc1.bias", "fc1.weight"],
        ["conv.bias", "conv.weight"],
    ]
    # DDP's defaults: the first bucket closes past 1 MiB (after fc1's 307k elements)
    assert [len(b) for b in tiny.buckets()] == [4, 2]


def _busiest(prof, method, world):
    """Per transfer, the most bytes on any rank's critical path."""
    return [max(r.path for r in t.ranks) for t in traffic_model.transfers(prof, method, world)]


def test_traffic_of_each_method(tiny):
    n, world = tiny.numel, 4
    assert sum(_busiest(tiny, "fp32", world)) == 2 * 3 * 4 * n // 4  # a ring all-reduce a bucket
    fp16 = traffic_model.transfers(tiny, "fp16", world)
    assert sum(max(r.path for r in t.ranks) for t in fp16) == 2 * 3 * 2 * n // 4
    assert sum(t.codec_elements for t in fp16) == n
    # PowerSGD rank 2 compresses n x m when 2 (n + m) 2 < n m: fc1 (600 x 512), fc2 (10 x 600)
    # and conv (8 x 27: 140 < 216); biases are all-reduced as they are
    (psgd,) = traffic_model.transfers(tiny, "powersgd", world)
    p_side, q_side, plain = (600 + 10 + 8) * 2, (512 + 600 + 27) * 2, 600 + 10 + 8
    expected = sum(ring_bytes(4 * k, world) for k in (plain, p_side, q_side))
    assert (psgd.ranks[0].path, psgd.ranks[0].messages) == (expected, 3 * 2 * (world - 1))
    # rank 8 compresses fc1 alone: fc2 (610 x 8 x 2 >= 6000) and conv (35 x 8 x 2 >= 216) not
    (psgd8,) = traffic_model.transfers(tiny, "powersgd-r8", world)
    plain8 = 600 + 10 + 8 + 10 * 600 + 8 * 27
    expected = sum(ring_bytes(4 * k, world) for k in (plain8, 600 * 8, 512 * 8))
    assert psgd8.ranks[0].path == expected
    # its first steps: a plain all-reduce
    (first,) = traffic_model.transfers(tiny, "powersgd", world, step=1)
    assert first.ranks[0].sent == ring_bytes(4 * n, world)
    # the hook: last layer and tensors under 1024 elements deferred to one fp32 all-reduce at
    # the end; fc1.weight on the grid with its bucket
    kept = 10 + 6000 + 600 + 8 + 216
    grid = grid_traffic("sharded", 600 * 512, 1, world, 1)
    assert _busiest(tiny, "terngrad", world) == [
        max(t.path for t in grid),
        ring_bytes(4 * kept, world),
    ]
    root = grid_traffic("ps", 600 * 512, 1, world, 1)[0]
    # the server's link: it receives N-1 frames, then sends N-1 sums
    assert _busiest(tiny, "terngrad-ps", world)[0] == root.path
    assert root.path == root.sent + root.received - ring_bytes(4 * 2, world)
    q = quantize.get("qsgd", levels=5)
    n_scales = Layout.of(600 * 512, [600 * 512], q.bucket_size).n_buckets
    qgrid = grid_traffic("sharded", 600 * 512, n_scales, world, q.m)
    assert _busiest(tiny, "qsgd-5", world)[0] == max(t.path for t in qgrid)
    # own scales: one all-gather of each rank's message (and a flag byte), no scale round
    own = traffic_model.transfers(tiny, "terngrad-own-scales", world)[0].ranks[0]
    message = quantize.get("terngrad").message_nbytes(600 * 512, (600 * 512,)) + 1
    assert (own.sent, own.messages) == (3 * message, 3)
    # fused: one exchange of the step's buckets, the deferred all-reduce after it
    assert len(traffic_model.transfers(tiny, "terngrad-own-scales-fused", world)) == 2
    # local steps: nothing between outer steps; the outer step weighs 1/H in a steady step
    assert traffic_model.transfers(tiny, "terngrad-ef-local16", world, step=3) == []
    outer = traffic_model.transfers(tiny, "terngrad-ef-local16", world)
    assert {t.weight for t in outer} == {1 / 16}
    assert traffic_model.transfers(tiny, "terngrad-ef-local16", world, step=16)[0].weight == 1
    # in the step: the grid with fc1's bucket, then the deferred fp32 all-reduce at the end
    slow = M.Cluster(world, bytes_per_s=1e6, shared_cores=False)
    step = M.predict(tiny, "terngrad", slow, 1.0)
    deferred = ring_bytes(4 * kept, world)
    assert step.busiest_bytes == max(t.path for t in grid) + deferred
    ready = next(p.ready for p in tiny.params if p.name == "fc1.weight")
    grid_done = 1 / 3 + ready * 2 / 3 + max(t.path for t in grid) / 1e6
    assert step.seconds == pytest.approx(max(grid_done, 1.0) + deferred / 1e6)
    with pytest.raises(ValueError, match="unknown method 'top-k'"):
        M.method("top-k")


def test_step_time_formulas():
    world, n = 4, 1_000_000
    wire = ring_bytes(4 * n, world)
    cluster = M.Cluster(world, bytes_per_s=1e8, shared_cores=False)
    # the only bucket is ready at the end of backward: nothing overlaps
    step = M.predict(_one_bucket(n, 1.0), "fp32", cluster, 2.0)
    assert step.seconds == pytest.approx(2.0 + wire / 1e8)
    # ready right after the forward pass: communication overlaps the backward pass
    step = M.predict(_one_bucket(n, 0.0), "fp32", cluster, 2.0)
    assert step.seconds == pytest.approx(max(2.0, 2.0 / 3 + wire / 1e8))
    fast = M.Cluster(world, bytes_per_s=1e12, shared_cores=False)
    assert M.predict(_one_bucket(n, 0.0), "fp32", fast, 2.0).seconds == 2.0
    # codec and latency add to the bucket's time
    half = ring_bytes(2 * n, world)
    wire = half / 1e8 + 6e-3  # 6 messages of 1 ms
    own = M.Cluster(world, 1e8, 1e9, 1e-3, shared_cores=False)
    step = M.predict(_one_bucket(n, 0.0), "fp16", own, 2.0, codec_seconds_per_element=1e-7)
    assert step.pipeline_seconds == pytest.approx(max(2.0, 2.0 / 3 + 0.1 + wire))
    # shared cores: codec and backward share the CPU while both run (each at half speed);
    # 0.1 s of codec then stretches the step to 2.1 s, and the sum C + codec + bytes/H bounds it
    shared = M.Cluster(world, 1e8, 1e9, 1e-3, shared_cores=True)
    step = M.predict(_one_bucket(n, 0.0), "fp16", shared, 2.0, codec_seconds_per_element=1e-7)
    assert step.pipeline_seconds == pytest.approx(2.1)
    assert step.busy_seconds == pytest.approx(2.0 + 0.1 + half / 1e9)
    assert step.seconds == max(step.pipeline_seconds, step.busy_seconds)
    # 3 s of codec: half speed until backward's remaining 4/3 s of work is done (8/3 s), then
    # the remaining 5/3 s alone, then the wire: 2/3 + 8/3 + 5/3 + wire
    step = M.predict(_one_bucket(n, 0.0), "fp16", shared, 2.0, codec_seconds_per_element=3e-6)
    assert step.pipeline_seconds == pytest.approx(5.0 + wire)
    assert M.predict(_one_bucket(n, 0.0), "fp32", M.Cluster(1), 2.0).seconds == 2.0
    with pytest.raises(ValueError, match="workers must be at least 1"):
        M.Cluster(0)


def test_calibration_recovers_the_inputs_and_validation_predicts_shaped_runs():
    torch.manual_seed(0)
    prof = M.profile(nn.Sequential(nn.Linear(1000, 2000), nn.Linear(2000, 10)), (1000,), "mlp2")
    truth = {"fp32": 0.0, "fp16": 2e-8, "terngrad": 5e-8}
    calib = validation.calibrate(_summary(prof, "unlimited", math.inf, 3e8, truth), prof)
    assert calib.host_bytes_per_s == pytest.approx(3e8, rel=1e-6)
    for name, kappa in truth.items():
        assert calib.codec_seconds_per_element[name] == pytest.approx(kappa, rel=1e-6, abs=1e-15)
    shaped = _summary(prof, "1gbit", 1.2e8, 3e8, truth, compute=1.4)
    checks = validation.validate(calib, [shaped], prof)
    assert [c.method for c in checks] == list(truth)
    assert all(abs(c.error) < 1e-6 for c in checks)
    table = validation.validation_table(calib, checks)
    assert "| 1gbit | terngrad |" in table and "largest error: 0.0%" in table
    with pytest.raises(ValueError, match="unshaped links"):
        validation.calibrate(shaped, prof)
    del shaped["link_probe"]
    with pytest.raises(ValueError, match="no link probe"):
        validation.validate(calib, [shaped], prof)


def test_scaling_is_linear_without_communication_cost(tiny):
    gpu = scaling.Accelerator(flops_per_s=1e9, batch_size=32, codec_elements_per_s=1e30)
    free = scaling.Network("free", 1e30, 0.0)
    per = scaling.scaling(tiny, ["fp32", "terngrad"], [8, 64], free, gpu)
    one = 32 / gpu.compute_seconds(tiny)
    for ys in per.values():
        assert ys == pytest.approx([8 * one, 64 * one])
    slow = scaling.scaling(tiny, ["fp32", "terngrad"], [8], scaling.NETWORKS["1gbe"], gpu)
    assert slow["terngrad"][0] > slow["fp32"][0]  # on 1 Gb Ethernet the fewer bytes win


def test_auto_policy_rule():
    layout = Layout.of(10_000_000, [10_000_000], None)
    gigabit = Estimate(125e6, 50e-6, 1e-3, 2e-9)
    d = decide(gigabit, "sharded", layout, 4, 1)
    assert d.quantize  # 10M elements at 1 Gbit/s: 240 ms of fp32 ring against ~60 ms
    assert d.fp32_seconds == pytest.approx(ring_bytes(4 * 10_000_000, 4) / 125e6 + 6 * 50e-6)
    small = Layout.of(5_000, [5_000], None)
    assert not decide(gigabit, "sharded", small, 4, 1).quantize  # the 1 ms per call dominates
    infinite = Estimate(1e15, 0.0, 1e-3, 2e-9)
    assert not decide(infinite, "sharded", layout, 4, 1).quantize  # the codec costs more
    assert not decide(gigabit, "sharded", Layout.of(0, [], None), 4, 1).quantize
    assert not decide(gigabit, "sharded", layout, 1, 1).quantize  # one rank: nothing to send


def test_model_commands(tmp_path, capsys):
    torch.manual_seed(0)
    prof = M.profile_model("lenet")
    truth = {"fp32": 0.0, "fp16": 2e-8, "terngrad": 5e-8}
    files = []
    for bw, rate in (("unlimited", math.inf), ("1gbit", 1.2e8)):
        path = tmp_path / f"{bw}.json"
        path.write_text(json.dumps(_summary(prof, bw, rate, 3e8, truth)))
        files.append(str(path))
    out = tmp_path / "validation"
    assert main(["perf-model", "validate", "--calibrate", files[0], "--runs", files[1],
                 "--out", str(out)]) == 0  # fmt: skip
    saved = json.loads((out / "validation.json").read_text())
    assert [c["method"] for c in saved["checks"]] == list(truth)
    assert "| 1gbit | fp16 |" in (out / "validation.md").read_text()
    assert main(["model", "scale", "--models", "lenet", "--worker-counts", "2", "8",
                 "--out", str(tmp_path / "scale")]) == 0  # fmt: skip
    assert "terngrad model scale is now terngrad perf-model scale" in capsys.readouterr().err
    scaled = json.loads((tmp_path / "scale" / "scaling.json").read_text())
    assert set(scaled["images_per_second"]) == set(scaling.NETWORKS)
    assert (tmp_path / "scale" / "scaling.png").stat().st_size > 10_000
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        missing = str(tmp_path / "missing.json")
        main(["perf-model", "validate", "--calibrate", missing, "--runs", files[1]])
    assert exc.value.code == 2
    assert f"no results file at {missing}" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "perf-model",
                "validate",
                "--calibrate",
                str(tmp_path / "bad.json"),
                "--runs",
                files[1],
            ]
        )
    assert "not the results.json" in capsys.readouterr().err
