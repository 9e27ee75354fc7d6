"""terngrad's state in the frameworks' checkpoints, on 2 gloo ranks: a run resumed through the
Hugging Face Trainer (``resume_from_checkpoint``) or Lightning (``ckpt_path``) ends with the
parameters of the run it was saved from, bit for bit — the per-step hook with error feedback,
and local steps (H = 2) with and without overlap (Lightning: with), each checkpoint taken
between two outer steps — and what does not fit is refused in one line."""

from __future__ import annotations

import pytest
import resume_workers as w
from ranks import run


def _resumed_exactly(ranks: list[dict], modes) -> None:
    for name in modes:
        straight = [r[name][0] for r in ranks]
        assert [r[name][1] for r in ranks] == straight, name  # each rank bitwise as straight
        assert len(set(straight)) == 1, name  # one model on every rank


def test_the_trainer_resumes_terngrads_state_exactly(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    ranks = run(w.trainer_resumes, 2, str(tmp_path), timeout=120)
    _resumed_exactly(ranks, w.MODES)
    for r in ranks:
        assert r["hook"][2] == 4  # the hook's counters resumed: 3 saved + 1 after
        said = "saved without local steps and this TernGradCallback trains with"
        assert said in r["other_method"]
        assert "another configuration" in r["other_quantizer"]
        assert "saved by 4 ranks, and 2 resume it" in r["other_world"]
        assert any("holds no terngrad state" in m for m in r["warnings"]), r["warnings"]
        for said in ("other_method", "other_quantizer", "other_world"):
            assert "\n" not in r[said]


def test_lightning_resumes_terngrads_state_exactly(tmp_path):
    pytest.importorskip("lightning")
    ranks = run(w.lightning_resumes, 2, str(tmp_path), timeout=120)
    _resumed_exactly(ranks, w.LIGHTNING_MODES)
    assert all(any("holds no terngrad state" in m for m in r["warnings"]) for r in ranks)
