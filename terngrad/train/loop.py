"""One worker's training loop (:func:`train_worker`): the model under DDP with terngrad's hook
(or one of PyTorch's own ways, ``baseline``: :mod:`terngrad.train.baselines`), its own disjoint
shard of the training set, evaluations into ``metrics.jsonl`` (:mod:`terngrad.train.outputs`),
checkpoints every ``checkpoint_every`` steps (:mod:`terngrad.train.checkpoints`), replica checks,
and at the end rank 0's summary. The process group must be initialised
(:mod:`terngrad.train.launch` does it)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import terngrad.ddp
from terngrad.comm import CollectiveFailed, rank_seed
from terngrad.comm.rank.agreement import differing_ranks
from terngrad.comm.rank.consistency import check_replicas
from terngrad.comm.rank.momentum import MomentumSource
from terngrad.diloco import DiLoCo, node_group
from terngrad.diloco.state import REPLICATED_STATE
from terngrad.train import baselines, checkpoints, models, outputs, text
from terngrad.train import data as datasets
from terngrad.train.board import Board
from terngrad.train.config import PER_NODE, TrainConfig
from terngrad.train.progress import Progress
from terngrad.train.setup import build_model, load_data, make_optimizer, make_schedule
from terngrad.util import netdev

#: what the trainer says when it stops on NaN/Inf gradients (a learning rate's tuning reads it)
DIVERGED = "had a NaN or Inf gradient on some rank"


class TrainingFailed(RuntimeError):
    """Training cannot go on (too many non-finite steps); the checkpoints are intact."""


class OutputLost(TrainingFailed):
    """The run's folder cannot be written any more: removed, made read-only or full."""


@contextlib.contextmanager
def _writing(out: Path, name: str, step: int) -> Iterator[None]:
    """An ``OSError`` while writing ``name`` into ``out`` as one :class:`OutputLost` line."""
    try:
        yield
    except OSError as exc:
        said = f"cannot write {name} into --out {out} at step {step} ({exc.strerror or exc})"
        if not out.is_dir():  # its checkpoints went with it: nothing to resume from
            raise OutputLost(
                f"{said}: the folder was removed during the run, which stopped there, and its "
                "checkpoints with it: run the same command again to start afresh"
            ) from None
        newest = checkpoints.latest(out)
        then = (
            f"resume from its newest checkpoint ({newest.name})"
            if newest
            else "start afresh (no checkpoint was written yet)"
        )
        raise OutputLost(
            f"{said}: the folder was made read-only or filled during the run, which stopped "
            f"there. Make it writable again (or free space) and run the same command to {then}"
        ) from None


def check_same_run(cfg: TrainConfig) -> None:
    """Fail on every rank, naming the differences, unless all ranks run the same settings
    (a collective; it runs before anything else, so misconfigured nodes stop at once)."""
    problems = differing_ranks(cfg.settings(), ignore=PER_NODE)
    if problems:
        raise ValueError(
            "the ranks were started with different settings (compared with rank 0): "
            + "; ".join(problems)
        )


def evaluate(model: nn.Module, data: datasets.DataSet | text.TextSet, rank: int, world: int):
    """Test loss (nats per prediction) and accuracy over the whole test set (a language model:
    every position of the validation windows, next-character accuracy), each rank scoring its
    share (a collective)."""
    model.eval()
    index = torch.arange(rank, data.test_size, world)
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    chunk_size = 64 if isinstance(data, text.TextSet) else 512
    with torch.no_grad():
        for chunk in index.split(chunk_size):
            x, y = data.test_batch(chunk)
            logits = model(x)
            totals[0] += float(models.loss(logits, y, reduction="sum"))
            totals[1] += float((logits.argmax(-1) == y).sum())
            totals[2] += y.numel()
    model.train()
    dist.all_reduce(totals)
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


