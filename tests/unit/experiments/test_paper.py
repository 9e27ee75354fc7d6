"""The paper's experiment definitions and the results table (no training here: see
test_train.py for real runs)."""

import json

from terngrad.experiments import paper
from terngrad.train.config import TrainConfig


def test_lenet_uses_the_papers_settings():
    runs = paper.lenet("out", 10_000, (2, 4)).plan()
    assert [r.label for r in runs] == [
        "fp32-sharded, 2 workers", "terngrad, 2 workers", "fp32-sharded, 4 workers",
        "terngrad, 4 workers",
    ]  # fmt: skip
    for r in runs:
        cfg = r.config
        assert (cfg.model, cfg.dataset, cfg.optimizer, cfg.lr, cfg.momentum) == (
            "lenet", "mnist", "momentum", 0.01, 0.9,
        )  # fmt: skip
        assert cfg.total_batch_size == 64 and cfg.batch_size is None
        assert (cfg.lr_schedule, cfg.weight_decay, cfg.steps) == ("poly", 5e-4, 10_000)
        x = cfg.hook_options
        assert x.quantize_last and x.min_numel == 0  # every layer ternarized
        assert cfg.method.baseline is None  # fp32 through the same sharded exchange
    assert len({r.config.out for r in runs}) == 4


def test_cifar_uses_table_1_settings():
    fp32, tern = (r.config for r in paper.cifar("out", "/data", 1000).plan())
    assert (fp32.model, fp32.dataset, fp32.optimizer, fp32.lr, fp32.batch_size) == (
        "cifarnet", "cifar10", "adam", 2e-4, 64,
    )  # fmt: skip
    assert (fp32.workers, fp32.method.name, tern.method.name) == (
        2,
        "fp32-sharded",
        "terngrad",
    )
    assert not tern.hook_options.quantize_last  # the hook's defaults: the last layer in fp32
    assert paper.fashion("out", None, 10).plan()[0].config.dataset == "fashion"


def test_results_table_and_plot(tmp_path):
    experiment = paper.lenet(str(tmp_path), 4, (2,))
    runs = experiment.plan()
    summaries = []
    for i, r in enumerate(runs):
        folder = tmp_path / r.config.out
        folder.mkdir(parents=True, exist_ok=True)
        metrics = [{"step": s, "loss": 1.0 / s, "accuracy": 0.5 + 0.1 * s} for s in (2, 4)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
        summaries.append({
            "accuracy": 0.9 + i / 100,
            "best_accuracy": 0.95,
            "bytes_sent_per_step": 1000.0 / (1 + 15 * i),
            "seconds": 12.0,
        })  # fmt: skip
    text = experiment.report(runs, summaries, tmp_path)
    assert "| terngrad, 2 workers | 91.00% | 95.00% | 62 | 16.0x | 12 |" in text
    assert "| fp32-sharded, 2 workers | 90.00% |" in text
    assert "99.1–99.35%" in text  # the paper's figure beside ours
    assert "every tensor ternarized" in text
    assert (tmp_path / "results.md").read_text() == text
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == {r.label: s for r, s in zip(runs, summaries, strict=True)}


def test_demo_is_lenet_fp32_against_terngrad_on_4_workers():
    runs = paper.demo("out", 50).plan()
    assert [r.config.hook_options.quantizer for r in runs] == ["fp32", "terngrad"]
    assert all(isinstance(r.config, TrainConfig) and r.config.workers == 4 for r in runs)
    assert all(r.config.steps == 50 for r in runs)
