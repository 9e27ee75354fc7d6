"""The command line: `terngrad bench quantizers` reports every quantizer; bad arguments exit 2."""

import json
import subprocess
import sys

import pytest

from terngrad import quantize
from terngrad.cli import main


def test_bench_quantizers_prints_every_quantizer(capsys):
    assert main(["bench", "quantizers", "--numel", "20000", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for name in quantize.names():
        assert f"\n{name} " in out
    rows = out.partition("-" * 20)[2].splitlines()
    tern = next(line for line in rows if line.startswith("terngrad "))
    bits, ratio = tern.split()[2], tern.split()[3]
    assert float(bits) < 1.7 and float(ratio.rstrip("x")) > 19  # base-3: 1.6 bits, ~20x fewer


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "quantizers", "--numel", "0"],
        ["bench", "quantizers", "--numel", "x"],
        ["fly"],
        [],
        ["demo", "--steps", "-3"],
        ["train", "--out", "x", "--steps", "0"],
        ["train", "--out", "x", "--model", "resnet"],
        ["train", "--out", "x", "--lr", "-1"],
        ["reproduce", "imagenet"],
    ],
)
def test_bad_arguments_exit_2(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_console_script_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "terngrad.cli", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.startswith("terngrad ")


def test_bench_codec_table_and_json(tmp_path, capsys):
    out = tmp_path / "codec.json"
    argv = ["bench", "codec", "--sizes", "1000", "4001", "--repeats", "1", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for kernels in ("numba", "torch"):
        for op in ("encode", "decode", "owner sum, 4 workers", "statistics pass",
                   "rounding pass", "rounding, draws given", "frame checksum"):  # fmt: skip
            assert f"{op} [{kernels}]" in text
    assert "half()" in text and "half() into buffer" in text and "clone()" in text
    assert "x cast" in text and "on " in text.splitlines()[0]  # the yardstick; which CPU
    for name in quantize.names():  # every quantizer's public encode and decode
        assert f"{name} encode [public]" in text and f"{name} decode [public]" in text
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert result["cpu"] and result["threads"] >= 1
    assert len(rows) == 2 * (3 + 2 * 7 + 2 * len(quantize.names()))
    assert {r["numel"] for r in rows} == {1000, 4001}
    owner = next(r for r in rows if r["op"].startswith("owner") and r["numel"] == 4001)
    assert owner["input_numel"] == 1001  # the first of 4 shards of 4001 elements
    assert all(r["seconds"] > 0 for r in rows)


def test_flags_add_to_a_method_what_it_leaves_at_its_default():
    """``--method`` trains the way of the method (its exchange, recipe, warm-up, local steps,
    or PyTorch's baseline; ``terngrad`` where none is given); a flag of what the method leaves
    at its default adds it, and the run's method is named with it; ``--preset`` is its older
    spelling."""
    from terngrad.cli import build_parser
    from terngrad.cli.train import config
    from terngrad.comm import Options

    def run(*flags):
        return config(build_parser().parse_args(["train", "--out", "x", *flags]), out="x")

    assert run().method.exchange == Options()  # no flags: the defaults
    b512 = Options(quantizer_options={"bucket_size": 512})
    assert run("--method", "terngrad-b512").method.exchange == b512
    over = run("--method", "terngrad-b512", "--min-numel", "0", "--error-feedback").method
    assert over.name == "terngrad-b512-min0-ef"
    assert run("--bucket-size", "64", "--quantize-last").method.name == "terngrad-b64-last"
    local = run("--method", "terngrad-b512-ef-localvar100", "--optimizer", "adamw")
    assert local.optimizer_recipe == "local-adamw" and local.method.recipe.every == 100
    warm = run("--method", "terngrad-warmup0.2", "--steps", "50")
    assert warm.full_precision_steps == 10
    assert run("--method", "fp16").method.baseline == "fp16"
    assert run("--baseline", "powersgd", "--powersgd-rank", "4").method.name == "powersgd-r4"
    added = run("--method", "terngrad-ef", "--local-steps", "8", "--steps", "16",
                "--eval-every", "8")  # fmt: skip
    assert added.method.name == "terngrad-ef-local8"  # not dropped: the run's method has it
    outer = run("--method", "terngrad-local25", "--outer-lr", "0.5", "--steps", "50",
                "--eval-every", "25")  # fmt: skip
    assert outer.method.name == "terngrad-local25-olr0.5"
    with pytest.warns(FutureWarning):  # the preset's name: the method it always was
        old = run("--preset", "transformer")
    assert old.method.exchange == b512


def test_a_flag_the_method_decides_otherwise_is_refused_not_dropped(capsys):
    """A flag that says otherwise than its method (``--method terngrad-local16 --local-steps
    8``, ``--method terngrad-b512 --bucket-size 64``) is refused in one line naming both, and
    the method that runs it; nothing is overridden unsaid."""
    from terngrad.cli import build_parser
    from terngrad.cli.train import config

    def run(*flags):
        return config(build_parser().parse_args(["train", "--out", "x", *flags]), out="x")

    refused = {
        ("--method", "terngrad-local16", "--local-steps", "8", "--steps", "16"):
            "--local-steps 8 is not what terngrad-local16 runs (--local-steps 16); the method "
            "that does is terngrad-local8: name it, or leave out --local-steps",
        ("--method", "terngrad-b512", "--bucket-size", "64"):
            "--bucket-size 64 is not what terngrad-b512 runs (--bucket-size 512); the method "
            "that does is terngrad-b64",
        ("--method", "powersgd", "--powersgd-rank", "4"):
            "give --method powersgd-r4",
        ("--method", "terngrad", "--full-precision-steps", "5"):
            "full-precision-steps 5 is a warm-up, and method terngrad has none: a warm-up is a "
            "share of the steps in the method's name (terngrad-warmup0.1, say)",
        ("--method", "fp32", "--error-feedback"):
            "fp32 is PyTorch's own averaging: it takes no --error-feedback",
        ("--method", "fp32", "--baseline", "fp16"): "give --method or --baseline, not both",
        # read by local steps only: recorded and never read
        ("--outer-lr", "0.5"): "--outer-lr 0.5 is a setting of local steps, and terngrad has "
            "none: give --local-steps too, or a method with local steps (terngrad-local16)",
        ("--method", "terngrad-ef", "--outer-momentum", "0.5"): "--outer-momentum 0.5 is a "
            "setting of local steps, and terngrad-ef has none",
        ("--method", "terngrad-local4", "--max-comm-share", "0.2"): "max_comm_share is the "
            "share local_steps='auto' chooses H by; H is 4 here",
    }  # fmt: skip
    for flags, words in refused.items():
        with pytest.raises(ValueError) as exc:
            run(*flags)
        assert words in str(exc.value), flags
    # agreeing with the method, or a count over its warm-up share: trained as given
    same = run("--method", "terngrad-local25", "--local-steps", "25", "--steps", "50",
               "--eval-every", "25")  # fmt: skip
    assert same.method.name == "terngrad-local25"
    warm = run("--method", "terngrad-warmup0.2", "--full-precision-steps", "5", "--steps", "50")
    assert warm.hook_options.full_precision_steps == 5
    # through the command: one line, status 2, nothing run
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--out", "x", "--method", "terngrad-local16", "--local-steps", "8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "terngrad: error: --local-steps 8 is not what terngrad-local16 runs (--local-steps 16); "
        "the method that does is terngrad-local8: name it, or leave out --local-steps"
    ]


def test_the_training_flags_are_the_configs_fields():
    """Every setting of TrainConfig, Options and LocalSteps has its flag, with the config's
    default: a default or a range is written once, in the config."""
    from dataclasses import MISSING

    from terngrad.cli import build_parser
    from terngrad.cli.flags import RUN_OWN
    from terngrad.cli.train import config
    from terngrad.comm import Options
    from terngrad.comm.spec.local import LocalSteps
    from terngrad.train.config import TrainConfig
    from terngrad.util.settings import flag_name, settings_of

    RESOLVED = ("dataset", "batch_size", "full_precision_steps")  # by the config, where made
    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions[0].choices.items()
                 if a[0] == "train")[1]  # fmt: skip
    flags = {s for a in train._actions for s in a.option_strings}
    for cls in (TrainConfig, Options, LocalSteps):
        for f, s in settings_of(cls):
            if s.flag != "" and not (cls is Options and f.name in RUN_OWN):
                assert flag_name(f, s) in flags, f.name
    cfg = config(parser.parse_args(["train", "--out", "x"]), out="x")
    for f, _ in settings_of(TrainConfig):
        if f.default is not MISSING and f.name not in RESOLVED:
            assert getattr(cfg, f.name) == f.default, f.name
    assert (cfg.dataset, cfg.batch_size, cfg.full_precision_steps) == ("mnist", 64, 0)
    cfg = config(parser.parse_args(["train", "--out", "x", "--model", "gpt", "--seed", "5"]),
                 out="x")  # fmt: skip
    assert (cfg.dataset, cfg.seed, cfg.hook_options.seed) == ("pydoc", 5, 5)
