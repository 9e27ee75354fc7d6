"""A bandwidth-limited cluster on one machine, for ``terngrad bench network`` and ``terngrad
bench accuracy``.

N network namespaces ``tg-r0 .. tg-r{N-1}``, one per node (a rank, or ``ranks_per_node``
ranks talking inside it unshaped), each joined by a veth pair to a bridge in a hub namespace
``tg-hub``, both ends of every link shaped with ``tc ... tbf`` to the given rate — a switch
with N ports of that speed. Addresses ``10.213.0.{n+1}/24``, routed nowhere else. It needs
root and iproute2.

What it makes it records first (``/run/terngrad/testbed-<prefix>.json``: its PID and the
namespaces, each written down before it is made), and it removes exactly that — every process
in those namespaces killed first — on exit, on Ctrl-C, SIGTERM and on error;
``terngrad bench network --cleanup`` removes what a killed run recorded (:func:`cleanup`), never
a namespace it did not make, nor one of a run still alive. :meth:`Testbed.run` starts one
process per rank in its namespace (``python -m <module>``, torch's environment rendezvous at
rank 0's address) and waits for all; a rank ends by itself when the process that started it is
gone (:func:`terngrad.util.lifetime.exit_with`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terngrad.util import netdev
from terngrad.util.files import atomic_write_text, read_json
from terngrad.util.netdev import rate_bits

PREFIX = "tg"
SUBNET = "10.213.0"
PORT = 29517
BANDWIDTHS = ("100mbit", "1gbit", "10gbit", "unlimited")
#: where a testbed records what it made (a tmpfs, emptied at boot like the namespaces)
RECORDS = Path("/run/terngrad")
#: seconds the processes of a namespace get to die after SIGKILL before its removal fails
KILL_WAIT = 5.0


class TestbedUnavailable(RuntimeError):
    """The machine cannot host the testbed (not root, no iproute2, no namespaces)."""


class TestbedRefused(TestbedUnavailable, ValueError):
    """What is in the way is the user's to clear (namespaces with the testbed's names that it
    did not make, a killed run's testbed, one in use): a ``ValueError`` too, so the command
    line says it in one line with status 2, as for any input of the user's."""


