"""The Hugging Face Trainer with ``TernGradCallback()`` and nothing else: the real Trainer on 2
gloo ranks (bytes, identical replicas, a NaN on one rank skipping the step everywhere, a second
``train()``, the logs), the Trainer's FSDP2 routed to terngrad.fsdp, and the one-line refusals
of what the callback cannot serve."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "transformers", reason="transformers is not installed: pip install 'terngrad[transformers]'"
)

import hf_workers as w
from accelerate import Accelerator
from ranks import run
from transformers import Trainer

from terngrad.integrations import transformers as hf
from terngrad.integrations.transformers import TernGradCallback


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    """One run on 2 gloo ranks for the tests below: the Trainer through DDP with a NaN at step
    3, then the Trainer's FSDP2 for 4 steps."""
    return run(w.ddp_then_fsdp2, 2, 3, 4)


def test_the_trainer_trains_with_the_hook_on_and_a_nan_skips_the_step_everywhere(two_ranks):
    ranks = [r["ddp"] for r in two_ranks]
    for r in ranks:
        stats = r["stats"]
        assert stats.steps == 6  # one exchange per optimizer step, not per micro-batch
        assert stats.skipped_steps == 1
        fp32 = 4 * r["numel"]  # what DDP's fp32 ring all-reduce sends per step on 2 ranks
        assert fp32 >= 8 * stats.bytes_sent_per_step, (fp32, stats.bytes_sent_per_step)
        after = r["checksum_after"]
        assert after[2] == after[3] != after[4]  # step 3 (NaN on rank 1) changed nothing
        assert r["adam_steps"] == {5}  # nor AdamW's moments: the step was not taken
        assert any("had a NaN or Inf gradient" in m for m in r["warnings"])
        logs = r["logs"]  # logging_steps=1: every step's log and the final metrics
        assert len(logs) == 7 and logs[-1]["terngrad/skipped_steps"] == 1
        assert [e["terngrad/skipped_steps"] for e in logs[:3]] == [0, 0, 1]
        assert all(e["terngrad/fp32_bytes_per_step"] == fp32 for e in logs)
        assert all(e["terngrad/compression"] >= 8 for e in logs)  # the default method
        assert r["first_in_line"]  # so that report_to integrations see its keys
        assert r["second_train_kept_the_hook"]
        assert "already has a communication hook" in r["refused"]  # a second callback
    assert ranks[0]["checksum_after"] == ranks[1]["checksum_after"]  # identical replicas
    assert ranks[0]["final"] == ranks[1]["final"]


def test_the_trainers_fsdp2_trains_with_terngrad_as_its_reduce_scatter(two_ranks):
    """``fsdp_config={"fsdp_version": 2}``: ``prepare`` shards the model (a GPT2Block per FSDP
    module; the embeddings and the tied head together, accelerate's way) and the callback puts
    TernGrad in every FSDP module's reduce-scatter, once per optimizer step (accumulation runs
    FSDP's no_sync)."""
    ranks = [r["fsdp2"] for r in two_ranks]
    for r in ranks:
        assert r["route"] == "terngrad.fsdp.State"
        assert r["calls"] == [4] * len(r["calls"]) and len(r["calls"]) == 4  # each group once
        stats = r["stats"]
        assert stats.steps == 4 and stats.skipped_steps == 0
        assert r["fp32_bytes_sent"] == 4 * r["fp32_bytes_per_step"]
        assert r["fp32_bytes_per_step"] >= 8 * stats.bytes_sent_per_step  # 8.8x here
        # the default method quantizes the tied head too; only tensors under 1,024 stay fp32
        assert "transformer.wte.weight" not in r["excluded"] and r["excluded"]
        assert all(e["terngrad/fp32_bytes_per_step"] == r["fp32_bytes_per_step"]
                   for e in r["logs"])  # fmt: skip
        assert r["losses"][-1] < r["losses"][0]
    assert ranks[0]["full"] == ranks[1]["full"]  # the shards make one model
    assert ranks[0]["losses"] == ranks[1]["losses"]


def _trainer(tmp_path, tweak=lambda trainer: None, callback=None) -> Trainer:
    """A one-process Trainer with ``callback`` (a TernGradCallback by default), ``tweak``
    applied to it as its accelerator is made (before the callbacks' ``on_init_end``)."""

    class Tweaked(Trainer):
        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            tweak(self)

        def fire(self, event: str):  # a callback event, from a Trainer method as in train()
            return getattr(self.callback_handler, event)(self.args, self.state, self.control)

    return Tweaked(
        model=w.tiny_gpt2(), args=w.training_args(str(tmp_path), max_steps=1),
        train_dataset=w.toy_data(16), callbacks=[callback or TernGradCallback()],
    )  # fmt: skip


