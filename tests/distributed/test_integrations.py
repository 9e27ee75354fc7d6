"""The documented scripts of docs/integrations.md on 2 gloo ranks under torchrun (plain DDP,
the (state, hook) pair, Lightning, accelerate, the Hugging Face Trainer, FSDP2), and the loud
failures of the framework paths that would otherwise drop the hook silently."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from ranks import run_script
from support import REPO
from torch import nn

import terngrad.ddp
from terngrad.comm.spec.local import LocalSteps

EXAMPLES = REPO / "examples"


#: what torch 2.13 + gloo sometimes prints when a process aborts at interpreter exit, after its
#: work is done (a C++ thread still joinable at teardown; seen without terngrad too)
TEARDOWN_ABORT = "terminate called without an active exception"


def teardown_abort_only(stderr: str) -> bool:
    """Whether a failed torchrun's stderr shows nothing but :data:`TEARDOWN_ABORT`: a worker
    aborted (SIGABRT) after printing the message, the launcher sent SIGTERM to the rest, and the
    only traceback is the launcher's own ``ChildFailedError`` report. A worker's Python error
    (exit code 1, its own traceback) or any other signal is a real failure."""
    codes = [int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)]
    return (
        TEARDOWN_ABORT in stderr
        and stderr.count("Traceback (most recent call last)") == 1
        and "raise ChildFailedError(" in stderr
        and -signal.SIGABRT in codes
        and set(codes) <= {-signal.SIGABRT, -signal.SIGTERM}
    )


def run_example(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``examples/script`` on 2 ranks under torchrun. It must succeed — or have done all its
    work and then hit only torch's teardown abort (:func:`teardown_abort_only`), which the exit
    code alone cannot tell from a failure; the callers check that the work was all done."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(EXAMPLES / script), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=EXAMPLES.parent,
    )  # fmt: skip
    log = done.stdout[-2000:] + done.stderr[-4000:]
    if done.returncode != 0:
        assert teardown_abort_only(done.stderr), log
    return done


def torchrun(script: str, *args: str) -> dict:
    """Rank 0's last line of output of ``examples/script`` on 2 ranks, as JSON: started as
    torchrun starts them (its environment, the script as ``__main__``), forked from a fork
    server that imported torch and the frameworks once (:func:`ranks.run_script`; seconds a
    rank). :func:`run_example` runs one under torchrun itself."""
    out = run_script(EXAMPLES / script, args)
    return json.loads(out.strip().splitlines()[-1])


def _trainer(model, world_size=2, scaler=None, **strategy):
    return SimpleNamespace(
        strategy=SimpleNamespace(model=model, **strategy),
        world_size=world_size,
        precision_plugin=SimpleNamespace(scaler=scaler),
    )


def test_the_pair_made_before_the_process_group_trains_like_register():
    pair, one_line = torchrun("ddp_state_hook.py"), torchrun("ddp_state_hook.py", "--register")
    assert pair["replicas_identical"] and one_line["replicas_identical"]
    assert pair["checksum"] == one_line["checksum"]  # the same bits
    assert pair["bytes_sent_per_step"] == one_line["bytes_sent_per_step"]
    assert pair["fp32_ring_bytes_per_step"] >= 10 * pair["bytes_sent_per_step"]


@pytest.mark.parametrize("args", [(), ("--strategy-pair",)], ids=["callback", "strategy-pair"])
def test_lightning_trains_with_the_hook_on(args):
    pytest.importorskip("lightning")
    out = torchrun("lightning_terngrad.py", "--steps", "12", *args)
    assert out["steps"] == 12 and out["replicas_identical"]
    assert out["fp32_ring_bytes_per_step"] >= 10 * out["bytes_sent_per_step"]


def test_lightnings_fsdp2_trains_with_terngrad_as_its_reduce_scatter():
    """``ModelParallelStrategy`` with ``fully_shard`` in ``configure_model``: the same callback
    routes to terngrad.fsdp, and the shards make one model on every rank."""
    pytest.importorskip("lightning")
    out = torchrun("lightning_terngrad.py", "--steps", "12", "--fsdp")
    assert out["route"] == "terngrad.fsdp.State"
    assert out["steps"] == 12 and out["replicas_identical"]
    assert out["fp32_reduce_scatter_bytes_per_step"] >= 10 * out["bytes_sent_per_step"]  # 15.8x


def test_fsdp2_through_a_framework_refuses_local_steps_before_any_collective():
    from terngrad.integrations.common import register_sharded

    with pytest.raises(ValueError, match="give TernGradCallback no local_steps with FSDP"):
        register_sharded(nn.Linear(2, 2), None, LocalSteps(4))


def test_accelerate_trains_with_the_hook_on_and_gradient_accumulation():
    pytest.importorskip("accelerate")
    out = torchrun("accelerate_terngrad.py", "--steps", "10", "--accumulate", "3")
    assert out["steps"] == 10  # one exchange per optimizer step, not per micro-batch
    assert out["replicas_identical"]
    assert out["fp32_ring_bytes_per_step"] >= 10 * out["bytes_sent_per_step"]


def test_hf_trainer_trains_with_the_hook_on_from_one_line():
    pytest.importorskip("transformers", reason="transformers is not installed")
    out = torchrun("hf_trainer_terngrad.py", "--steps", "6", "--accumulate", "2")
    assert out["steps"] == 6  # one exchange per optimizer step, not per micro-batch
    assert out["replicas_identical"]
    # the default method (5 levels, the tied head too): 9.0x here, 8x at least
    assert out["fp32_ring_bytes_per_step"] >= 8 * out["bytes_sent_per_step"]


def test_the_trainer_and_lightning_callbacks_run_local_steps():
    """``TernGradCallback(local_steps=4)``: one model after the last outer step, and per step
    far fewer bytes than DDP's fp32 all-reduce (~9x per exchange here, times H)."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("lightning")
    hf = torchrun("hf_trainer_terngrad.py", "--steps", "8", "--accumulate", "2",
                  "--local-steps", "4")  # fmt: skip
    pl = torchrun("lightning_terngrad.py", "--steps", "12", "--local-steps", "4")
    for out, steps in ((hf, 8), (pl, 12)):
        assert out["steps"] == steps and out["replicas_identical"]
        assert out["fp32_ring_bytes_per_step"] >= 30 * out["bytes_sent_per_step"], out


