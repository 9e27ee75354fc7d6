"""The Trainer-defaults experiment's settings and byte count (no training here: the runs are
in docs/results/trainer-defaults/)."""

import json

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'terngrad[transformers]'")

from transformers import GPT2Config, GPT2LMHeadModel

from terngrad.experiments import trainer_defaults as td


def test_steps_and_evaluations_must_meet_the_outer_steps():
    args = td.parse_args(["--setting", "local16", "--out", "o"])
    assert (args.steps, args.eval_every, args.model) == (320, 80, "gpt2")
    with pytest.raises(SystemExit):
        td.parse_args(["--setting", "local16", "--steps", "300", "--out", "o"])
    assert td.parse_args(["--setting", "ddp", "--steps", "300", "--out", "o"]).steps == 300


def test_the_bytes_on_gpt2_smalls_shape_are_those_the_docs_give():
    """GPT-2 small from its config (124M parameters, the 50,257 x 768 embedding tied to the
    head), shapes only, 2 ranks: fp32 over what each setting sends (docs/integrations.md)."""
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    fewer = {}
    for setting in ("ddp", "default", "hook", "hook-last", "hook-last-b64", "local16",
                    "local16-last"):  # fmt: skip
        sent, fp32 = td.counted_bytes(model, td.SETTINGS[setting])
        fewer[setting] = round(fp32 / sent, 1)
    assert fp32 == 4 * 124_439_808  # 2 (N-1)/N of the fp32 gradient at N = 2
    assert fewer == {"ddp": 1.0, "default": 9.7, "hook": 2.8, "hook-last": 16.0,
                     "hook-last-b64": 12.8, "local16": 45.3, "local16-last": 256.1}  # fmt: skip


def test_the_report_puts_each_setting_beside_ddp(tmp_path):
    for setting, seed, loss, sent in (("ddp", 0, 2.0, 800), ("ddp", 1, 2.2, 800),
                                      ("local16", 0, 2.2, 8)):  # fmt: skip
        record = {"model": "gpt2", "setting": setting, "seed": seed, "eval_loss": loss,
                  "bytes_sent_per_step": sent, "fp32_bytes_per_step": 800}  # fmt: skip
        (tmp_path / f"gpt2-{setting}-s{seed}.json").write_text(json.dumps(record))
    td.main(["--report", "--out", str(tmp_path)])
    rows = (tmp_path / "results.md").read_text().splitlines()
    assert rows[2] == "| gpt2 | ddp | 0, 1 | 2.1000 ± 0.1414 | +0.00% | 800 | 1.0x |"
    assert rows[3] == "| gpt2 | local16 | 0 | 2.2000 | +4.76% | 8 | 100.0x |"


def test_every_setting_is_a_method_of_the_table_with_keywords_over_it():
    """One registry: each setting compared is a method's name (``None``: the callback's own
    default) and DiLoCo keywords over it; its callback runs exactly that method."""
    from terngrad.comm.spec import methods
    from terngrad.integrations.transformers import DEFAULT_METHOD

    for name, setting in td.SETTINGS.items():
        if setting is None:
            continue
        method = methods.get(setting.method or DEFAULT_METHOD)
        callback = setting.callback()
        h = callback.local.every if callback.local else 1
        assert h == method.local_steps, name
        inner = methods.get(method.name.replace(f"-local{h}", "") if h != 1 else method.name)
        assert callback.options == inner.options(), name
        assert set(setting.keywords) <= {"outer_lr", "outer_momentum"}, name


def test_the_zoo_is_six_families_split_before_any_result():
    """Each family of the zoo builds from its config at about 200k parameters, reads its own
    data (its text's held-out windows fixed, T5 the second half of a window from its first,
    the ViT MNIST's images) and starts at a finite loss; the tuning and check halves split it."""
    from terngrad.experiments import zoo

    assert set(zoo.TUNING) | set(zoo.CHECK) == set(zoo.FAMILIES) == set(td.MODELS)
    assert not set(zoo.TUNING) & set(zoo.CHECK) and len(zoo.FAMILIES) == 6
    texts = {f.text for f in zoo.FAMILIES.values()} - {None}
    assert texts == set(zoo.TEXTS)  # the zoo reads both sources
    for name, family in zoo.FAMILIES.items():
        if family.text is not None and zoo.TEXTS[family.text]() is None:
            continue  # (its text is not installed here)
        torch.manual_seed(0)
        model = zoo.build_model(name)
        assert 150_000 < sum(p.numel() for p in model.parameters()) < 300_000, name
        train, held_out = zoo.datasets(name, 4)
        assert len(held_out) == 4 and len(train) > 10_000, name
        batch = zoo.collate([train[i] for i in range(2)])
        if family.task == "seq2seq":
            assert batch["input_ids"].shape == batch["labels"].shape == (2, zoo.CONTEXT // 2)
        with torch.no_grad():
            loss = model(**batch).loss
        assert torch.isfinite(loss) and float(loss) < 10, name
    masked = zoo.datasets("bert", 4)[1]
    assert torch.equal(masked[0]["input_ids"], masked[0]["input_ids"])  # fixed masks
