"""Checkpoint files whole or refused, and metrics cut short by a crash."""

import pytest
import torch

from terngrad.train import checkpoints


def test_checkpoint_files_are_whole_or_refused(tmp_path):
    state = {"format": 2, "step": 3, "weights": torch.arange(10.0)}
    path = checkpoints.path_for(tmp_path, 3)
    checkpoints.save(path, state)
    loaded = checkpoints.load(path)
    assert loaded["step"] == 3 and torch.equal(loaded["weights"], state["weights"])
    raw = path.read_bytes()
    cases = {
        "truncated": raw[: len(raw) // 2],
        "bit-flipped": raw[:-100] + bytes([raw[-100] ^ 0x10]) + raw[-99:],
        "empty": b"",
    }
    for name, data in cases.items():
        bad = tmp_path / f"{name}.pt"
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=r"damaged|not a terngrad"):
            checkpoints.load(bad)
    torch.save(state, tmp_path / "plain.pt")  # a torch file, not ours
    with pytest.raises(ValueError, match="not a terngrad training checkpoint"):
        checkpoints.load(tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="no checkpoint at"):
        checkpoints.load(tmp_path / "missing.pt")
    for step in (5, 7, 9, 11):
        checkpoints.save(checkpoints.path_for(tmp_path, step), state)
    checkpoints.prune(tmp_path, 2)
    assert checkpoints.steps(tmp_path) == [9, 11]
    assert checkpoints.latest(tmp_path) == checkpoints.path_for(tmp_path, 11)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_record_cut_short_by_a_crash_is_dropped_on_resume(tmp_path):
    from terngrad.train.outputs import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 2, "loss": 1.0}\n{"step": 4, "loss": 0.9}\n{"step": 6, "lo')
    truncate_metrics(path, 4)
    assert path.read_text() == '{"step": 2, "loss": 1.0}\n{"step": 4, "loss": 0.9}\n'
