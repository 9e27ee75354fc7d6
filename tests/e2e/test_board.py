"""``terngrad train`` writes TensorBoard event files beside metrics.jsonl
(:mod:`terngrad.train.board`), and a resumed run shows each step once."""

import json

import pytest
from support import SMALL_RUN as RUN

from terngrad.cli import main
from terngrad.train import board, checkpoints

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

EVERY_STEP = {"train/loss", "train/lr", "terngrad/bytes_sent", "terngrad/skipped_steps"}


def test_the_event_files_hold_every_step_once_across_a_resume(tmp_path, finished_run):
    out = finished_run(4, tmp_path / "run")
    checkpoints.path_for(out, 4).unlink()  # killed after step 4's events, before its checkpoint
    assert main([*RUN, "--steps", "4", "--out", str(out)]) == 0  # resumes from step 2
    assert len(list(out.glob(board.EVENTS))) == 2  # one a start
    events = event_accumulator.EventAccumulator(str(out)).Reload()
    scalars = {t: events.Scalars(t) for t in events.Tags()["scalars"]}
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    numbers = {k for k, v in records[0].items() if k != "step" and isinstance(v, int | float)}
    assert set(scalars) == EVERY_STEP | {f"metrics/{k}" for k in numbers}
    for tag in EVERY_STEP:  # the steps the resumed run trained again: shown once
        assert [e.step for e in scalars[tag]] == [1, 2, 3, 4], tag
    assert [e.step for e in scalars["metrics/accuracy"]] == [2, 4]
    assert [e.value for e in scalars["metrics/accuracy"]] == pytest.approx(
        [r["accuracy"] for r in records]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert sum(e.value for e in scalars["terngrad/bytes_sent"]) == summary["bytes_sent_per_rank"]
    assert {e.value for e in scalars["terngrad/skipped_steps"]} == {0}
