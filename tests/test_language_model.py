"""The language-model path: the character corpus split by whole files, its windows, the GPT,
AdamW with warm-up and cosine decay, and a real 2-worker TernGrad run that reports bits per
character. Python's documentation sources (Debian's python3-doc) are read only by the one test
that is skipped without them; the others make their corpus from files written here."""

import json
import math
from pathlib import Path

import pytest
import torch

from terngrad.cli import main
from terngrad.comm import Options
from terngrad.train import data, models, schedule, text
from terngrad.train.config import TrainConfig
from terngrad.train.setup import make_optimizer

CONTEXT = 16


def _corpus(folder: Path, files: int = 20, extra: dict[int, str] | None = None) -> list[str]:
    """``files`` text files ``f00.txt`` ... in ``folder`` (file ``i``'s text ``extra[i]`` where
    given); returns their texts in order."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for i in range(files):
        body = (extra or {}).get(i, f"File {i:02d} says: the quick brown fox jumps. " * 4)
        (folder / f"f{i:02d}.txt").write_text(body, encoding="utf-8")
        texts.append(body if body.endswith("\n") else body + "\n")
    return texts


def test_whole_files_are_held_out_and_the_streams_are_their_text(tmp_path):
    held = {9: "File 10 says: the quick fox jumps \u03bb.\n", 19: "the brown fox jumps. " * 9}
    texts = _corpus(tmp_path / "c", extra=held)  # of the held-out characters only the lambda
    # is not in the training text
    (tmp_path / "c" / "sub").mkdir()
    (tmp_path / "c" / "sub" / "deep.txt").write_text("Inside a folder.\n")  # sorted as sub/...
    (tmp_path / "c" / "notes.md").write_text("not read")
    ds = text.load_pydoc(tmp_path / "c", CONTEXT)
    # 21 files in path order: f00..f19, sub/deep; the 10th and 20th (f09, f19) are held out
    assert (ds.train_files, ds.test_files) == (19, 2)
    assert ds.decode(ds.test_tokens) == texts[9].replace("\u03bb", "\ufffd") + texts[19]
    train = [t for i, t in enumerate(texts) if i not in (9, 19)] + ["Inside a folder.\n"]
    assert ds.decode(ds.train_tokens) == "".join(train)
    # the vocabulary is the training text's characters, sorted, after the unknown id 0
    assert ds.vocabulary == "".join(sorted(set("".join(train))))
    assert ds.num_classes == len(ds.vocabulary) + 1
    assert "\u03bb" not in ds.vocabulary and (ds.test_tokens == text.UNKNOWN).sum() == 1
    assert ds.input_shape == (CONTEXT,)
    assert data.load("pydoc", tmp_path / "c", context=CONTEXT).decode(ds.test_tokens[:4]) == "File"


def test_training_windows_are_shifted_cuts_and_validation_windows_are_fixed(tmp_path):
    _corpus(tmp_path / "c")
    ds = text.load_pydoc(tmp_path / "c", CONTEXT)
    n = len(ds.train_tokens)
    assert ds.train_size == (n - 1) // CONTEXT
    index = torch.arange(ds.train_size)
    x, y = ds.train_batch(index, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (ds.train_size, CONTEXT) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # the targets are the inputs, one character on
    starts = []
    for row in x:  # where each window starts in the stream
        hits = [s for s in range(n - CONTEXT) if torch.equal(ds.train_tokens[s : s + CONTEXT], row)]
        starts.append(hits)
    for i, hits in enumerate(starts):  # window i starts in [i * context, (i + 1) * context)
        last = n - CONTEXT - 1
        assert any(min(i * CONTEXT, last) <= s < (i + 1) * CONTEXT for s in hits), i
    again, _ = ds.train_batch(index, torch.Generator().manual_seed(3))
    other, _ = ds.train_batch(index, torch.Generator().manual_seed(4))
    assert torch.equal(x, again) and not torch.equal(x, other)
    # validation: fixed, evenly spaced, the first at the start and the last at the end
    m = len(ds.test_tokens)
    assert ds.test_size == min(text.VALIDATION_WINDOWS, (m - 1) // CONTEXT)
    vx, vy = ds.test_batch(torch.arange(ds.test_size))
    assert torch.equal(vx[0], ds.test_tokens[:CONTEXT].long())
    assert torch.equal(vy[-1], ds.test_tokens[m - CONTEXT :].long())
    assert torch.equal(vx, ds.test_batch(torch.arange(ds.test_size))[0])


def test_bad_corpora_are_refused_with_what_to_do(tmp_path, monkeypatch):
    _corpus(tmp_path / "few", files=9)
    with pytest.raises(data.DataMissing, match=r"at least 10 \.txt files .* found 9"):
        text.load_pydoc(tmp_path / "few", CONTEXT)
    _corpus(tmp_path / "short", extra={9: "hi", 19: "yo"})
    with pytest.raises(ValueError, match=r"held-out text has 6 characters, fewer than one window"):
        text.load_pydoc(tmp_path / "short", CONTEXT)
    _corpus(tmp_path / "latin")
    (tmp_path / "latin" / "f03.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"f03\.txt: not UTF-8 text"):
        text.load_pydoc(tmp_path / "latin", CONTEXT)
    monkeypatch.setattr(text, "PYDOC_GLOB", str(tmp_path / "nowhere*"))
    with pytest.raises(data.DataMissing, match="apt-get install python3-doc, or pass --data-dir"):
        data.load("pydoc")


@pytest.mark.skipif(text.pydoc_folder() is None, reason="python3-doc is not installed")
def test_pythons_documentation_is_the_default_corpus():
    ds = data.load("pydoc")  # 497 files of Python 3.11's documentation: 448 + 49
    assert ds.train_files + ds.test_files >= 400
    assert ds.test_files == (ds.train_files + ds.test_files) // text.HELD_OUT
    assert len(ds.train_tokens) > 5_000_000 and ds.num_classes < 1000
    assert ds.test_size == text.VALIDATION_WINDOWS


# --------------------------------------------------------------------------- the model


def test_gpt_is_causal_and_ends_in_its_head():
    torch.manual_seed(0)
    net = models.build("gpt", (CONTEXT,), 50).eval()
    x = torch.randint(0, 50, (2, CONTEXT))
    with torch.no_grad():
        out = net(x)
        assert out.shape == (2, CONTEXT, 50)
        changed = x.clone()
        changed[:, 9] = (changed[:, 9] + 1) % 50
        after = net(changed)
        assert torch.equal(out[:, :9], after[:, :9])  # no position sees a later one
        assert not torch.allclose(out[:, 9:], after[:, 9:])
        assert net(x[:, :5]).shape == (2, 5, 50)
    owners = [m for m in net.modules() if any(True for _ in m.parameters(recurse=False))]
    assert owners[-1] is net.head  # the last layer: the hook keeps it in fp32
    # 4 blocks of 12 d^2 + 13 d, embeddings, final norm, head
    d, v = 256, 50
    assert sum(p.numel() for p in net.parameters()) == (
        4 * (12 * d * d + 13 * d) + v * d + CONTEXT * d + 2 * d + d * v + v
    )
    with pytest.raises(ValueError, match="longer than the context 16"):
        net(torch.zeros(1, 17, dtype=torch.long))
    for bad in ((28, 28), (0,), 128):
        with pytest.raises(ValueError, match=r"one positive integer \(the context length\)"):
            models.build("gpt", bad, 50)
    assert models.is_language_model("gpt") and not models.is_language_model("lenet")


def test_loss_scores_every_position():
    logits, targets = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    expected = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets)
    torch.testing.assert_close(models.loss(logits, targets), expected)
    flat_logits, flat_targets = torch.randn(4, 7), torch.randint(0, 7, (4,))
    torch.testing.assert_close(
        models.loss(flat_logits, flat_targets),
        torch.nn.functional.cross_entropy(flat_logits, flat_targets),
    )
    assert text.bits_per_character(math.log(2) * 1.5) == pytest.approx(1.5)


# --------------------------------------------------------------------------- optimisation


def test_cosine_decays_to_a_tenth_after_the_warm_up():
    f = schedule.lr_factor("cosine", steps=14, power=0.5, warmup=4)
    assert [f(k) for k in range(4)] == pytest.approx([0.1, 0.325, 0.55, 0.775])
    floor = schedule.COSINE_FLOOR
    expected = [floor + (1 - floor) * (1 + math.cos(math.pi * (k - 4) / 10)) / 2
                for k in range(4, 15)]  # fmt: skip
    assert [f(k) for k in range(4, 15)] == pytest.approx(expected, rel=1e-12)
    assert f(4) == 1.0 and f(9) == pytest.approx(0.55) and f(14) == pytest.approx(0.1)
    plain = schedule.lr_factor("cosine", steps=10, power=0.5, warmup=0)
    assert plain(0) == 1.0 and plain(10) == pytest.approx(0.1)


def test_adamw_decays_matrices_and_embeddings_only():
    net = models.build("gpt", (CONTEXT,), 30)
    cfg = TrainConfig(out="x", model="gpt", dataset="pydoc", optimizer="adamw", weight_decay=0.1)
    opt = make_optimizer(cfg, net)
    assert isinstance(opt, torch.optim.AdamW)
    decayed, kept = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    named = dict(net.named_parameters())
    ids = {id(p) for p in decayed["params"]}
    assert {n for n, p in named.items() if id(p) in ids} == {
        n for n, p in named.items() if p.dim() == 2
    }
    assert id(named["token.weight"]) in ids and id(named["blocks.0.ln1.weight"]) not in ids
    assert len(decayed["params"]) + len(kept["params"]) == len(named)


@pytest.mark.parametrize(
    "model, dataset, message",
    [("gpt", "mnist", r"gpt is a language model: give it a text data set \(pydoc\), not mnist"),
     ("lenet", "pydoc", r"pydoc is text: train a language model on it \(gpt\), not lenet")],
)  # fmt: skip
def test_models_and_data_sets_must_match(model, dataset, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(out="x", model=model, dataset=dataset)


# --------------------------------------------------------------------------- a real run


def test_two_workers_train_the_gpt_with_terngrad_and_report_bits_per_char(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    docs = sorted(Path(__file__).parents[1].glob("docs/**/*.md"))  # real English: our own docs
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


# --------------------------------------------------------------------------- the experiment


def test_the_transformer_plan_runs_every_method_on_one_protocol():
    from terngrad.train import transformer as tf

    base = tf.protocol("out", steps=100)
    assert (base.model, base.dataset, base.optimizer, base.lr_schedule) == (
        "gpt",
        "pydoc",
        "adamw",
        "cosine",
    )
    assert (base.warmup_steps, base.eval_every, base.weight_decay) == (10, 10, 0.1)
    runs = tf.TransformerComparison(base, seeds=2).plan()
    assert [r.method for r in runs[::2]] == list(tf.METHODS) and len(runs) == 20
    by = {(r.method, r.tags["seed"]): r.config for r in runs}
    assert by["fp32", 0].baseline == "fp32" and by["fp16", 1].baseline == "fp16"
    assert by["terngrad", 0].exchange == Options()  # the hook's defaults
    assert by["terngrad", 1].seed == 1 and by["terngrad", 0].baseline is None
    assert by["fp32", 1].seed == 1  # a baseline takes its data order from the run's seed
    assert by["terngrad-b512", 0].exchange.make_quantizer().bucket_size == 512
    assert by["terngrad-b2048", 0].exchange.make_quantizer().bucket_size == 2048
    assert by["terngrad-ef", 0].exchange.error_feedback
    assert by["terngrad-fp", 0].exchange.full_precision_steps == 20  # a fifth of the steps
    both = by["terngrad-b512-fp", 0].exchange
    assert both == by["terngrad-b512", 0].exchange.replace(full_precision_steps=20)
    assert by["qsgd-5", 0].exchange.quantizer == "qsgd"
    assert by["orq-5", 0].exchange.quantizer == "orq"
    assert by["orq-5", 0].out.endswith("orq-5-s0") and by["orq-5", 1].out.endswith("orq-5-s1")

    def plan(names, **kw):
        return tf.TransformerComparison(base, names, **kw).plan()

    assert plan(["terngrad-fp"], full_precision_steps=7)[0].config.exchange == (
        by["terngrad-fp", 0].exchange.replace(full_precision_steps=7)
    )
    assert plan(["orq"])[0].method == "orq-5"  # the older name
    for bad, message in ((["adam"], "unknown method 'adam'"), (["orq", "orq-5"], "given twice"),
                         (["powersgd"], "not a method of this comparison")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            plan(bad)
    with pytest.raises(ValueError, match="between 1 and the run's 99, got 100"):
        plan(["terngrad-fp"], full_precision_steps=100)


def test_a_two_method_reproduction_writes_the_table_and_reads_back(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus"
    _corpus(corpus, files=20, extra={i: (f"Line {i} of the corpus, about TernGrad. " * 40)
                                    for i in range(20)})  # fmt: skip
    out = tmp_path / "tf"
    argv = [
        "reproduce",
        "transformer",
        "--methods",
        "fp32",
        "terngrad-fp",
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
    assert "[2/2] terngrad-fp seed 0: validation" in printed
    results = json.loads((out / "results.json").read_text())
    fp32, tern = results["runs"]
    assert [s for s, _ in tern["curve"]] == [2, 4]
    assert tern["bits_per_char"] == pytest.approx(tern["loss"] / math.log(2))
    # fp32: the ring all-reduce of the gradient, 2 (N-1)/N = 1 times its bytes for 2 workers
    vocabulary = data.load("pydoc", corpus, context=128).num_classes
    gradient = 4 * sum(p.numel() for p in models.build("gpt", None, vocabulary).parameters())
    assert fp32["bytes_per_step"] == gradient
    # terngrad-fp: its first fifth (0 steps of 4: at least 1, so 1 step) in fp32, then ternary
    assert results["settings"]["steps"] == 4
    assert gradient / 4 < tern["bytes_per_step"] < gradient
    table = (out / "results.md").read_text()
    assert "| fp32 |" in table and "| terngrad-fp |" in table and "within 2%, ≥10x" in table
    assert (out / "curves.png").stat().st_size > 10_000
    assert (out / "tradeoff.png").stat().st_size > 10_000
    from terngrad.train import comparison

    monkeypatch.setattr(comparison, "launch", lambda cfg: pytest.fail("retrained"))
    assert main(argv) == 0
    assert "(done before)" in capsys.readouterr().out
