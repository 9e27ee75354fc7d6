"""Bad input on the command line: exit status 2, one line, no worker started, nothing written —
for train, reproduce, bench network, bench accuracy and perf-model."""

import os

import pytest
from support import LENET_RUN as ARGS
from support import MLP_RUN as RUN
from support import refused

from terngrad.bench import testbed
from terngrad.cli import main


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dataset", "cifar10"], "CIFAR-10 needs --data-dir"),
        (["--total-batch-size", "33"], "does not split evenly over 2 workers"),
        (["--quantizer", "qsgd", "--levels", "4"], "levels must be odd"),
    ],
)
def test_bad_runs_fail_before_training(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--steps", "2", "--out", str(tmp_path / "x"), *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_unwritable_out(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--steps", "2", "--out", str(blocker)])
    assert exc.value.code == 2 and "is not a folder" in capsys.readouterr().err
    assert blocker.read_text() == "keep me"


def test_batch_size_and_total_batch_size_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--batch-size", "8", "--steps", "2", "--out", str(tmp_path / "x")])
    assert exc.value.code == 2
    assert "give one of batch-size (per worker) and total-batch-size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--topology", "ring"], "unknown topology 'ring'; choose one of: sharded, ps, allgather"),
        (["--clip", "2", "--no-clip"], "give --clip or --no-clip, not both"),
        (["--quantizer", "linear", "--policy", "auto"], "policy 'auto' predicts"),
        (["--seed", "1" + "0" * 30], "expected an integer from -2**63 to 2**63 - 1"),
        (["--levels", "3"], "quantizer 'terngrad' has no option 'levels'"),
    ],
)
def test_bad_exchange_options_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--steps", "2", "--out", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


BAD_VALUES = [
    (["--lr", "inf"], "argument --lr: expected a positive finite number, got inf"),
    (["--lr", "nan"], "argument --lr: expected a positive finite number, got nan"),
    (["--momentum", "inf"], "argument --momentum: expected a number from 0 up to"),
    (["--momentum", "-1"], "argument --momentum: expected a number from 0 up to"),
    (["--momentum", "1"], "argument --momentum: expected a number from 0 up to"),
    (["--weight-decay", "inf"], "argument --weight-decay: expected a finite number >= 0"),
    (["--weight-decay", "-1"], "argument --weight-decay: expected a finite number >= 0"),
    (["--lr-power", "inf"], "argument --lr-power: expected a positive finite number"),
    (["--clip", "2", "--no-clip"], "give --clip or --no-clip, not both"),
    (["--warmup-steps", "5", "--warmup-epochs", "1"], "give warmup-steps or warmup-epochs, not"),
    (["--warmup-epochs", "inf"], "argument --warmup-epochs: expected a finite number >= 0"),
    (["--aggregate", "coherent"], "aggregate 'coherent' serves the level quantizers"),
    (["--dropout", "-1"], "argument --dropout: expected a number from 0 up to"),
    (["--dropout", "1.5"], "argument --dropout: expected a number from 0 up to"),
    (["--dropout", "inf"], "argument --dropout: expected a number from 0 up to"),
    (["--dropout", "nan"], "argument --dropout: expected a number from 0 up to"),
    (["--seed", "1" * 31], "argument --seed: expected an integer from -2**63 to 2**63 - 1"),
    (["--timeout", "inf"], "argument --timeout: expected a positive number of seconds, at most"),
    (["--timeout", "1e30"], "argument --timeout: expected a positive number of seconds, at most"),
    (["--kernels", "triton"], "--kernels triton runs on CUDA tensors"),
    (["--policy", "auto", "--quantizer", "linear"], "policy 'auto' predicts the exchange"),
    (["--rdzv-endpoint", "foo:bar"], "--rdzv-endpoint 'foo:bar' is not HOST:PORT"),
    (["--workers", "100000"], "--workers 100000 would start 100000 processes on this machine"),
    (["--nnodes", "2", "--node-rank", "5"], "--node-rank 5 is not a node of a 2-node run"),
    (["--batch-size", "100000"], "a batch of 100000 per worker is larger than each worker's"),
    (["--dataset", "cifar10"], "CIFAR-10 needs --data-dir"),
    (["--bogus"], "terngrad: error: unrecognized arguments: --bogus (see terngrad --help)"),
    (["--out"], "terngrad train: error: argument --out: expected one argument (see terngrad"),
    (["--out", ""], "out must name a folder, got ''"),
    (["--steps", str(2**63)], "argument --steps: expected a positive integer below 2**63"),
    (["--out", "x" * 300], f"cannot use --out {'x' * 300}: File name too long"),
]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*RUN, "--steps", "-3"], "expected a positive integer"),
        ([*RUN, "--steps", "0"], "expected a positive integer"),
        ([*RUN[:1], "--model", "resnet"], "invalid choice: 'resnet'"),
        ([*RUN, "--timeout", "0"], "expected a positive number of seconds"),
        ([*RUN, "--check-replicas-every", "-1"], "expected an integer >= 0"),
        ([*RUN, "--resume", "nowhere.pt"], "no checkpoint at nowhere.pt"),
        (["bench", "network", "--bandwidth", "fast"], "bandwidth must be a rate"),
        (["study", "--draws", "1"], "expected an integer >= 2"),
    ],
)
def test_bad_input_gets_one_line_and_status_2(tmp_path, capsys, argv, message):
    argv = [*argv, "--out", str(tmp_path / "x")] if argv[0] in ("train", "study") else argv
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").iterdir())


