"""`terngrad train --local-steps H`: DiLoCo in the trainer — an outer step every H steps through
terngrad's exchange, far fewer bytes than the hook, a run stopped and extended bitwise as the
straight one, and the settings that cannot go together refused in one line."""

import json

import pytest
import torch
from support import LENET_SYNTHETIC_RUN as ARGS

from terngrad.cli import main
from terngrad.train import checkpoints

LOCAL = ["--local-steps", "2", "--optimizer", "adamw", "--lr", "1e-3"]


def _straight_and_extended(tmp_path, args: list[str], stop: int, steps: int):
    """The last checkpoints of a run of ``steps`` straight and of one stopped at ``stop`` and
    extended to ``steps``; their models asserted bitwise equal."""
    straight, parts = tmp_path / "straight", tmp_path / "parts"
    assert main([*ARGS, *args, "--steps", str(steps), "--out", str(straight)]) == 0
    assert main([*ARGS, *args, "--steps", str(stop), "--out", str(parts)]) == 0
    assert main([*ARGS, *args, "--steps", str(steps), "--out", str(parts)]) == 0  # resumed
    a = checkpoints.load(checkpoints.latest(straight))
    b = checkpoints.load(checkpoints.latest(parts))
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name
    return a, b


def test_local_steps_train_resume_bitwise_and_send_far_fewer_bytes(tmp_path, capsys):
    """Plain SGD on the anchor here (--outer-momentum 0: Nesterov needs momentum; with
    --outer-lr 1 every outer step is the replicas' average); the next test resumes
    DiLoCo's Nesterov step."""
    hook = tmp_path / "hook"
    plain = [*LOCAL, "--outer-lr", "1.0", "--outer-momentum", "0"]
    a, b = _straight_and_extended(tmp_path, plain, 2, 4)
    assert a["hook_states"][0]["outer_steps"] == b["hook_states"][0]["outer_steps"] == 2
    assert main([*ARGS, "--optimizer", "adamw", "--lr", "1e-3", "--steps", "4", "--out",
                 str(hook)]) == 0  # fmt: skip
    local = json.loads((tmp_path / "straight" / "summary.json").read_text())["bytes_sent_per_step"]
    every = json.loads((hook / "summary.json").read_text())["bytes_sent_per_step"]
    assert 0 < local < every / 1.5  # an exchange every second step, and no scale round more
    capsys.readouterr()


def test_overlap_resumes_bitwise_and_auto_chooses_and_keeps_h(tmp_path, capsys):
    """--outer-overlap: a run stopped at an outer step (its exchange in flight: sent again on
    resume) and extended ends bitwise as the straight one, every replica the anchor at the
    end; --local-steps auto: H among the divisors of --eval-every 4, said in summary.json, and
    a new --eval-every that H does not divide refused naming that flag."""
    auto = tmp_path / "auto"
    a, b = _straight_and_extended(tmp_path, [*LOCAL, "--outer-overlap"], 4, 6)
    assert a["hook_states"][0]["outer_steps"] == b["hook_states"][0]["outer_steps"] == 3
    assert a["hook_states"][0]["pending"] is not None  # the last exchange kept in flight
    # the bytes each evaluation records count the exchanges landed, the one in flight never:
    # the same in both runs (not how far the background thread has got)
    records = [(tmp_path / run / "metrics.jsonl").read_text() for run in ("straight", "parts")]
    sent = [
        [(r["step"], r["bytes_sent"]) for r in map(json.loads, t.splitlines())] for t in records
    ]
    assert sent[0] == sent[1] and sent[0][-1][1] > 0, sent
    argv = [*ARGS, "--optimizer", "adamw", "--lr", "1e-3", "--local-steps", "auto"]
    assert main([*argv, "--eval-every", "4", "--steps", "8", "--out", str(auto)]) == 0
    summary = json.loads((auto / "summary.json").read_text())
    assert summary["local_steps"] in (1, 2, 4)
    # a new --eval-every that the chosen H does not divide: the flag is named (every
    # checkpoint holds that H: moving the newest out would not help); H forged to 4, as
    # the choice (timed) may have taken 1, which divides everything
    path = checkpoints.latest(auto)
    ckpt = checkpoints.load(path)
    for state in ckpt["hook_states"]:
        state["local_steps"] = 4
    checkpoints.save(path, ckpt)
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--eval-every", "6", "--steps", "16", "--out", str(auto)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert "--local-steps auto chose H = 4 for this run" in err
    assert "4 does not divide --eval-every 6: give multiples of 4" in err and "move" not in err


