"""Run a function on N real processes joined by gloo, and collect what each returns.

``run(fn, world_size, *args)`` starts ``world_size`` processes (forked from a fork server that
imported torch once); each initialises the default process group over TCP on loopback with a
timeout (a hung collective fails within it instead of waiting 30 minutes), uses one intra-op
thread, calls ``fn(rank, world_size, *args)`` and saves its return value; the parent returns
the list of them, rank by rank. ``fn`` must live at the top level of an importable module.
``timeout``: the default group's, in seconds, instead of :data:`TIMEOUT`.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = datetime.timedelta(seconds=60)


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
    # forked from a server that imported torch and terngrad once (as the trainer's launcher
    # does): no process imports torch anew
    multiprocessing.set_forkserver_preload([__name__, "terngrad.ddp"])
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            _entry, args=(world_size, free_port(), folder, fn, args, timeout), nprocs=world_size,
            start_method="forkserver",
        )  # fmt: skip
        return [
            torch.load(os.path.join(folder, f"{r}.pt"), weights_only=False)
            for r in range(world_size)
        ]
