"""Rank 0's progress: a tqdm bar on a terminal, the plain line elsewhere; and without the
tensorboard package a run says once that it writes no event files."""

import io
import re
import sys

from terngrad.train import board
from terngrad.train.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(stream):
    progress = Progress(4, start=1, stream=stream)
    for step in (2, 3, 4):
        progress.update(step, 2.5, 0.25, 3_000_000)
    progress.note("step 4: test accuracy 25.00%")
    progress.close()
    return stream.getvalue()


def test_a_log_gets_the_plain_line_at_the_end():
    lines = _run(io.StringIO()).splitlines()
    assert lines[0] == "step 4: test accuracy 25.00%"
    assert re.fullmatch(
        r"\[#{24}\] 4/4 loss 2\.5000 acc 25\.00% sent +3\.00 MB +[\d.]+ step/s  eta +0s", lines[1]
    )
    assert len(lines) == 2


def test_a_terminal_gets_a_tqdm_bar_with_the_events_above_it():
    drawn = _run(Terminal())
    assert "4/4" in drawn and "loss 2.5000 acc 25.00% sent 3.00 MB" in drawn
    assert "step 4: test accuracy 25.00%\n" in drawn
    assert "[####" not in drawn  # not the log's line


def test_without_tensorboard_a_run_says_once_how_to_get_event_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    quiet = board.Board.open(tmp_path, 0, None)
    quiet.step(1, 2.5, 0.1, None)
    quiet.evaluation({"step": 1, "loss": 2.5})
    quiet.close()
    err = capsys.readouterr().err
    assert err == board.MISSING + "\n"
    assert "pip install 'terngrad[tensorboard]'" in err
    assert list(tmp_path.iterdir()) == []