def train_worker(cfg: TrainConfig, resume: str | None = None) -> dict[str, Any] | None:
    """One worker's training loop. Returns the summary on rank 0, ``None`` elsewhere."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != cfg.workers:
        raise RuntimeError(f"the run asks for {cfg.workers} workers but {world} joined")
    check_same_run(cfg)
    out = Path(cfg.out)
    data = load_data(cfg, seed=cfg.seed)
    model = build_model(cfg, data)  # identical initial replicas (DDP also broadcasts rank 0's)
    optimizer = make_optimizer(cfg, model)
    method = cfg.method
    if method.local is not None:  # DiLoCo: local inner steps, the exchange at outer steps
        # (with nodes, DDP averages inside a node at every step: the outer exchange is across)
        node = None if cfg.node_size is None else node_group(cfg.node_size)
        ddp = nn.parallel.DistributedDataParallel(model, process_group=node)
        state = DiLoCo(ddp, optimizer, local=method.local, auto_choices=local_step_choices(cfg),
                       options=cfg.hook_options)  # fmt: skip
    elif method.baseline is None:  # (frozen-adamw: the hook exchanges its momentum after warm-up)
        ddp = nn.parallel.DistributedDataParallel(model)
        momentum = optimizer if isinstance(optimizer, MomentumSource) else None
        state = terngrad.ddp.register(ddp, options=cfg.hook_options, optimizer=momentum)
    else:  # PyTorch's own averaging: no hook state, nothing skipped, no bytes counted by us
        ddp = baselines.wrap(model, method.baseline, cfg.seed, method.powersgd_rank)
        state = None
    lr_schedule = make_schedule(cfg, optimizer, data.train_size)
    sampler = datasets.ShardSampler(data.train_size, rank, world, cfg.worker_batch, cfg.seed)

    start, elapsed, evaluation = 0, 0.0, None
    clock = StepClock(netdev.interface_from_env())
    checkpoint_path = checkpoints.resume_point(out, resume)
    if checkpoint_path is not None:
        ckpt = checkpoints.load_run(checkpoint_path, cfg)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        lr_schedule.load_state_dict(ckpt["schedule"])
        if state is not None:
            state.load_state_dict(ckpt["hook_states"][rank])
        torch.set_rng_state(ckpt["rng_states"][rank])  # dropout draws continue where they were
        start, elapsed = ckpt["step"], ckpt["seconds"]
        clock.train_seconds = ckpt.get("train_seconds", elapsed)
        clock.wire_bytes = (ckpt.get("wire_bytes") or [0] * world)[rank]
        evaluation = ckpt.get("evaluation")  # its step's record, if it made one
    if rank == 0:  # (the checkpoint's own evaluation written back if the metrics lost it)
        outputs.truncate_metrics(out / outputs.METRICS, start, evaluation)
    end = start if _reached(cfg, out, start, world) else cfg.steps
    if isinstance(state, terngrad.ddp.State) and start < end:  # every step in one layout
        state.settle_buckets(ddp, data.train_batch(sampler.batch(start), torch.Generator())[0])
    every = cfg.checkpoint_every or cfg.eval_every

    board = Board.open(out, start, state) if rank == 0 and start < end else Board()
    progress = Progress(cfg.steps, start, enabled=cfg.progress and rank == 0)
    metrics_path = out / outputs.METRICS
    began = time.perf_counter() - elapsed
    losses: list[float] = []
    accuracy = math.nan
    skipped_in_a_row = 0
    done = start
    noted_auto = False
    for step in range(start, end):
        record = None
        clock.start()
        x, y = data.train_batch(
            sampler.batch(step), torch.Generator().manual_seed(rank_seed(cfg.seed + step, rank))
        )
        optimizer.zero_grad(set_to_none=True)
        loss = models.loss(ddp(x), y)
        try:
            loss.backward()
        except RuntimeError as exc:  # DDP wraps the hook's error in its own text
            raise _hook_error(exc) from None
        if state is None or not state.last_step_skipped:
            optimizer.step()
            if not isinstance(state, DiLoCo):
                skipped_in_a_row = 0
            else:  # local steps: a skipped outer step (a rank's pseudo-gradient not finite)
                before = state.skipped_outer_steps
                if state.step():  # every local_steps-th: the outer step
                    lost = state.skipped_outer_steps > before
                    skipped_in_a_row = skipped_in_a_row + 1 if lost else 0
                if state.auto is not None and not noted_auto:
                    noted_auto = True
                    progress.note(_auto_words(state.auto))
        else:
            skipped_in_a_row += 1
        if skipped_in_a_row >= cfg.max_skipped_steps:  # every rank: same skip flags
            last = checkpoints.latest(out)
            what = "outer steps" if isinstance(state, DiLoCo) else "steps"
            raise TrainingFailed(
                f"{skipped_in_a_row} consecutive {what} (up to step {step + 1}) {DIVERGED} "
                "and were skipped; stopping. The last good "
                f"checkpoint is {last or 'none (none was written yet)'}; check the data "
                "and the learning rate (a new learning rate needs a new --out)"
            )
        lr = optimizer.param_groups[0]["lr"]  # this step's, before the schedule moves it
        lr_schedule.step()
        losses.append(loss.item())
        clock.stop()
        done = step + 1
        if (
            cfg.check_replicas_every
            and done % cfg.check_replicas_every == 0
            and (not isinstance(state, DiLoCo) or state.in_sync)
        ):
            check_replicas(model, step=done)
        if done % cfg.eval_every == 0 or done == cfg.steps:
            with state.consensus() if isinstance(state, DiLoCo) else contextlib.nullcontext():
                test_loss, accuracy = evaluate(model, data, rank, world)  # (overlap: the anchor)
            record = {
                "step": done,
                "loss": test_loss,
                "accuracy": accuracy,
                "train_loss": sum(losses) / len(losses),
                "lr": lr,
                "bytes_sent": state.stats.bytes_sent if state is not None else None,
                "seconds": time.perf_counter() - began,
                "train_seconds": clock.train_seconds,
                "wire_bytes": clock.mean_wire_bytes(),
            }
            if isinstance(data, text.TextSet):
                record["bits_per_char"] = text.bits_per_character(test_loss)
            losses = []
            if rank == 0:  # first the record, then the checkpoint (which holds it too): a
                with _writing(out, outputs.METRICS, done):  # crash between the two leaves a
                    outputs.append_metrics(metrics_path, record)  # record resuming drops
                with _writing(out, Board.NAME, done):
                    board.evaluation(record)
                progress.note(f"step {done}: {outputs.scores(record)}")
        reached = record is not None and outputs.reaches_target(
            record, cfg.stop_at_accuracy, cfg.stop_at_loss
        )
        if (done % every == 0 or done == cfg.steps or reached) and not skipped_in_a_row:
            seconds = time.perf_counter() - began  # (no checkpoints while steps are skipped)
            save_checkpoint(cfg, model, optimizer, lr_schedule, state, done, seconds, clock, record)
        sent = state.stats.bytes_sent if state is not None else clock.wire_bytes
        progress.update(done, loss.item(), accuracy, sent)
        with _writing(out, Board.NAME, done):
            board.step(done, loss.item(), lr, state)
        if reached:  # right after the evaluation that reached it, the same on every rank
            break
    progress.close()
    with _writing(out, Board.NAME, done):
        board.close()
    if isinstance(state, DiLoCo):  # overlap: the exchange in flight lands before the end (the
        state.finish()  # last checkpoint holds it in flight: an extended run resumes bitwise)
    final_loss = None  # (the last evaluation's record says it, unless no step was trained)
    if end <= start:  # nothing left to train: evaluate what the checkpoint holds
        final_loss, accuracy = evaluate(model, data, rank, world)
        began = time.perf_counter() - elapsed  # (that evaluation is not the run's time)
    wire = clock.mean_wire_bytes()  # a collective: every rank
    if rank != 0:
        return None
    stats = state.stats if state is not None else None
    seconds = time.perf_counter() - began
    with _writing(out, outputs.SUMMARY, done):
        return outputs.write_summary(cfg, stats, accuracy, seconds, clock.train_seconds, wire,
                                     done, final_loss)  # fmt: skip


def local_step_choices(cfg: TrainConfig) -> list[int] | None:
    """``--local-steps auto``: the values of ``H`` that divide the steps, the evaluation and
    the checkpoint periods (the replicas are one model only after an outer step)."""
    if cfg.method.local_steps != "auto":
        return None
    period = math.gcd(cfg.steps, cfg.eval_every, cfg.checkpoint_every or cfg.eval_every)
    return [h for h in range(1, period + 1) if period % h == 0]


def _auto_words(auto: dict[str, float]) -> str:
    return (
        f"local steps auto: H = {auto['local_steps']} (an inner step "
        f"{auto['inner_step_seconds']:.3g} s, an outer exchange {auto['exchange_seconds']:.3g} s, "
        f"at most {auto['max_comm_share']:g} of the time)"
    )


def _reached(cfg: TrainConfig, out: Path, start: int, world: int) -> bool:
    """Whether a resumed time-to-accuracy run reached its target before its checkpoint (the
    newest evaluation kept says so; rank 0 reads it and tells the others)."""
    if (cfg.stop_at_accuracy is None and cfg.stop_at_loss is None) or start == 0:
        return False
    flag = torch.zeros(1)
    if dist.get_rank() == 0:
        kept = outputs.read_metrics(out / outputs.METRICS)
        flag[0] = float(
            bool(kept) and outputs.reaches_target(kept[-1], cfg.stop_at_accuracy, cfg.stop_at_loss)
        )
    dist.broadcast(flag, 0)
    return bool(flag[0])


class StepClock:
    """Seconds spent in training steps (evaluations and checkpoints left out) and, inside the
    testbed, the bytes this rank's interface sent during them."""

    def __init__(self, interface: str | None) -> None:
        self.interface = interface
        self.train_seconds = 0.0
        self.wire_bytes = 0
        self._began, self._sent = 0.0, 0

    def start(self) -> None:
        self._began = time.perf_counter()
        if self.interface:
            self._sent = netdev.tx_bytes(self.interface)

    def stop(self) -> None:
        self.train_seconds += time.perf_counter() - self._began
        if self.interface:
            self.wire_bytes += netdev.tx_bytes(self.interface) - self._sent

    def all_wire_bytes(self) -> list[int] | None:
        """Every rank's count (a collective), ``None`` outside the testbed."""
        if not self.interface:
            return None
        counts = torch.tensor([0] * dist.get_world_size(), dtype=torch.int64)
        counts[dist.get_rank()] = self.wire_bytes
        dist.all_reduce(counts)
        return counts.tolist()

    def mean_wire_bytes(self) -> float | None:
        """Bytes per rank sent on the wire during the steps so far (a collective)."""
        counts = self.all_wire_bytes()
        return sum(counts) / len(counts) if counts else None


