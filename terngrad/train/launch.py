"""Starting a training run: ``launch(config)`` checks everything that can be checked before a
process starts, holds the run's folder (:func:`terngrad.train.run_folder.claim`), and starts
``config.workers`` processes on this machine (forked from a preloaded server, gloo over
loopback) or, with ``nnodes``/``rdzv_endpoint``, hands them to ``torchrun``'s elastic agent for
a real cluster. Each process runs :func:`terngrad.train.loop.train_worker`.

``python -m terngrad.train.launch CONFIG`` is one worker started by torchrun, or by the testbed
of :mod:`terngrad.experiments.time_to_accuracy` (environment rendezvous); CONFIG is the run folder's
``config.json`` (:func:`terngrad.train.run_folder.write_run_config`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import multiprocessing
import multiprocessing.reduction
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from terngrad import kernels
from terngrad.quantize.levels import LevelQuantizer
from terngrad.train import checkpoints, run_folder
from terngrad.train import data as datasets
from terngrad.train.config import TrainConfig
from terngrad.train.loop import train_worker
from terngrad.train.setup import load_data
from terngrad.util import lifetime
from terngrad.util.threads import use_threads

#: processes one machine may run per core: beyond, the ranks mostly wait on each other
MAX_WORKERS_PER_CORE = 8
#: seconds the other workers get to stop after one failed, before SIGTERM, then as many
#: before SIGKILL (a stopped or stuck process takes no SIGTERM; torch waits 30 s by default)
STOP_GRACE = 2.0


def check_launch(
    cfg: TrainConfig, nnodes: int = 1, node_rank: int | None = None,
    rdzv_endpoint: str | None = None, max_restarts: int = 0,
) -> None:  # fmt: skip
    """The checks of a launch that need neither the data nor the folder."""
    if max_restarts and nnodes == 1 and rdzv_endpoint is None:
        raise ValueError(
            "--max-restarts needs torchrun's agent (--nnodes or --rdzv-endpoint); on one "
            "machine, run the same command again to resume"
        )
    if cfg.workers % nnodes:
        raise ValueError(f"--workers {cfg.workers} does not split evenly over {nnodes} nodes")
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ValueError(
            f"--node-rank {node_rank} is not a node of a {nnodes}-node run: give 0 to {nnodes - 1}"
        )
    local, cores = cfg.workers // nnodes, os.cpu_count() or 1
    if local > MAX_WORKERS_PER_CORE * cores:
        raise ValueError(
            f"--workers {cfg.workers} would start {local} processes on this machine's {cores} "
            f"cores (at most {MAX_WORKERS_PER_CORE * cores}: {MAX_WORKERS_PER_CORE} a core); "
            "spread them over machines with --nnodes"
        )
    if rdzv_endpoint is not None:
        host, _, port = rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"--rdzv-endpoint {rdzv_endpoint!r} is not HOST:PORT (a port from 1 to 65535)"
            )
    if cfg.kernels == "triton" and cfg.method.baseline is None:
        raise ValueError(
            "--kernels triton runs on CUDA tensors, and terngrad train trains on the CPU: "
            "use --kernels auto, numba or torch"
        )


def check_data(cfg: TrainConfig) -> None:
    """The data set is there, and each worker's shard holds at least one batch."""
    data = load_data(cfg, synthetic_size=1)
    size = datasets.SYNTHETIC_SIZE if cfg.dataset == "synthetic" else data.train_size
    shard = size // cfg.workers
    if cfg.worker_batch > shard:
        raise ValueError(
            f"a batch of {cfg.worker_batch} per worker is larger than each worker's shard of "
            f"{cfg.dataset} ({shard} of its {size} training examples, over {cfg.workers} "
            f"workers): give a batch of at most {shard}, or fewer workers"
        )


def warm_up_kernels(configs: list[TrainConfig], local_workers: int | None = None) -> None:
    """Compile the fused kernels the runs will use once, here, so that every worker loads them
    from numba's cache instead of compiling them at its first step: the build for the threads
    each worker will run (``local_workers`` on this machine; default: each run's workers)."""
    hooked = [c for c in configs if c.method.baseline is None and c.kernels in ("auto", "numba")]
    for threads in sorted({_threads(c, local_workers or c.workers) for c in hooked}):
        levels = any(isinstance(c.hook_options.make_quantizer(), LevelQuantizer) for c in hooked)
        kernels.warm_up(levels=levels, threads=threads)


