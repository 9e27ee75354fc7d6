"""One meaning per flag across every subcommand: a flag's name has one meaning, one type and
one range wherever it is (``--workers`` one number of processes, ``--timeout`` the seconds a
collective waits), the shared flags are made from the settings ``terngrad train``'s are, and
the older spellings still work, with a one-line warning (:mod:`terngrad.cli.flags`)."""

from __future__ import annotations

import argparse
from collections import defaultdict

import pytest
from support import refused

from terngrad.cli import build_parser, main
from terngrad.cli.flags import Deprecated, OneValue, Retired
from terngrad.comm import Options
from terngrad.train.config import TrainConfig
from terngrad.util.settings import flag_name, settings_of

#: what each command needs before any flag can be parsed
REQUIRED = {
    "train": ["--out", "x"],
    "bench accuracy": ["--target", "90"],
    "perf-model validate": ["--calibrate", "a.json", "--runs", "b.json"],
    "model validate": ["--calibrate", "a.json", "--runs", "b.json"],
}
#: flags made by hand where train makes them from a setting, and why
BY_HAND = {
    ("study", "--steps"): "0 too: the gradients of the model as it is",
    ("reproduce transformer", "--model"): "one of the comparison's two GPTs",
    ("bench codec", "--kernels"): "one of the two backends it times, numba or torch",
    ("bench quantizers", "--seed"): "a random gradient's, not a run's (the same type and range)",
}
PROBES = ("0", "3", "-1", "2.5", "1e30", "x")