@pytest.mark.parametrize("flags, message", BAD_VALUES, ids=[" ".join(f) for f, _ in BAD_VALUES])
def test_bad_values_are_refused_before_any_worker_starts(tmp_path, capsys, monkeypatch, flags,
                                                         message):  # fmt: skip
    """Exit status 2, one line, no worker started, nothing written."""
    from torch.distributed import run as torchrun

    from terngrad.train import launch

    def started(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(launch, "_spawn", started)
    monkeypatch.setattr(torchrun, "main", started)
    out = tmp_path / "x"
    with pytest.raises(SystemExit) as exc:
        main([*RUN, "--steps", "2", "--out", str(out), *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_model_scale_refuses_infinite_speeds(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["perf-model", "scale", "--gpu-tflops", "inf"])
    assert exc.value.code == 2
    assert "argument --gpu-tflops: expected a positive finite number, got inf" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["reproduce", "orq", "--methods", "orq-4"], "orq-4: not a method of this comparison"),
        (["reproduce", "orq", "--methods", "terngrad-ef"], "not a method of this comparison"),
        (["reproduce", "orq", "--workers", "2", "4"], "unrecognized arguments: 4"),
        (["reproduce", "lenet", "--seeds", "2"], "unrecognized arguments: --seeds"),
        (["reproduce", "orq", "--full-precision-steps", "5"], "unrecognized arguments"),
        (["reproduce", "transformer", "--no-algorithm2"], "unrecognized arguments"),
        (["reproduce", "transformer", "--model", "lenet"], "invalid choice: 'lenet'"),
        (["reproduce", "orq", "--methods", "orq-5", "orq-5"], "methods given twice: orq-5"),
        (["reproduce", "transformer", "--tune-only"], "--tune-only is a setting of the tuning"),
        (
            ["reproduce", "transformer", "--tune-lr", "1e-3", "--seeds", "2", "--tune-seed", "1"],
            "--tune-seed 1 is one of the seeds compared (0..1)",
        ),
        (["reproduce", "transformer", "--tune-lr", "0"], "expected a positive finite number"),
    ],
)
def test_bad_reproductions_are_one_line(capsys, argv, message):
    assert message in refused(capsys, argv)