def test_diloco_example_sends_over_100x_fewer_bytes_than_fp32_ddp():
    """Local steps (H = 16) with ternary outer gradients on 2 ranks: one model after every outer
    step, and per inner step far fewer bytes than DDP's every-step fp32 all-reduce."""
    out = torchrun("diloco_terngrad.py", "--local-steps", "16", "--steps", "32")
    assert (out["inner_steps"], out["outer_steps"]) == (32, 2) and out["replicas_identical"]
    assert out["fp32_ring_bytes_per_step"] >= 100 * out["bytes_sent_per_step"] > 0


def test_fsdp2_trains_with_terngrad_as_its_reduce_scatter_from_one_line():
    args = ("--toy", "--steps", "8", "--eval-every", "4")
    tern = torchrun("fsdp_terngrad.py", *args)
    plain = torchrun("fsdp_terngrad.py", *args, "--reduce-scatter", "fsdp")
    assert tern["replicas_identical"] and plain["replicas_identical"]
    # the same gradients reduced: FSDP's own fp32 reduce-scatter is what terngrad compares with
    assert tern["fp32_bytes_per_step"] == plain["reduce_scatter_bytes_per_step"]
    # the toy GPT's head (64 x 61) stays fp32, so a little under TernGrad's 20x on the rest
    assert tern["fp32_bytes_per_step"] >= 9 * tern["reduce_scatter_bytes_per_step"]
    first, last = (c["validation_loss"] for c in (tern["curve"][0], tern["curve"][-1]))
    assert last < first


def test_plain_ddp_example_runs():
    done = run_example("ddp_terngrad.py", "--steps", "25")
    assert "terngrad/sharded on 2 ranks" in done.stdout