class BenchFailed(RuntimeError):
    """A rank failed or the run outlived its timeout (the ranks' logs say more)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ip/tc command; ``TestbedUnavailable`` with its message if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise TestbedUnavailable(
            f"'{' '.join(argv)}' failed: {done.stderr.strip() or f'exit {done.returncode}'}"
        )
    return done


def _namespaces() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _ours(name: str, prefix: str) -> bool:
    """True for the names this tool gives: ``{prefix}-hub`` and ``{prefix}-r<rank>``."""
    rest = name.removeprefix(f"{prefix}-")
    return rest != name and (rest == "hub" or (rest[:1] == "r" and rest[1:].isdigit()))


def cleanup(prefix: str = PREFIX) -> tuple[list[str], list[str]]:
    """Remove what a killed testbed with ``prefix`` left: the namespaces its record names,
    every process in them killed first, then the record. Returns the namespaces removed, and
    those that have the testbed's names but no record made (left alone: another tool's, or an
    older version's; ``ip netns delete NAME`` removes one). ``TestbedUnavailable`` if the
    testbed's owner still runs (it removes its testbed itself) or a namespace cannot be
    deleted."""
    record = _read_record(prefix)
    removed: list[str] = []
    if record is not None:
        if record["pid"] != os.getpid() and _alive(record):
            raise TestbedUnavailable(
                f"the testbed {prefix}-* is in use by PID {record['pid']}, a terngrad bench "
                "still running: stop it (it removes its testbed itself), or wait for it"
            )
        removed = _remove(record["namespaces"])
        _record_path(prefix).unlink(missing_ok=True)
    foreign = [name for name in _namespaces() if _ours(name, prefix)]
    return removed, foreign


def _record_path(prefix: str) -> Path:
    return RECORDS / f"testbed-{prefix}.json"


def _read_record(prefix: str) -> dict[str, Any] | None:
    """The record of the testbed ``prefix`` (``None`` if there is none); a damaged one is a
    ``TestbedUnavailable`` naming it."""
    path = _record_path(prefix)
    if not path.exists():
        return None
    try:
        record = read_json(path, "testbed record", limit=1 << 20)
    except ValueError as exc:
        raise TestbedUnavailable(f"{exc}: delete it and the namespaces it names") from None
    names = record.get("namespaces") if isinstance(record, dict) else None
    if not (isinstance(names, list) and all(isinstance(n, str) and _ours(n, prefix) for n in names)
            and isinstance(record.get("pid"), int)):  # fmt: skip
        raise TestbedUnavailable(
            f"testbed record {path} is damaged: delete it and the namespaces it names"
        )
    return record


def _write_record(prefix: str, namespaces: list[str]) -> None:
    RECORDS.mkdir(parents=True, exist_ok=True)
    me = os.getpid()
    record = {"pid": me, "started": _start_time(me), "namespaces": namespaces}
    atomic_write_text(_record_path(prefix), json.dumps(record) + "\n")


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), ``None`` if there is none: with
    the PID, it names one process even after the PID is reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(record: dict[str, Any]) -> bool:
    started = _start_time(record["pid"])
    return started is not None and started == record.get("started")


def _remove(namespaces: list[str]) -> list[str]:
    """Kill every process in each of ``namespaces`` that exists, then delete it; the names
    deleted. ``TestbedUnavailable`` if one could not be deleted (not root?)."""
    present = [name for name in namespaces if name in set(_namespaces())]
    for name in present:
        _kill_processes(name)
    failed = [n for n in present if _run("ip", "netns", "delete", n, check=False).returncode]
    if failed:
        raise TestbedUnavailable(f"could not delete namespaces {failed} (run as root)")
    return present


def _kill_processes(namespace: str) -> None:
    """SIGKILL every process in ``namespace`` (a rank its launcher left), and wait until they
    are gone (a namespace deleted under a live process lives on, nameless, with it)."""
    deadline = time.monotonic() + KILL_WAIT
    while pids := _pids(namespace):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # (gone meanwhile)
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise TestbedUnavailable(f"processes {pids} in namespace {namespace} do not die")
        time.sleep(0.05)


def _pids(namespace: str) -> list[int]:
    return [int(p) for p in _run("ip", "netns", "pids", namespace, check=False).stdout.split()]


def check_host() -> None:
    """``TestbedUnavailable`` naming what is missing to build the testbed here."""
    if os.geteuid() != 0:
        raise TestbedUnavailable(
            "terngrad bench network needs root (it creates network namespaces and shapes "
            "links with tc): run it with sudo, or as root in a container with CAP_NET_ADMIN"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedUnavailable(
                f"terngrad bench network needs the '{tool}' command from iproute2: install "
                "iproute2 (Debian/Ubuntu: apt install iproute2)"
            )


@dataclass
class Testbed:
    """``ranks`` ranks in namespaces on a bridge, links shaped to ``bandwidth`` (the ranks of
    a node, ``ranks_per_node``, share one: their own traffic stays inside, unshaped); a
    context manager that builds it on entry and always tears it down."""

    ranks: int
    bandwidth: str = "1gbit"
    prefix: str = PREFIX
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        if not 2 <= self.ranks <= 8:
            raise ValueError(f"the testbed has 2 to 8 ranks, got {self.ranks}")
        k = self.ranks_per_node
        if not 1 <= k < self.ranks or self.ranks % k:
            raise ValueError(
                f"ranks-per-node {k} must divide the testbed's {self.ranks} ranks into at "
                "least 2 nodes"
            )
        self.rate = rate_bits(self.bandwidth)

    @property
    def nodes(self) -> int:
        return self.ranks // self.ranks_per_node

    # the namespace, link and address of ``rank``'s node
    def namespace(self, rank: int) -> str:
        return f"{self.prefix}-r{rank // self.ranks_per_node}"

    def interface(self, rank: int) -> str:
        return f"{self.prefix}v{rank // self.ranks_per_node}"

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank // self.ranks_per_node + 1}"

    def check(self) -> None:
        """Every refusal of :meth:`__enter__`, nothing built: ``TestbedUnavailable`` for what
        the machine lacks, :class:`TestbedRefused` for namespaces in the way."""
        check_host()
        record = _read_record(self.prefix)
        if record is not None:
            raise TestbedRefused(
                f"the testbed {self.prefix}-* is in use by PID {record['pid']}, a terngrad "
                "bench still running: wait for it, or stop it"
                if _alive(record)
                else f"a killed run (PID {record['pid']}) left its testbed {self.prefix}-*: "
                "remove it with 'terngrad bench network --cleanup'"
            )
        foreign = [name for name in _namespaces() if _ours(name, self.prefix)]
        if foreign:
            raise TestbedRefused(
                f"namespaces {', '.join(foreign)} already exist and terngrad's testbed did not "
                "make them (no record of them): delete them with 'ip netns delete NAME' if they "
                "are yours to delete"
            )

    def __enter__(self) -> Testbed:
        self.check()
        self._made: list[str] = []
        self._signals = {
            sig: signal.signal(sig, self._interrupted) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore_signals()
        cleanup(self.prefix)

    def _restore_signals(self) -> None:
        for sig, handler in getattr(self, "_signals", {}).items():
            signal.signal(sig, handler)
        self._signals = {}

    def _interrupted(self, signum: int, frame: Any) -> None:
        self._restore_signals()  # a second signal during the teardown acts as usual
        cleanup(self.prefix)
        raise KeyboardInterrupt(f"signal {signum}: testbed removed")

    def _add_namespace(self, name: str) -> None:
        """Record ``name``, then make it: a kill between the two leaves a record of a
        namespace that is not there, which :func:`cleanup` passes over."""
        self._made.append(name)
        _write_record(self.prefix, self._made)
        _run("ip", "netns", "add", name)

    def _shape(self, namespace: str, device: str) -> None:
        if self.rate is None:
            return
        burst = max(self.rate // 8 // 100, 65536)  # 10 ms of traffic, at least 64 KB
        _run("ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device, "root",
             "tbf", "rate", str(self.rate), "burst", str(burst), "latency", "50ms")  # fmt: skip

    def _build(self) -> None:
        hub = f"{self.prefix}-hub"
        self._add_namespace(hub)
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        for r in range(0, self.ranks, self.ranks_per_node):  # (a node's first rank)
            node = r // self.ranks_per_node
            ns, inner, outer = self.namespace(r), self.interface(r), f"{self.prefix}p{node}"
            self._add_namespace(ns)
            _run("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name",
                 outer, "netns", hub)  # fmt: skip
            _run("ip", "-n", ns, "addr", "add", f"{self.address(r)}/24", "dev", inner)
            _run("ip", "-n", ns, "link", "set", inner, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", hub, "link", "set", outer, "master", "br0")
            _run("ip", "-n", hub, "link", "set", outer, "up")
            self._shape(ns, inner)
            self._shape(hub, outer)

    def launch(
        self,
        rank: int,
        argv: Sequence[str],
        log: Path,
        module: str = "terngrad.bench.network",
        port: int = PORT,
    ) -> subprocess.Popen:
        """Start ``python -m <module> <argv>`` as rank ``rank`` in its namespace, its output
        into ``log``; ``torch.distributed``'s environment rendezvous at rank 0's address and
        ``port`` (``LOCAL_WORLD_SIZE``: every rank shares this machine's cores)."""
        env = {
            **os.environ,
            "MASTER_ADDR": self.address(0),
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(self.ranks),
            "LOCAL_WORLD_SIZE": str(self.ranks),
            "GLOO_SOCKET_IFNAME": self.interface(rank),
            netdev.INTERFACE_ENV: self.interface(rank),
            "OMP_NUM_THREADS": "1",
        }
        cmd = ["ip", "netns", "exec", self.namespace(rank), sys.executable, "-m", module,
               *argv]  # fmt: skip
        with log.open("w") as out:  # the child keeps its own descriptor
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def run(
        self,
        argv: Sequence[str],
        logs: Path,
        timeout: float,
        module: str = "terngrad.bench.network",
        port: int = PORT,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """Every rank runs ``python -m <module> <argv>`` (:meth:`launch`; logs
        ``logs/rank<r>.log``) until all have finished, calling ``tick`` now and then;
        ``BenchFailed`` when one fails or ``timeout`` seconds pass, the others killed."""
        procs: list[subprocess.Popen] = []
        try:
            for r in range(self.ranks):
                procs.append(self.launch(r, argv, logs / f"rank{r}.log", module, port))
            wait_all(procs, time.monotonic() + timeout, logs, tick)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise BenchFailed(f"ranks {failed} failed; their logs: {logs}/rank*.log")


def wait_all(
    procs: list[subprocess.Popen],
    deadline: float,
    out: Path,
    tick: Callable[[], None] | None = None,
) -> None:
    """Wait for every rank, calling ``tick`` now and then (progress); ``BenchFailed`` as soon
    as one fails or the deadline passes (the others would otherwise wait for it until gloo's
    timeout)."""
    while any(p.poll() is None for p in procs):
        if tick is not None:
            tick()
        failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            raise BenchFailed(f"ranks {failed} failed; their logs: {out}/rank*.log")
        if time.monotonic() > deadline:
            raise BenchFailed(f"the ranks did not finish in time; their logs: {out}/rank*.log")
        time.sleep(0.2)
