"""The tiers (``unit``, ``distributed``, ``e2e``: a marker each, set by the test's folder) and
the fixtures every tier shares; shared helpers are in support.py."""

import fcntl
import os
from pathlib import Path

import pytest
import torch
from support import SMALL_RUN

TIERS = ("unit", "distributed", "e2e")

if not torch.cuda.is_available():  # the Triton kernels run on CPU tensors through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels(request, tmp_path_factory):
    """Compile the numba kernels once, before any test spawns ranks that would each compile:
    the parallel build this process runs, and the serial one of the one-thread ranks that the
    distributed and end-to-end tiers start (not needed by the unit tier alone). Each build under
    its own file lock: with pytest-xdist's two workers, each compiles one build while the other
    compiles the other, then loads that one from numba's on-disk cache. Then (those tiers) the
    fork server every rank is forked from."""
    from terngrad.kernels import warm_up

    tiers = {m.name for item in request.session.items for m in item.iter_markers()}
    builds = [1, max(torch.get_num_threads(), 2)] if tiers - {"unit", "triton"} else [None]
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    shared = tmp_path_factory.getbasetemp().parent  # the same folder for every xdist worker
    for threads in builds[worker % len(builds) :] + builds[: worker % len(builds)]:
        with open(shared / f"numba-warm-up-{threads}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            warm_up(levels=True, threads=threads or torch.get_num_threads())
    if builds != [None]:  # the one fork server of this process, for ranks.run and the trainer
        _start_fork_server()


def _start_fork_server():
    """Start this process's fork server now, with everything that any test's ranks or
    trainer workers import (``ranks.PRELOAD``): whichever of them came first would otherwise
    start it with its own list, and the others' processes would import the rest each."""
    import multiprocessing
    from multiprocessing import forkserver

    from ranks import PRELOAD

    multiprocessing.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """``finished_run(steps, dest)``: a copy in ``dest`` of ``SMALL_RUN`` trained ``steps``
    (2 or 4) steps — trained once per session, copied for each test that alters it."""
    import shutil

    from terngrad.cli import main

    trained = {}
    for steps in (2, 4):
        out = tmp_path_factory.mktemp("finished") / f"run{steps}"
        assert main([*SMALL_RUN, "--steps", str(steps), "--out", str(out)]) == 0
        trained[steps] = out

    def copy(steps, dest):
        shutil.copytree(trained[steps], dest)
        return dest

    return copy


def pytest_collection_modifyitems(config, items):
    """Mark every test with its tier, the folder it lives in under tests/."""
    here = Path(__file__).parent
    for item in items:
        tier = Path(item.fspath).relative_to(here).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