def test_cli_refuses_bad_input(capsys):
    for argv, message in [
        (["bench", "network", "--bandwidth", "fast"], "bandwidth must be a rate"),
        (["bench", "network", "--workers", "9"], "2 to 8 ranks"),
        (["bench", "network", "--methods", "zip"], "unknown method 'zip': a method starts with"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_the_old_spelling_of_workers_still_runs_with_a_warning(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "network", "--ranks", "9"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--ranks is deprecated: use --workers" in err and "2 to 8 ranks" in err


def _refused_by_bench_accuracy(capsys, argv, monkeypatch, tmp_path) -> str:
    built = []
    monkeypatch.setattr(testbed.Testbed, "__enter__", lambda self: built.append(self))
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "accuracy", "--model", "mlp", "--workers", "2", "--out", str(out), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert not built and not out.exists()  # nothing built, nothing written
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "101"], "target accuracy 101% can never be reached"),
        (["--target", "0"], "can never be reached"),
        (["--target", "90", "--methods", "fp32", "nosuch"], "unknown method 'nosuch'"),
        (["--target", "90", "--methods", "fp32", "fp32"], "methods given twice: fp32"),
        (["--target", "90", "--bandwidth", "fast"], "bandwidth must be a rate"),
        (["--target", "90", "--workers", "9"], "the testbed has 2 to 8 ranks"),
        (["--target", "90", "--tune-lr", "0.01", "-1"], "expected a positive finite number"),
        (["--target", "90", "--tune-lr", "0.01", "inf"], "expected a positive finite number"),
        (["--target", "90", "--tune-lr", "nan"], "expected a positive finite number"),
        (["--target", "90", "--tune-lr"], "expected at least one argument"),
        (["--target", "90", "--tune-lr", "0.01", "0.01"], "--tune-lr: each rate may be given once"),
        (["--target", "90", "--tune-lr", "0.01", "--tune-outer-lr", "0"], "positive finite"),
        (
            ["--target", "90", "--tune-lr", "0.01", "--seeds", "3", "--tune-seed", "2"],
            "--tune-seed 2 is one of the seeds compared (0..2)",
        ),
        (["--target", "90", "--tune-seed", "7"], "--tune-seed is a setting of the tuning"),
        (["--target", "90", "--tune-lr", "0.01", "--lr", "0.02"], "--lr and --tune-lr: the tuning"),
        (
            ["--target", "90", "--tune-lr", "0.01", "--tune-outer-lr", "0.5", "--methods", "fp32"],
            "no method given runs them",
        ),
        (["--target-loss", "0", "--tune-lr", "0.01"], "target loss 0 can never be reached"),
        (
            ["--target-loss-above-fp32", "1", "--tune-lr", "0.01", "--methods", "fp16"],
            "give fp32 among --methods",
        ),
        (
            ["--target", "90", "--tune-lr", "0.01", "--bandwidths", "1gbit", "fast"],
            "bandwidth must be a rate",
        ),
        # a part of a method is the method's: refused, not dropped
        (
            ["--target", "90", "--methods", "terngrad-b512-ef-frozen0.2"],
            "exchanges AdamW's momentum (AdamW's variance frozen after 20% of the steps, its "
            "preconditioned momentum exchanged): give optimizer adamw, not 'momentum'",
        ),
        (["--target", "90", "--local-steps", "8"], "unrecognized arguments: --local-steps"),
        (["--target", "90", "--outer-lr", "0.5"], "unrecognized arguments: --outer-lr"),
    ],
)
def test_bad_input_is_one_line_and_status_2(capsys, monkeypatch, tmp_path, argv, message):
    assert message in _refused_by_bench_accuracy(capsys, argv, monkeypatch, tmp_path)


def test_a_bandwidth_without_root_is_refused_before_anything_is_built(
    capsys, monkeypatch, tmp_path
):
    monkeypatch.setattr(testbed.os, "geteuid", lambda: 1000)
    err = _refused_by_bench_accuracy(capsys, ["--target", "90"], monkeypatch, tmp_path)
    assert "--bandwidth 100mbit" in err and "needs root" in err


@pytest.mark.parametrize("kind", ["fifo", "device", "huge", "folder"])
def test_a_resume_path_that_is_no_checkpoint_file_is_refused_at_once(
    tmp_path, capsys, monkeypatch, kind
):
    """A FIFO (which would block the reader), a device (endless), a file larger than the
    machine's memory (sparse here) or a folder: one line, status 2, before anything is read
    or written."""
    from terngrad.train import launch
    from terngrad.util.files import MEMORY_LIMIT

    monkeypatch.setattr(launch, "_spawn", lambda *a: pytest.fail("a worker was started"))
    path = {"device": "/dev/zero", "folder": str(tmp_path)}.get(kind, str(tmp_path / kind))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(2 * MEMORY_LIMIT)
    out = tmp_path / "x"
    err = refused(capsys, [*RUN, "--steps", "2", "--out", str(out), "--resume", path])
    says = {"fifo": "is a FIFO (named pipe), not a regular file", "folder": "is a folder",
            "device": "is a character device", "huge": "more than the"}[kind]  # fmt: skip
    assert f"checkpoint {path} " in err and says in err
    assert not out.exists()