def _weights(model: nn.Module, state: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of the model: its state dict, or with local steps and overlap
    the anchor's (each replica then holds its own last window besides, which its DiLoCo state
    restores from the anchor and its pseudo-gradient in flight)."""
    if not isinstance(state, DiLoCo) or state.in_sync:
        return model.state_dict()
    with state.consensus():
        return {k: v.clone() for k, v in model.state_dict().items()}


def _hook_error(exc: RuntimeError) -> RuntimeError:
    """The terngrad error inside DDP's wrapping, as one line (else ``exc`` itself)."""
    message = str(exc)
    start = message.find("terngrad: rank ")
    if start < 0:
        return exc
    return CollectiveFailed(message[start:].splitlines()[0])


def _gathered_states(state: Any) -> list[Any] | None:
    """Every rank's hook state (or ``None``s: PyTorch's baselines keep none), on rank 0;
    ``None`` on the others. Local steps' replicated parts (:data:`REPLICATED_STATE`: the
    anchor and the outer optimizer, two of a state's three model-sized parts with momentum
    SGD) are not sent: rank 0 puts its own into every rank's state, which is what each rank
    would have sent, bit for bit. On a slow link the state was most of a checkpoint's time
    (LeNet at 10 Mbit/s: ~12 s, each rank's to every rank)."""
    own = state.state_dict() if state is not None else None
    rank, world = dist.get_rank(), dist.get_world_size()
    shared = REPLICATED_STATE if isinstance(state, DiLoCo) else ()
    sent = own
    if shared and rank != 0:
        sent = {k: v for k, v in own.items() if k not in shared}
    every: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(sent, every, dst=0)
    if every is None or not shared:
        return every
    return [{k: own[k] if k in shared else s[k] for k in own} for s in every]


def save_checkpoint(cfg, model, optimizer, schedule, state, step, seconds, clock, evaluation):
    """All ranks' hook states and generators go to rank 0, which writes one checkpoint
    atomically (with ``evaluation``, the record of this step's evaluation, if any) and keeps
    the newest ``cfg.keep_checkpoints`` (a collective). (PyTorch's
    PowerSGD keeps its error feedback in its own state, which is not saved: a resumed run
    starts it afresh.)"""
    hook_states = _gathered_states(state)
    wire = clock.all_wire_bytes()
    rng_states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rng_states, torch.get_rng_state())
    if dist.get_rank() == 0:
        out = Path(cfg.out)
        contents = checkpoints.training_checkpoint(
            cfg, step, seconds, clock.train_seconds, wire, _weights(model, state),
            optimizer.state_dict(), schedule.state_dict(), hook_states, rng_states, evaluation,
        )  # fmt: skip
        with _writing(out, checkpoints.path_for(out, step).name, step):
            checkpoints.save(checkpoints.path_for(out, step), contents)
            checkpoints.prune(out, cfg.keep_checkpoints)
    dist.barrier()