def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command that runs (``bench network``, ``reproduce lenet``, ...) and its parser."""

    def walk(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [(" ".join(path), parser)]
        return [c for name, p in subs[0].choices.items() for c in walk(p, (*path, name))]

    return walk(build_parser(), ())


def shown(parser) -> dict[str, argparse.Action]:
    """The flags of a command that its help shows, by name (not the older spellings)."""
    return {o: a for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


def probe(action: argparse.Action) -> tuple:
    """What the flag makes of a few words: its type and range, as values."""

    def one(text):
        try:
            return action.type(text) if action.type else text
        except (argparse.ArgumentTypeError, ValueError):
            return "refused"

    return tuple(one(t) for t in PROBES)


def parse(command: str, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args([*command.split(), *REQUIRED.get(command, []), *flags])


def test_every_flag_name_has_one_meaning_and_type():
    """The same dest, one value or a list, and the same type and range, in every command."""
    seen = defaultdict(dict)
    for command, parser in commands():
        for name, action in shown(parser).items():
            single = isinstance(action, OneValue) or action.nargs in (None, 0)
            seen[name][command] = (action.dest, single, probe(action))
    for name, where in seen.items():
        kinds = {k for c, k in where.items() if (c, name) not in BY_HAND}
        assert len(kinds) == 1, (name, where)


def test_workers_is_one_number_of_processes_everywhere():
    found = []
    for command, parser in commands():
        action = shown(parser).get("--workers")
        if action is None:
            continue
        found.append(command)
        assert parse(command, "--workers", "3").workers == 3, command
        assert action.type("3") == 3 and probe(action)[0] == "refused", command
    assert {"train", "bench network", "bench accuracy", "bench overhead", "reproduce lenet",
            "reproduce orq", "reproduce transformer"} <= set(found)  # fmt: skip


def test_timeout_is_the_collective_timeout_wherever_it_is():
    """``--timeout`` is TrainConfig's ``timeout``; where it was a benchmark's wall-clock limit
    it is refused, in one line naming ``--time-limit``."""
    timeout = dict((f.name, s) for f, s in settings_of(TrainConfig))["timeout"]
    for command, parser in commands():
        actions = [a for a in parser._actions if "--timeout" in a.option_strings]
        if not actions:
            continue
        (action,) = actions
        if isinstance(action, Retired):
            with pytest.raises(SystemExit) as exc:
                parse(command, "--timeout", "600")
            assert exc.value.code == 2 and "--time-limit" in action.message
            assert "--time-limit" in shown(parser), command
            continue
        assert action.dest == "timeout" and action.help.startswith(timeout.help), command
        assert parse(command, "--timeout", "7").timeout == 7.0
        assert probe(action)[4] == "refused"  # over a year


def test_the_shared_flags_are_made_from_trains_settings():
    """Wherever a flag of a TrainConfig or Options setting is, it has the setting's help, type,
    range and choices (its default may be the command's own)."""
    # the run's seed and timeout are TrainConfig's (the exchange's are not flags)
    settings = {flag_name(f, s): s for cls in (Options, TrainConfig) for f, s in settings_of(cls)}
    settings.pop("--out")  # train's own flag, required there
    train = shown(dict(commands())["train"])
    checked = 0
    for command, parser in commands():
        if command == "train":
            continue
        for name, action in shown(parser).items():
            if name not in settings or (command, name) in BY_HAND:
                continue
            s, mine = settings[name], train[name]
            assert action.help.startswith(s.help), (command, name)
            assert probe(action) == probe(mine), (command, name)
            assert action.choices == mine.choices, (command, name)
            checked += 1
    assert checked >= 30


def test_old_spellings_are_hidden_and_say_what_to_use():
    """A flag the help does not show is an older spelling: it warns (naming a flag of the same
    command) or is refused."""
    for command, parser in commands():
        for action in parser._actions:
            if action.help != argparse.SUPPRESS or not action.option_strings:
                continue
            assert isinstance(action, Deprecated | Retired), (command, action.option_strings)
            if isinstance(action, Deprecated):
                assert action.new in shown(parser), (command, action.new)


@pytest.mark.parametrize(
    "argv, dest, value, warning",
    [
        (["reproduce", "lenet", "--workers", "2", "4"], "worker_counts", [2, 4],
         "--workers 2 4 is deprecated: --workers takes one value; use --worker-counts 2 4"),
        (["reproduce", "cifar", "--workers", "2", "8"], "worker_counts", [2, 8], "--worker-counts"),
        (["perf-model", "scale", "--workers", "8", "16"], "worker_counts", [8, 16],
         "--workers is deprecated: use --worker-counts"),
        (["bench", "codec", "--workers", "8"], "simulated_workers", 8, "use --simulated-workers"),
        (["bench", "codec", "--kernels", "numba", "torch"], "kernel_backends", ["numba", "torch"],
         "use --kernel-backends numba torch"),
        (["bench", "network", "--warmup", "2"], "untimed_steps", 2, "use --untimed-steps"),
        (["bench", "overhead", "--warmup", "2"], "untimed_steps", 2, "use --untimed-steps"),
        (["bench", "network", "--ranks", "3"], "workers", 3, "--ranks is deprecated"),
        (["bench", "accuracy", "--target", "90", "--bandwidth", "1gbit", "100mbit"], "bandwidths",
         ["1gbit", "100mbit"], "use --bandwidths 1gbit 100mbit"),
    ],
)  # fmt: skip
def test_old_spellings_still_work_with_a_one_line_warning(capsys, argv, dest, value, warning):
    assert getattr(build_parser().parse_args(argv), dest) == value
    err = capsys.readouterr().err.strip()
    assert warning in err and err.startswith("terngrad: warning: ") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, dest, value",
    [
        (["reproduce", "lenet", "--workers", "4"], "workers", 4),
        (["reproduce", "lenet", "--worker-counts", "4"], "worker_counts", [4]),
        (["perf-model", "scale", "--worker-counts", "4"], "worker_counts", [4]),
        (["bench", "accuracy", "--target", "90", "--bandwidth", "1gbit"], "bandwidth", "1gbit"),
        (["bench", "codec", "--kernels", "numba"], "kernels", "numba"),
    ],
)
def test_one_value_needs_no_warning(capsys, argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv, runs",
    [
        (["--workers", "2", "4"], (2, 4)),  # the old spelling: still a run per count
        (["--workers", "4"], (4,)),  # one run of 4 processes
        (["--worker-counts", "4"], (4,)),  # a list of one
        ([], (2, 4)),
    ],
)
def test_reproduce_lenet_runs_a_run_per_worker_count(monkeypatch, tmp_path, capsys, argv, runs):
    from terngrad.experiments import comparison, paper

    made = []
    monkeypatch.setattr(paper, "lenet", lambda out, steps, workers: made.append(workers))
    monkeypatch.setattr(comparison, "run", lambda experiment, out: "")
    assert main(["reproduce", "lenet", "--out", str(tmp_path), *argv]) == 0
    assert made == [runs]


def test_one_value_and_its_list_together_are_refused(capsys):
    err = refused(capsys, ["reproduce", "lenet", "--workers", "4", "--worker-counts", "2"])
    assert "give --workers or --worker-counts, not both" in err


def test_a_benchmarks_old_timeout_is_refused_in_one_line(capsys):
    for argv in (["bench", "network", "--timeout", "600"],
                 ["bench", "accuracy", "--target", "90", "--timeout", "600"]):  # fmt: skip
        err = refused(capsys, argv)
        assert "--timeout is no longer a benchmark's limit" in err and "--time-limit" in err
