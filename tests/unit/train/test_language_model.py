"""The language-model pieces: the pydoc corpus split by whole files, training and validation
windows, the GPT (causal, ends in its head), the loss over every position, cosine decay, AdamW's
weight decay, models and data sets that must match, and the transformer comparison's plan."""

import math

import pytest
import torch
from support import write_corpus

from terngrad.comm import Options
from terngrad.train import data, models, schedule, text
from terngrad.train.config import TrainConfig
from terngrad.train.setup import make_optimizer

CONTEXT = 16


def test_whole_files_are_held_out_and_the_streams_are_their_text(tmp_path):
    held = {9: "File 10 says: the quick fox jumps \u03bb.\n", 19: "the brown fox jumps. " * 9}
    texts = write_corpus(tmp_path / "c", extra=held)  # of the held-out characters only the lambda
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
    write_corpus(tmp_path / "c")
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
    write_corpus(tmp_path / "few", files=9)
    with pytest.raises(data.DataMissing, match=r"at least 10 \.txt files .* found 9"):
        text.load_pydoc(tmp_path / "few", CONTEXT)
    write_corpus(tmp_path / "short", extra={9: "hi", 19: "yo"})
    with pytest.raises(ValueError, match=r"held-out text has 6 characters, fewer than one window"):
        text.load_pydoc(tmp_path / "short", CONTEXT)
    write_corpus(tmp_path / "latin")
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


def test_the_small_gpt_is_the_gpt_at_half_the_width():
    small, full = models.build("gpt-small", (CONTEXT,), 50), models.build("gpt", (CONTEXT,), 50)
    assert (small.token.embedding_dim, len(small.blocks)) == (128, 4)
    assert [type(m) for m in small.modules()][1:] == [type(m) for m in full.modules()][1:]
    assert (
        0.2
        < sum(p.numel() for p in small.parameters()) / sum(p.numel() for p in full.parameters())
        < 0.3
    )
    assert models.is_language_model("gpt-small")


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


def test_the_transformer_plan_runs_every_method_on_one_protocol():
    from terngrad.experiments import gpt as tf

    assert tf.protocol("out", model="gpt-small").model == "gpt-small"
    with pytest.raises(ValueError, match="runs one of gpt, gpt-small, not 'lenet'"):
        tf.protocol("out", model="lenet")
    base = tf.protocol("out", steps=100)
    assert (base.model, base.dataset, base.optimizer, base.lr_schedule) == (
        "gpt",
        "pydoc",
        "adamw",
        "cosine",
    )
    assert (base.warmup_steps, base.eval_every, base.weight_decay) == (10, 10, 0.1)
    runs = tf.TransformerComparison(base, seeds=2).plan()
    assert [r.method for r in runs[::2]] == list(tf.DEFAULT_METHODS)
    assert len(runs) == 2 * len(tf.DEFAULT_METHODS)
    by = {(r.method, r.tags["seed"]): r.config for r in runs}
    assert by["fp32", 0].method.baseline == "fp32" and by["fp16", 1].method.baseline == "fp16"
    assert by["terngrad", 0].method.exchange == Options()  # the hook's defaults
    assert by["terngrad", 1].seed == 1 and by["terngrad", 0].method.baseline is None
    assert by["fp32", 1].seed == 1  # a baseline takes its data order from the run's seed
    assert by["terngrad-b512", 0].hook_options.make_quantizer().bucket_size == 512
    assert by["terngrad-b2048", 0].hook_options.make_quantizer().bucket_size == 2048
    assert by["terngrad-ef", 0].hook_options.error_feedback
    assert by["terngrad-warmup0.2", 0].full_precision_steps == 20  # a fifth of the steps
    both = by["terngrad-b512-warmup0.2", 0].hook_options
    assert both == by["terngrad-b512", 0].hook_options.replace(full_precision_steps=20)
    momentum = by["terngrad-b512-ef-frozen0.2", 0]
    assert (momentum.optimizer_recipe, momentum.freeze_after) == ("frozen-adamw", 20)
    assert momentum.hook_options.error_feedback
    local = by["terngrad-b512-ef-localvar100", 0]
    assert local.optimizer_recipe == "local-adamw" and local.method.recipe.every == 100
    assert by["qsgd-5", 0].hook_options.quantizer == "qsgd"
    assert by["orq-5", 0].hook_options.quantizer == "orq"
    assert by["orq-5", 0].out.endswith("orq-5-s0") and by["orq-5", 1].out.endswith("orq-5-s1")

    def plan(names, **kw):
        return tf.TransformerComparison(base, names, **kw).plan()

    assert plan(["terngrad-warmup0.2"], full_precision_steps=7)[0].config.hook_options == (
        by["terngrad-warmup0.2", 0].hook_options.replace(full_precision_steps=7)
    )
    with pytest.warns(FutureWarning):
        assert plan(["orq"])[0].method == "orq-5"  # the older name
    for bad, message in ((["adam"], "unknown method 'adam'"), (["orq-5", "orq-5"], "given twice"),
                         (["powersgd"], "not a method of this comparison")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            plan(bad)
    with pytest.raises(ValueError, match="between 1 and the run's 99, got 100"):
        plan(["terngrad-warmup0.2"], full_precision_steps=100)