def test_nodes_of_two_ranks_train_resume_bitwise_and_send_a_nodes_share(tmp_path, capsys):
    """--ranks-per-node 2 on 4 workers: DDP inside each node, the outer exchange across the two
    nodes (each rank its share of the parameters); a run stopped and extended ends bitwise as
    the straight one (the launcher's check of each rank's saved share passes), and the two
    ranks of a node together send across what one rank of a flat 2-rank run sends (within 1%:
    each place's exchange has its own headers)."""
    nodes = [*LOCAL, "--across-nodes", "--workers", "4", "--ranks-per-node", "2"]
    a, _ = _straight_and_extended(tmp_path, nodes, 2, 4)
    assert [s["outer_steps"] for s in a["hook_states"]] == [2] * 4
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["node_bytes_sent_per_rank"] > 0  # what rank 0 sent inside its node
    flat = tmp_path / "flat"
    assert main([*ARGS, *LOCAL, "--steps", "4", "--out", str(flat)]) == 0
    node = sum(s["exchange"]["counters"]["bytes_sent"] for s in a["hook_states"][:2])
    flat_state = checkpoints.load(checkpoints.latest(flat))["hook_states"][0]
    once = flat_state["exchange"]["counters"]["bytes_sent"]
    assert 0 < once <= node <= 1.01 * once  # (each place's exchange: its own few headers)
    assert json.loads((tmp_path / "straight" / "summary.json").read_text())["method"] == (
        "terngrad-local2-nodes"
    )
    for extra, said in (
        (["--ranks-per-node", "2"], "ranks-per-node 2 must divide workers 2 into at least 2 nodes"),
        ([], "method terngrad-local2-nodes runs its local steps across nodes: give --ranks-per-"),
    ):
        argv = [*ARGS, *LOCAL, "--across-nodes", *extra, "--steps", "4", "--out",
                str(tmp_path / "x")]  # fmt: skip
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_local_steps_whose_outer_steps_keep_failing_stop_in_one_line(tmp_path, capsys):
    """A rank's pseudo-gradient not finite skips the outer step (the anchor stays); if every
    outer step is skipped, the run stops after --max-skipped-steps of them, as the hook's run
    does after that many skipped steps, instead of training on NaN replicas to the end."""
    out = tmp_path / "nan"
    argv = [*ARGS, *LOCAL[:2], "--optimizer", "adamw", "--lr", "1e12", "--steps", "40",
            "--eval-every", "40", "--max-skipped-steps", "2", "--out", str(out)]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "2 consecutive outer steps (up to step" in err and "NaN or Inf gradient" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--steps", "5"], "steps 5 is not a multiple of local-steps 2"),
        (["--steps", "4", "--eval-every", "3"], "eval-every 3 is not a multiple"),
        (
            ["--steps", "4", "--baseline", "fp16"],
            "fp16 is PyTorch's own averaging: it takes no --local-steps",
        ),
        (
            ["--steps", "4", "--method", "terngrad-localvar100", "--optimizer", "adamw"],
            "no optimizer recipe",
        ),
        (["--steps", "4", "--local-steps", "0"], "--local-steps"),
        (["--steps", "4", "--local-steps", "automatic"], "or auto, got 'automatic'"),
        (
            ["--steps", "4", "--local-steps", "auto", "--eval-every", "2"],
            "local-steps auto chooses H at inner step 4: eval-every must be at least 4, got 2",
        ),
        (  # fewer steps than the probe: H never chosen, every step thrown away
            ["--steps", "3", "--local-steps", "auto"],
            "local-steps auto chooses H at inner step 4: steps must be at least 4, got 3",
        ),
        (
            ["--steps", "4", "--local-steps", "1", "--outer-overlap"],
            "--outer-overlap is a setting of local steps, and terngrad has none: give "
            "--local-steps too",
        ),
    ],
)
def test_what_local_steps_cannot_go_with_is_one_line(tmp_path, capsys, extra, message):
    argv = [*ARGS, "--local-steps", "2", *extra, "--out", str(tmp_path / "x")]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
