"""The GPT trained for real: 2 workers with TernGrad report bits per character, and a two-method
``terngrad reproduce transformer`` writes its table and reads finished runs back."""

import json
import math

import pytest
from support import REPO, write_corpus

from terngrad.cli import main
from terngrad.train import data, models, schedule


def test_two_workers_train_the_gpt_with_terngrad_and_report_bits_per_char(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    docs = sorted(REPO.glob("docs/**/*.md"))  # real English: our own docs
    corpus.mkdir()
    for i, doc in enumerate(docs[:20]):
        (corpus / f"{i:02d}.txt").write_text(doc.read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "--model", "gpt", "--data-dir", str(corpus), "--workers", "2", "--quiet",
            "--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.1", "--lr-schedule",
            "cosine", "--warmup-steps", "2", "--batch-size", "4", "--steps", "6",
            "--eval-every", "3", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "bits/char after 6 steps" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6]
    for r in records:
        assert r["bits_per_char"] == pytest.approx(r["loss"] / math.log(2), rel=1e-12)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["dataset"] == "pydoc"  # the language model's default data set
    assert summary["bits_per_char"] == records[-1]["bits_per_char"]
    vocabulary = data.load("pydoc", corpus, context=128).num_classes
    assert records[-1]["loss"] < math.log(vocabulary)  # below a uniform guess: it learns
    # TernGrad's defaults: the head (vocabulary x 256 + bias) in fp32, the rest at 2 bits
    net = models.build("gpt", None, vocabulary)
    fp32_bytes = 4 * sum(p.numel() for p in net.parameters())
    assert summary["bytes_sent_per_step"] < fp32_bytes / 8
    lrs = [r["lr"] for r in records]  # steps 3 and 6 (0-based 2 and 5) of warm-up 2 + cosine 4
    f = schedule.lr_factor("cosine", steps=6, power=0.5, warmup=2)
    assert lrs == pytest.approx([1e-3 * f(2), 1e-3 * f(5)], rel=1e-12)


@pytest.mark.slow  # a whole experiment: make test-slow
def test_a_two_method_reproduction_writes_the_table_and_reads_back(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, files=20, extra={i: (f"Line {i} of the corpus, about TernGrad. " * 40)
                                    for i in range(20)})  # fmt: skip
    out = tmp_path / "tf"
    argv = [
        "reproduce",
        "transformer",
        "--methods",
        "fp32",
        "terngrad-warmup0.2",
        "--steps",
        "4",
        "--workers",
        "2",
        "--eval-every",
        "2",
        "--data-dir",
        str(corpus),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "[2/2] terngrad-warmup0.2 seed 0: validation" in printed
    results = json.loads((out / "results.json").read_text())
    fp32, tern = results["runs"]
    assert [s for s, _ in tern["curve"]] == [2, 4]
    assert tern["bits_per_char"] == pytest.approx(tern["loss"] / math.log(2))
    # fp32: the ring all-reduce of the gradient, 2 (N-1)/N = 1 times its bytes for 2 workers
    vocabulary = data.load("pydoc", corpus, context=128).num_classes
    gradient = 4 * sum(p.numel() for p in models.build("gpt", None, vocabulary).parameters())
    assert fp32["bytes_per_step"] == gradient
    # terngrad-warmup0.2: its first fifth (0 of 4 steps: at least 1, so 1) in fp32, then ternary
    assert results["settings"]["steps"] == 4
    assert gradient / 4 < tern["bytes_per_step"] < gradient
    table = (out / "results.md").read_text()
    assert "| fp32 |" in table and "| terngrad-warmup0.2 |" in table and "within 2%, ≥10x" in table
    assert (out / "curves.png").stat().st_size > 10_000
    assert (out / "tradeoff.png").stat().st_size > 10_000
    from terngrad.experiments import comparison

    monkeypatch.setattr(comparison, "launch", lambda cfg: pytest.fail("retrained"))
    assert main(argv) == 0
    assert "(done before)" in capsys.readouterr().out


def test_local_adamw_through_the_trainer_resumes_bitwise(tmp_path, capsys):
    """``--method terngrad-b512-ef-localvar2`` (AdamW's variance each rank's own) on 2
    workers: a run stopped at step 4 (its checkpoint holds each rank's own variance in the
    hook states) and extended to 6 ends with the same weights,
    bit for bit, as a straight 6-step run; bytes include the variance's shares."""
    corpus = tmp_path / "corpus"
    write_corpus(corpus, files=20, extra={i: (f"Line {i} of the corpus, about TernGrad. " * 40)
                                    for i in range(20)})  # fmt: skip

    def argv(out, steps):
        return ["train", "--model", "gpt-small", "--data-dir", str(corpus), "--workers", "2",
                "--quiet", "--method", "terngrad-b512-ef-localvar2", "--optimizer", "adamw",
                "--lr", "1e-3", "--batch-size", "2",
                "--steps", str(steps), "--eval-every", "2", "--out", str(out)]  # fmt: skip

    import torch

    from terngrad.train import checkpoints

    assert main(argv(tmp_path / "straight", 6)) == 0
    assert main(argv(tmp_path / "resumed", 4)) == 0
    assert main(argv(tmp_path / "resumed", 6)) == 0
    capsys.readouterr()
    a = checkpoints.read_training_checkpoint(checkpoints.latest(tmp_path / "straight"))
    b = checkpoints.read_training_checkpoint(checkpoints.latest(tmp_path / "resumed"))
    assert a["step"] == b["step"] == 6
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    own = [h["local_variance"]["variances"] for h in a["hook_states"]]
    assert set(own[0]) == set(own[1]) and not torch.equal(*(o["head.weight"] for o in own))
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["config"]["method"] == summary["method"] == "terngrad-b512-ef-localvar2"
    assert summary["config"]["method_settings"]["recipe"] == "localvar2"
