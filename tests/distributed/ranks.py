"""Run a function on N real processes joined by gloo, and collect what each returns.

``run(fn, world_size, *args)`` starts ``world_size`` processes (forked from a fork server that
imported torch once); each initialises the default process group over TCP on loopback with a
timeout (a hung collective fails within it instead of waiting 30 minutes), uses one intra-op
thread, calls ``fn(rank, world_size, *args)`` and saves its return value; the parent returns
the list of them, rank by rank. ``fn`` must live at the top level of an importable module.
``timeout``: the default group's, in seconds, instead of :data:`TIMEOUT`.

``run_script(path, argv, world_size)`` runs a script as torchrun would start it on one node
(its environment, ``__main__``, its own process group), each rank forked from the same fork
server, and returns rank 0's standard output.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import runpy
import socket
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = datetime.timedelta(seconds=60)
#: how long :func:`run_script` waits for a script's ranks before it kills them and fails
SCRIPT_SECONDS = 300
#: what the fork server imports once for every rank it forks: torch and terngrad (the
#: trainer's launch and report too: conftest.py starts the server for the trainer's launches
#: as well), the serial kernels loaded, and the frameworks the integration tests' ranks train
#: with (seconds a rank)
PRELOAD = [
    __name__, "terngrad.ddp", "terngrad.train.launch", "terngrad.train.report",
    "terngrad.kernels.serial_loaded", "lightning.pytorch", "transformers.trainer",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, folder, fn, args, timeout=None):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=TIMEOUT if timeout is None else datetime.timedelta(seconds=timeout),
    )
    try:
        result = fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(folder, f"{rank}.pt"))


def run(fn, world_size: int, *args, timeout: float | None = None):
    # forked from a server that imported torch and terngrad and loaded the serial kernels once
    # (as the trainer's launcher does): no process imports torch or loads the kernels anew
    multiprocessing.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            _entry, args=(world_size, free_port(), folder, fn, args, timeout), nprocs=world_size,
            start_method="forkserver",
        )  # fmt: skip
        return [
            torch.load(os.path.join(folder, f"{r}.pt"), weights_only=False)
            for r in range(world_size)
        ]


def _script_entry(rank, world_size, port, folder, path, argv):
    """One rank of :func:`run_script`: torchrun's environment for a standalone node, the
    script as ``__main__``, its output into ``folder``."""
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(world_size), "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "tests",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "OMP_NUM_THREADS": "1",
    })  # fmt: skip
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    # the rank ends with os._exit once the script returns: its process group goes with it,
    # and gloo's own teardown, which in torch 2.13 sometimes aborts a process under torchrun
    # or, here, left one rank waiting for ever once the other had gone, never runs
    dist.destroy_process_group = lambda group=None: None
    sys.argv = [path, *argv]
    with open(os.path.join(folder, f"{rank}.out"), "w") as out, contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        out.flush()


def run_script(path, argv, world_size: int = 2) -> str:
    """Rank 0's standard output of script ``path`` with arguments ``argv`` on ``world_size``
    ranks started as torchrun starts them (``--standalone``), forked from the fork server
    (which imported torch, terngrad and the frameworks once: no rank imports them anew)."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as folder:
        context = mp.start_processes(
            _script_entry, args=(world_size, free_port(), folder, str(path), list(argv)),
            nprocs=world_size, start_method="forkserver", join=False,
        )  # fmt: skip
        deadline = time.monotonic() + SCRIPT_SECONDS
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for proc in context.processes:
                    proc.kill()
                raise TimeoutError(f"{path} {argv} ran over {SCRIPT_SECONDS} s")
        with open(os.path.join(folder, "0.out")) as out:
            return out.read()
