"""The one comparison runner, with a stand-in for training (no process started): every run is
checked before the first trains, runs train in order, a finished one is read back, and a report
of unfinished runs is refused."""

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from terngrad.comm.spec import methods
from terngrad.experiments import comparison
from terngrad.experiments.comparison import Comparison, Run
from terngrad.train import outputs, run_folder
from terngrad.train.config import TrainConfig


@dataclass(frozen=True)
class _Tiny(Comparison):
    base: TrainConfig
    names: tuple[str, ...] = ("fp32", "terngrad")
    title = "tiny"

    def plan(self):
        return [
            Run(m.name, self.base.replace(method=m, out=str(Path(self.base.out) / m.name)), m.name)
            for m in methods.select(self.names)
        ]

    def report(self, runs, summaries, out):
        text = "\n".join(
            f"{r.method}: {s['accuracy']}" for r, s in zip(runs, summaries, strict=True)
        )
        (out / "results.md").write_text(text)
        return text


def _fake_training(trained):
    @contextlib.contextmanager
    def session(self, runs, echo):
        def train(r):
            trained.append(r.method)
            summary = {"accuracy": 0.5 + len(trained) / 10, "best_accuracy": 0.9,
                       "config": r.config.to_dict()}  # fmt: skip
            Path(r.config.out).mkdir(parents=True)
            run_folder.write_run_config(r.config)  # the folder is the run's, as launch marks it
            (Path(r.config.out) / outputs.SUMMARY).write_text(json.dumps(summary))
            return summary

        yield train

    return session


def test_plan_check_train_each_then_read_back(tmp_path, monkeypatch):
    trained: list[str] = []
    monkeypatch.setattr(_Tiny, "session", _fake_training(trained))
    tiny = _Tiny(TrainConfig(out=str(tmp_path), model="mlp", dataset="synthetic", workers=2))
    lines: list[str] = []
    text = comparison.run(tiny, tmp_path, echo=lines.append)
    assert trained == ["fp32", "terngrad"] and text == "fp32: 0.6\nterngrad: 0.7"
    assert lines[0] == f"tiny: 2 runs into {tmp_path}/"
    assert lines[2].startswith("[2/2] terngrad: final 70.00%, best 90.00% (")
    lines.clear()
    assert comparison.run(tiny, tmp_path, echo=lines.append) == text  # read back, not trained
    assert trained == ["fp32", "terngrad"] and all("(done before)" in x for x in lines[1:])
    assert comparison.report_only(tiny, tmp_path) == text
    other = _Tiny(tiny.base.replace(lr=0.5))  # other settings: not the finished runs
    with pytest.raises(ValueError, match=r"fp32 has not finished in .* with these settings"):
        comparison.report_only(other, tmp_path)


def test_every_run_is_checked_before_the_first_trains(tmp_path, monkeypatch):
    trained: list[str] = []
    monkeypatch.setattr(_Tiny, "session", _fake_training(trained))
    blocker = tmp_path / "terngrad"
    blocker.write_text("not a folder")  # the second run's folder
    tiny = _Tiny(TrainConfig(out=str(tmp_path), model="mlp", dataset="synthetic", workers=2))
    with pytest.raises(ValueError, match="exists and is not a folder"):
        comparison.run(tiny, tmp_path, echo=lambda _: None)
    assert trained == []
    twice = _Tiny(tiny.base, ("qsgd", "qsgd-5"))
    with pytest.raises(ValueError, match="methods given twice"):
        comparison.run(twice, tmp_path, echo=lambda _: None)


def test_bytes_per_step_counts_the_ring_for_pytorchs_all_reduce():
    cfg = TrainConfig(out="x", model="mlp", dataset="synthetic", workers=4, method="fp16")
    d = comparison.gradient_numel(cfg)
    assert comparison.bytes_per_step(cfg, {"bytes_sent_per_step": None}) == 2 * 3 * 2 * d / 4
    assert (
        comparison.bytes_per_step(cfg.replace(method="terngrad"), {"bytes_sent_per_step": 7}) == 7
    )
    assert comparison.bytes_per_step(cfg.replace(method="powersgd"), {}) is None
    assert comparison.spread([0.5, 0.7], 1, 100) == "60.0 ± 14.1"