def _one_line(exc: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_bad_settings_are_refused_when_the_callback_is_made():
    with pytest.raises(ValueError) as exc:
        TernGradCallback(quantizer="ternary")
    assert "ternary" in _one_line(exc)
    for bad, said in (
        ({"local_steps": 0}, "local_steps must be an integer of at least 1"),
        ({"local_steps": 8, "outer_lr": -1}, "outer-lr must be a positive finite number"),
        ({"overlap": True}, "overlap=True is a setting of local steps, and the callback has none"),
        ({"outer_lr": 0.5}, "outer_lr=0.5 is a setting of local steps, and the callback has none"),
        ({"local_steps": "auto", "max_comm_share": 2}, "max-comm-share must be a share"),
    ):
        with pytest.raises(ValueError) as exc:
            TernGradCallback(**bad)
        assert _one_line(exc).startswith(said)


def test_the_default_is_the_measured_method_and_what_is_given_goes_over_it():
    """``TernGradCallback()`` runs DEFAULT_METHOD (docs/integrations.md, "The default,
    measured"); settings given replace its own; a quantizer or method given replaces it."""
    assert hf.DEFAULT_METHOD == "qsgd-5-b64-last"
    options = TernGradCallback().options
    assert (options.quantizer, options.quantizer_options, options.topology) == (
        "qsgd",
        {"levels": 5, "bucket_size": 64},
        "sharded",
    )
    assert options.quantize_last and not options.error_feedback and options.min_numel == 1024
    assert not TernGradCallback(quantize_last=False).options.quantize_last
    assert TernGradCallback(local_steps=16).options == options
    paper = TernGradCallback("terngrad").options  # TernGrad as the paper has it
    assert (paper.quantizer, paper.quantizer_options, paper.quantize_last) == (
        "terngrad",
        {},
        False,
    )
    given = TernGradCallback(method="terngrad-b2048").options
    assert (given.quantizer, given.quantizer_options) == ("terngrad", {"bucket_size": 2048})
    # a method named takes settings by the rule of every consumer: added where it leaves the
    # default, refused where it sets otherwise (the default method, unnamed, is replaced)
    assert TernGradCallback(method="terngrad-b2048", error_feedback=True).options.error_feedback
    with pytest.raises(ValueError, match="bucket_size 64 is not what terngrad-b2048 runs"):
        TernGradCallback(method="terngrad-b2048", bucket_size=64)
    assert TernGradCallback(bucket_size=128).options.quantizer_options["bucket_size"] == 128


def test_outer_momentum_zero_is_accepted_by_both_callbacks():
    """Plain SGD as the outer step (``outer_sgd``, tests/unit/test_local_steps.py): the
    callbacks' ``nesterov`` is left out (``None``), so momentum 0 must not be refused for it."""
    pytest.importorskip("lightning", reason="pip install 'terngrad[lightning]'")
    from terngrad.integrations.lightning import TernGradCallback as LightningCallback

    for callback in (TernGradCallback, LightningCallback):
        assert callback(local_steps=4, outer_momentum=0).local.outer_momentum == 0


@pytest.mark.parametrize(
    ("tweak", "expected"),
    [
        (lambda t: setattr(t, "is_deepspeed_enabled", True), "runs DeepSpeed"),
        (lambda t: setattr(t.args, "fsdp_plugin_args", {"fsdp_version": 1}), "FSDP version 1"),
        (lambda t: setattr(t.accelerator, "scaler", object()), "GradScaler"),
    ],
    ids=["deepspeed", "fsdp1", "fp16-loss-scaling"],
)
def test_what_the_callback_cannot_serve_is_refused_when_the_trainer_is_made(
    tmp_path, tweak, expected
):
    with pytest.raises(RuntimeError) as exc:
        _trainer(tmp_path, tweak)
    assert expected in _one_line(exc)
    if expected != "GradScaler":
        assert "use FSDP version 2 (TrainingArguments(fsdp=True, fsdp_config=" in str(exc.value)


def test_fsdp2_asked_on_the_cpu_warns_that_the_trainer_trains_through_ddp(tmp_path, monkeypatch):
    """accelerate 1.15 drops its FSDP plugin on CPU and the Trainer trains through DDP: the
    callback says so when it hooks that DDP (here no DDP model follows: refused after)."""
    trainer = _trainer(tmp_path, lambda t: setattr(t.args, "fsdp_plugin_args", {"fsdp_version": 2}))
    monkeypatch.setattr(Accelerator, "num_processes", property(lambda self: 2))
    warns = pytest.warns(RuntimeWarning, match="asks for FSDP, which accelerate runs on GPUs only")
    with warns, pytest.raises(RuntimeError, match="not torch's DistributedDataParallel"):
        trainer.fire("on_train_begin")


def test_fp16_is_refused_on_the_cpu_too(tmp_path):
    """The CPU's accelerator makes no GradScaler for fp16=True, and the Trainer trains on:
    refused all the same, when the Trainer is made."""
    with pytest.raises(RuntimeError) as exc:
        Trainer(model=w.tiny_gpt2(), args=w.training_args(str(tmp_path), fp16=True),
                train_dataset=w.toy_data(16), callbacks=[TernGradCallback()])  # fmt: skip
    assert "TrainingArguments(fp16=True) scales the loss with a GradScaler" in _one_line(exc)


def test_several_processes_without_ddp_are_refused(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path)
    monkeypatch.setattr(Accelerator, "num_processes", property(lambda self: 2))
    with pytest.raises(RuntimeError) as exc:
        trainer.fire("on_train_begin")  # the model is not wrapped in DDP
    assert "not torch's DistributedDataParallel" in _one_line(exc)


def test_one_process_warns_and_trains_without_the_hook(tmp_path):
    callback = TernGradCallback()
    trainer = _trainer(tmp_path, callback=callback)
    with pytest.warns(RuntimeWarning, match="one process"):
        trainer.train()
    assert callback.state is None and trainer.state.global_step == 1


def test_the_callback_outside_a_trainer_says_where_it_belongs():
    with pytest.raises(RuntimeError) as exc:
        TernGradCallback().on_train_begin(None, None, None)
    assert "callbacks=[TernGradCallback()]" in _one_line(exc)


def test_a_momentum_exchanging_optimizer_is_refused_with_the_trainers_clipping(tmp_path):
    """The hook would hand LocalVarianceAdamW the exchanged momentum in p.grad, which the
    Trainer's default clipping (max_grad_norm=1.0) rescales as a gradient: refused when the
    Trainer is made; with max_grad_norm=0 it is made."""
    from terngrad.optim import LocalVarianceAdamW

    def trainer(**changes):
        model = w.tiny_gpt2()
        return Trainer(model=model, args=w.training_args(str(tmp_path), max_steps=1, **changes),
                       train_dataset=w.toy_data(16),
                       optimizers=(LocalVarianceAdamW(model.parameters()), None),
                       callbacks=[TernGradCallback(local_steps=1)])  # fmt: skip

    with pytest.raises(RuntimeError) as exc:
        trainer()
    assert "give TrainingArguments(max_grad_norm=0)" in _one_line(exc)
    assert trainer(max_grad_norm=0).args.max_grad_norm == 0  # made, not refused


@pytest.mark.parametrize(("model", "setting"), [("t5", "default"), ("vit", "hook")])
def test_the_zoos_families_train_through_the_trainer_and_write_their_record(
    tmp_path, model, setting
):
    """The Trainer's experiment (``terngrad.experiments.trainer_defaults``) on a family of the
    zoo that reads other than next bytes (T5's encoder-decoder, the ViT's images), 2 gloo ranks,
    2 steps: its record holds a finite eval loss and the callback's bytes, fewer than DDP's."""
    import json
    import math

    from ranks import run_script
    from support import REPO

    from terngrad.experiments import zoo

    if model == "t5" and zoo.vim_folder() is None:
        pytest.skip("Vim's help files are not installed (apt-get install vim-runtime)")
    script = REPO / "terngrad" / "experiments" / "trainer_defaults.py"
    run_script(script, ["--model", model, "--setting", setting, "--steps", "2", "--eval-every",
                        "2", "--warmup", "1", "--out", str(tmp_path)])  # fmt: skip
    record = json.loads((tmp_path / f"{model}-{setting}-s0.json").read_text())
    assert record["model"] == model and math.isfinite(record["eval_loss"])
    assert record["text"] == (None if model == "vit" else "vimdoc")
    assert record["compression"] > 2 and len(record["curve"]) == 2
