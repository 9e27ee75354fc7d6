"""A checkpoint with a valid checksum whose contents do not fit the run: every field
a worker reads is checked by the launcher against the model, optimizer, schedule and hook the
run will build, before any worker starts and before anything is rewritten (config.json
included). One trained run serves every case: each damaged copy is refused without a worker."""

import shutil

import pytest
import torch
from support import SMALL_RUN as RUN
from support import refused

from terngrad.train import checkpoints


def _weight(c):
    c["model"]["layers.1.weight"] = torch.zeros(3, 3)


def _sparse_weight(c):
    c["model"]["layers.1.bias"] = c["model"]["layers.1.bias"].to_sparse()


def _buffer(c):
    c["optimizer"]["state"][0]["momentum_buffer"] = torch.zeros(5)


def _hyperparameter(c):
    c["optimizer"]["param_groups"][0]["lr"] = "fast"


def _hook_generator(c):
    c["hook_states"][1]["generator"] = c["hook_states"][1]["generator"][:100]


def _hook_config(c):
    c["hook_states"][0]["config"]["quantizer"] = "qsgd"


def _rng(c):
    c["rng_states"][0] = c["rng_states"][0][:100]


def _schedule(c):
    del c["schedule"]["lr_lambdas"]


def _schedule_step(c):
    c["schedule"]["last_epoch"] = 7


def _wire_bytes(c):
    c["wire_bytes"] = [1]


CASES = [
    (_weight, "its model's layers.1.weight is a [3, 3] float32 tensor, where the run has a "
              "dense [512, 784] floating-point tensor"),
    (_sparse_weight, "its model's layers.1.bias is a sparse_coo [512] float32 tensor"),
    (_buffer, "its optimizer's momentum_buffer of parameter 0 is a [5] float32 tensor, where "
              "the run has a dense [512, 784]"),
    (_hyperparameter, "its optimizer's parameter group 0's lr is a str, where the run has a "
                      "float"),
    (_hook_generator, "its hook state of rank 1: not a terngrad hook state: its 'generator' has "
                      "shape (100,), this rank's generator (5056,) (saved on another device?)"),
    (_hook_config, "its hook state of rank 0: this hook state was saved with another "
                   "configuration (saved value instead of this hook's): quantizer='qsgd'"),
    (_rng, "its generator of rank 0 is a [100] uint8 tensor, where the run has a dense [5056]"),
    (_schedule, "its schedule lacks lr_lambdas, unlike the run's (LambdaLR)"),
    (_schedule_step, "its schedule is at step 7, the checkpoint at 2"),
    (_wire_bytes, "its wire bytes are a list, not one count per worker"),
]  # fmt: skip


def _forbid_workers(monkeypatch):
    """Any worker started from here on fails the test: the launcher alone refuses."""
    from torch.distributed import run as torchrun

    from terngrad.train import launch

    def started(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(launch, "_spawn", started)
    monkeypatch.setattr(torchrun, "main", started)


@pytest.fixture
def no_workers(monkeypatch):
    _forbid_workers(monkeypatch)


def _files(out):
    return {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".terngrad.lock"}


@pytest.mark.parametrize("forge, message", CASES, ids=[f.__name__[1:] for f, _ in CASES])
def test_a_checkpoint_whose_contents_do_not_fit_is_refused_before_any_worker(
    tmp_path, capsys, finished_run, no_workers, forge, message
):
    out = finished_run(2, tmp_path / "run")
    path = checkpoints.latest(out)
    ckpt = checkpoints.load(path)
    forge(ckpt)
    checkpoints.save(path, ckpt)  # a valid checksum over the forged contents
    before = _files(out)
    err = refused(capsys, [*RUN, "--steps", "4", "--out", str(out)])
    assert f"{path} does not fit this run: {message}" in err, err
    assert f"move it out of --out {out} (or delete it) and run the same command again" in err
    assert _files(out) == before  # config.json, metrics.jsonl, the checkpoint: as they were
    # resumed explicitly: the same refusal, without the advice about --out
    err = refused(capsys, [*RUN, "--steps", "4", "--out", str(tmp_path / "new"),
                           "--resume", str(path)])  # fmt: skip
    assert f"{path} does not fit this run: {message}" in err and "move it" not in err
    assert not (tmp_path / "new").exists()


def test_a_checkpoint_whose_step_is_not_its_names_is_named_as_the_culprit(
    tmp_path, capsys, finished_run, no_workers
):
    """Its name says step 4, it holds step 2: the file itself is refused, not "the newer
    checkpoints", and the advice names the one before it."""
    out = finished_run(2, tmp_path / "run")
    misnamed = checkpoints.path_for(out, 4)
    shutil.copy(checkpoints.path_for(out, 2), misnamed)
    before = _files(out)
    err = refused(capsys, [*RUN, "--steps", "6", "--out", str(out)])
    assert f"{misnamed} is not a whole terngrad training checkpoint: it holds step 2, and its " \
        "name says step 4" in err  # fmt: skip
    assert "to resume from the one before it (step 2)" in err and "newer" not in err
    assert _files(out) == before


def _outer_lr(c):
    c["hook_states"][0]["outer_optimizer"]["param_groups"][0]["lr"] = 123.0


def _inner_steps(c):
    for state in c["hook_states"]:
        state["inner_steps"], state["outer_steps"] = 6, 3


def _skipped_apart(c):
    c["hook_states"][1]["skipped_outer_steps"] = 1


def _anchor_apart(c):
    own = c["hook_states"][1]
    c["hook_states"][1] = {**own, "anchor": [a + 1e-3 for a in own["anchor"]]}


LOCAL_CASES = [
    (_outer_lr, "its local-steps state of rank 0: this terngrad.diloco state's outer optimizer "
                "has lr=123.0, this run lr=0.7: resume with the outer settings it was saved "
                "with"),
    (_inner_steps, "its local-steps state of rank 0 counts 6 inner steps, the checkpoint 4"),
    (_skipped_apart, "its local-steps states count skipped_outer_steps [0, 1] on ranks 0.., "
                     "not alike"),
    (_anchor_apart, "its local-steps state of rank 1 holds another anchor than rank 0's"),
]  # fmt: skip


def test_a_local_steps_checkpoint_is_checked_for_meaning_before_any_worker(
    tmp_path, capsys, monkeypatch
):
    """Local steps' states, checked for what they mean and not only their form: the outer
    optimizer at the run's settings, the inner steps the checkpoint's step, the counts and the
    anchor alike on every rank. Each forged copy refused in one line, nothing rewritten."""
    local = [*RUN, "--local-steps", "2", "--optimizer", "adamw", "--lr", "1e-3"]
    trained = tmp_path / "trained"
    from terngrad.cli import main

    assert main([*local, "--steps", "4", "--out", str(trained)]) == 0
    _forbid_workers(monkeypatch)
    for forge, message in LOCAL_CASES:
        out = tmp_path / forge.__name__
        shutil.copytree(trained, out)
        path = checkpoints.latest(out)
        ckpt = checkpoints.load(path)
        forge(ckpt)
        checkpoints.save(path, ckpt)
        before = _files(out)
        err = refused(capsys, [*local, "--steps", "6", "--out", str(out)])
        assert f"{path} does not fit this run: {message}" in err, err
        assert _files(out) == before