def test_both_callbacks_take_a_method_of_local_steps_whole():
    """``method="terngrad-local16"`` was refused by both callbacks (the hook alone has no local
    steps), though they run local steps from keywords: its H and overlap become the callback's
    DiLoCo settings, the rest its hook's; a keyword that says otherwise is refused in one
    line, not dropped."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from terngrad.integrations.lightning import TernGradCallback as LightningCallback
    from terngrad.integrations.transformers import TernGradCallback as TrainerCallback

    for callback, options in ((TrainerCallback, "options"), (LightningCallback, "_options")):
        whole = callback(method="terngrad-ef-local16-overlap", outer_lr=0.5)
        assert (whole.local.every, whole.local.overlap, whole.local.outer_lr) == (16, True, 0.5)
        hook = getattr(whole, options)
        assert hook.error_feedback and hook.quantizer == "terngrad"
        assert callback(method="terngrad-local16", local_steps=16).local.every == 16
        # a method of one step: a keyword adds local steps, as without a method
        assert callback(method="terngrad-ef", local_steps=8).local.every == 8
        for keywords, words in (
            ({"local_steps": 8}, r"local_steps 8 is not what terngrad-local16-olr0.5 runs "
                                 r"\(local_steps 16\); the method that does is "
                                 r"terngrad-local8-olr0.5"),
            ({"outer_lr": 0.7}, r"outer_lr 0.7 is not what terngrad-local16-olr0.5 runs"),
        ):  # fmt: skip
            with pytest.raises(ValueError, match=words):
                callback(method="terngrad-local16-olr0.5", **keywords)


def test_lightning_callback_refuses_a_strategy_without_ddp():
    from terngrad.integrations.lightning import TernGradCallback

    with pytest.raises(RuntimeError, match="takes no communication hook") as exc:
        TernGradCallback().on_fit_start(_trainer(nn.Linear(2, 2)), None)
    assert "or ModelParallelStrategy with fully_shard in configure_model (FSDP2)" in str(exc.value)
    with pytest.warns(RuntimeWarning, match="one process"):
        TernGradCallback().on_fit_start(_trainer(nn.Linear(2, 2), world_size=1), None)
    with pytest.raises(ValueError, match="not both"):
        TernGradCallback("qsgd", state=terngrad.ddp.State())
    own = terngrad.ddp.State()
    with pytest.raises(ValueError, match="in one place only"):
        TernGradCallback("qsgd").on_fit_start(_trainer(nn.Linear(2, 2), _ddp_comm_state=own), None)
    with pytest.raises(RuntimeError, match="GradScaler"):
        TernGradCallback().on_fit_start(_trainer(nn.Linear(2, 2), scaler=object()), None)
    with pytest.raises(ValueError, match="local_steps must be an integer of at least 1"):
        TernGradCallback(local_steps=2.5)
    with pytest.raises(ValueError, match=r"give no state=\.\.\. with them"):
        TernGradCallback(local_steps=4, state=terngrad.ddp.State())
    with pytest.raises(ValueError, match="overlap=True is a setting of local steps"):
        TernGradCallback(overlap=True)


def test_lightning_callback_drops_the_gradients_of_a_skipped_step():
    from terngrad.integrations.lightning import TernGradCallback

    model = nn.Linear(4, 2)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    callback = TernGradCallback(state=SimpleNamespace(last_step_skipped=True))
    model(torch.ones(3, 4)).sum().backward()
    callback.on_before_optimizer_step(None, None, optimizer)
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not optimizer.state  # no momentum buffer either
    callback.state.last_step_skipped = False
    model(torch.ones(3, 4)).sum().backward()
    callback.on_before_optimizer_step(None, None, optimizer)
    optimizer.step()
    assert not torch.equal(before[0], model.weight)


def test_accelerate_register_refuses_what_accelerate_would_ignore():
    pytest.importorskip("accelerate")
    from accelerate.utils import DDPCommunicationHookType

    from terngrad.integrations.accelerate import register

    handler = SimpleNamespace(comm_hook=terngrad.ddp.hook)
    accelerator = SimpleNamespace(ddp_handler=handler, num_processes=1, distributed_type="NO")
    with pytest.raises(ValueError, match="accelerate ignores"):
        register(accelerator, nn.Linear(2, 2))
    handler.comm_hook = DDPCommunicationHookType.NO
    with pytest.raises(TypeError, match="prepare the model first"):
        register(accelerator, nn.Linear(2, 2))


#: the shape of a failed torchrun's stderr, its exit codes and tracebacks filled in per case
LAUNCHER_REPORT = """{worker}W1203 17:18:17 api.py:1028] Sending process 11 closing signal SIGTERM
Traceback (most recent call last):
  File "torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  exitcode  : {other} (pid: 11)
Root Cause (first observed failure):
[0]:
  exitcode  : {root} (pid: 10)
"""


@pytest.mark.parametrize(
    ("worker", "root", "other", "only_teardown"),
    [
        (TEARDOWN_ABORT + "\n", -6, -15, True),  # rank 0 aborted at exit, rank 1 was stopped
        (TEARDOWN_ABORT + "\n", -6, -6, True),  # both aborted at exit
        ("", -6, -15, False),  # an abort without torch's teardown message
        (TEARDOWN_ABORT + "\n", 1, -15, False),  # a worker's own error exit
        (TEARDOWN_ABORT + "\n", -11, -15, False),  # a crash, not the abort
        (TEARDOWN_ABORT + "\nTraceback (most recent call last):\nValueError: x\n", -6, -15, False),
    ],
    ids=["abort+term", "abort+abort", "no-message", "exit-1", "segfault", "worker-traceback"],
)
def test_only_torchs_teardown_abort_is_forgiven(worker, root, other, only_teardown):
    stderr = LAUNCHER_REPORT.format(worker=worker, root=root, other=other)
    assert teardown_abort_only(stderr) is only_teardown