def launch(
    cfg: TrainConfig,
    *,
    nnodes: int = 1,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    resume: str | None = None,
    max_restarts: int = 0,
) -> dict[str, Any] | None:
    """Train with ``cfg.workers`` processes on this machine, or hand them to torchrun's agent
    when ``nnodes > 1`` or a rendezvous endpoint is given (it restarts the workers up to
    ``max_restarts`` times when one fails; they resume from the newest checkpoint). Starts from
    checkpoint ``resume`` if given, else from the newest in ``cfg.out``. Every check runs
    before anything is written; the run holds ``cfg.out`` until it ends. Returns rank 0's
    summary (``None`` on the other nodes of a cluster)."""
    with _Signals() as signals:  # (from here: SIGINT stops the run, even if it was ignored)
        return _launch(cfg, signals, nnodes, node_rank, rdzv_endpoint, resume, max_restarts)


def _launch(
    cfg: TrainConfig, signals: _Signals, nnodes: int, node_rank: int | None,
    rdzv_endpoint: str | None, resume: str | None, max_restarts: int,
) -> dict[str, Any] | None:  # fmt: skip
    check_launch(cfg, nnodes, node_rank, rdzv_endpoint, max_restarts)
    check_data(cfg)  # a missing data set fails here, once, with its one-line message
    run_folder.prepare_out(cfg, resume)
    lock = run_folder.LOCK if nnodes == 1 else f".terngrad.{socket.gethostname()}.lock"
    with run_folder.claim(Path(cfg.out), lock=lock) as lock_fd:
        run_folder.prepare_out(cfg, resume)  # again, now that no other run can change it
        run_folder.remove_leftovers(Path(cfg.out))
        run_folder.seed_metrics(cfg, resume)
        config_file = run_folder.write_run_config(cfg, resume)
        warm_up_kernels([cfg], cfg.workers // nnodes)
        if nnodes == 1 and rdzv_endpoint is None:
            with tempfile.TemporaryDirectory() as folder:
                _spawn(cfg, folder, resume, lock_fd, signals)
                return json.loads(Path(folder, "summary.json").read_text())
        from torch.distributed import run as torchrun

        args = [
            f"--nnodes={nnodes}",
            f"--nproc-per-node={cfg.workers // nnodes}",
            f"--max-restarts={max_restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint or '127.0.0.1:29400'}",
        ]
        if node_rank is not None:
            args.append(f"--node-rank={node_rank}")
        from torch.distributed.elastic.multiprocessing.api import SignalException

        try:  # the agent stops its workers on SIGTERM, SIGINT, SIGHUP, SIGQUIT
            torchrun.main([*args, "-m", __name__, str(config_file)])
        except SignalException as exc:
            raise Stopped(exc.sigval) from None
        summary = Path(cfg.out) / "summary.json"
        return json.loads(summary.read_text()) if summary.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads(cfg: TrainConfig, local_workers: int) -> int:
    return cfg.workers_threads or max(1, (os.cpu_count() or 1) // local_workers)


class Stopped(BaseException):
    """The launcher was sent a signal (SIGTERM, SIGHUP; SIGINT arrives as
    ``KeyboardInterrupt``): its workers are stopped, then this ends the launch."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Signals:
    """The launch's own SIGTERM, SIGHUP and SIGINT (set in the main thread, where a handler
    can be; the handlers before are put back at the end). Each raises :class:`Stopped` (SIGINT
    ``KeyboardInterrupt``) whatever the launcher inherited: a shell without job control starts
    a background command with SIGINT ignored, and Python then leaves it ignored — the launcher
    would train on, its workers with it. Inside :meth:`held` (while the workers are being
    started, or stopped) a signal is kept and raised when the block ends; once one has been
    raised the launch is stopping, and later ones change nothing."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self) -> None:
        self._before: dict[int, Any] = {}
        self._held = 0
        self._pending: int | None = None
        self._stopping = False

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            self._before = {s: signal.signal(s, self._received) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._before.items():
            signal.signal(s, handler)

    def _received(self, signum: int, frame: Any) -> None:
        if self._stopping:
            return
        if self._pending is None:
            self._pending = signum
        if not self._held:
            self._raise()

    def _raise(self) -> None:
        signum, self._pending, self._stopping = self._pending, None, True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A signal that arrives in the block is raised when the block ends, not inside it."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._pending is not None:
                self._raise()


class _HeldFd:
    """A file descriptor a worker inherits through the fork server (a duplicate of the same
    open file, so a ``flock`` on it is held by the worker too)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _HeldFd._received, (multiprocessing.reduction.DupFd(self.fd),)

    @staticmethod
    def _received(dup: Any) -> _HeldFd:
        return _HeldFd(dup.detach())


def _spawned_worker(
    rank: int, cfg: TrainConfig, port: int, folder: str, resume: str | None, launcher: int,
    lock: _HeldFd,
) -> None:  # fmt: skip
    # ``lock`` stays open until this process exits: the folder is held until then
    lifetime.exit_with(launcher, "the launcher")
    use_threads(_threads(cfg, cfg.workers))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",  # loopback: nothing outside this machine joins
        rank=rank,
        world_size=cfg.workers,
        timeout=datetime.timedelta(seconds=cfg.timeout),
    )
    try:
        summary = train_worker(cfg, resume)
    finally:
        dist.destroy_process_group()
    if summary is not None:
        Path(folder, "summary.json").write_text(json.dumps(summary))


def _spawn(cfg: TrainConfig, folder: str, resume: str | None, lock_fd: int,
           signals: _Signals) -> None:  # fmt: skip
    """``torch.multiprocessing.spawn``, but the launcher owns its workers' lifetime: workers
    that do not stop are killed within ``2 * STOP_GRACE`` seconds once one has failed, or once
    the launcher is sent SIGTERM, SIGHUP or SIGINT (``signals``: :class:`Stopped`,
    ``KeyboardInterrupt``); a signal while the workers start is acted on once all have
    started, one while they are being stopped changes nothing. A worker ends by itself when
    the launcher is gone (even SIGKILLed) and holds the folder's lock (``lock_fd``) until it
    has. Torch's warnings are kept quiet: the CLI says it in one line."""
    log = logging.getLogger("torch.multiprocessing.spawn")
    level = log.level
    log.setLevel(logging.ERROR)
    context = None
    try:
        with signals.held():  # (every worker started, and then a signal that came is raised)
            # a fork server that has imported torch, terngrad and the plots (rank 0 draws
            # the curves) once, for every launch of this process: each worker is forked from
            # it at once instead of importing torch anew (seconds a worker), with the serial
            # kernels loaded where a worker runs one thread (half a second a worker); the
            # server is a fresh interpreter, so no thread of this process is ever forked
            preload = [__name__, "terngrad.train.report"]
            if _threads(cfg, cfg.workers) == 1:
                preload.append("terngrad.kernels.serial_loaded")
            multiprocessing.set_forkserver_preload(preload)
            context = torch.multiprocessing.start_processes(
                _spawned_worker, nprocs=cfg.workers, join=False, start_method="forkserver",
                args=(cfg, _free_port(), folder, resume, os.getpid(), _HeldFd(lock_fd)),
            )  # fmt: skip
        while not context.join(grace_period=STOP_GRACE):
            pass
    except (Stopped, KeyboardInterrupt):
        if context is not None:
            with signals.held():  # (a second signal cannot cut the stopping short)
                _stop(context.processes)
        raise
    finally:
        log.setLevel(level)


def _stop(processes: list[multiprocessing.Process]) -> None:
    """SIGTERM to every live worker, then SIGKILL to those still alive ``STOP_GRACE`` seconds
    later; returns when all are gone. (Should the launcher itself be killed meanwhile, the
    workers end by themselves: :func:`terngrad.util.lifetime.exit_with`.)"""
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.kill()
            proc.join()


def _torchrun_worker(config_file: str) -> None:
    """Entry point of a worker that torchrun (or the testbed) started: environment
    rendezvous."""
    lifetime.exit_with(os.getppid(), "the process that started this worker")
    cfg, resume = run_folder.read_run_config(config_file)
    # a restarted worker (torchrun --max-restarts) goes on from the newest checkpoint
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    restarted = restarted and checkpoints.latest(Path(cfg.out)) is not None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.workers))
    use_threads(_threads(cfg, local))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg.timeout))
    try:
        train_worker(cfg, None if restarted else resume)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _torchrun_worker(sys.argv[1])
