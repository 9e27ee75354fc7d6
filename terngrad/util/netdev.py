"""What a network interface really sent: the kernel's counters, read from this process's
network namespace (``/sys/class/net``, ``/proc/net/snmp``). The testbed of
:mod:`terngrad.bench.network` names each rank's interface in :data:`INTERFACE_ENV`, and
shapes its links to rates written as :func:`rate_bits` reads them."""

from __future__ import annotations

import os
from pathlib import Path

INTERFACE_ENV = "TG_INTERFACE"


def interface_from_env() -> str | None:
    """The interface the testbed gave this process, or ``None`` outside the testbed."""
    return os.environ.get(INTERFACE_ENV) or None


def tx_bytes(interface: str) -> int:
    """Bytes ``interface`` has sent (IP packets, headers included)."""
    return int(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())


def tcp_retransmits() -> int:
    """TCP segments this network namespace has retransmitted (``RetransSegs``)."""
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    names, values = (row for row in lines if row and row[0] == "Tcp:")
    return int(values[names.index("RetransSegs")])


def rate_bits(bandwidth: str) -> int | None:
    """Bits per second of ``100mbit``/``1gbit``/``10gbit``-style rates; ``None`` for
    ``unlimited``; ``ValueError`` for anything else."""
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
    text = bandwidth.strip().lower()
    if text == "unlimited":
        return None
    for unit, scale in units.items():
        number = text.removesuffix(unit)
        if number != text:
            try:
                value = float(number)
            except ValueError:
                break
            if value > 0:
                return int(value * scale)
    raise ValueError(
        f"bandwidth must be a rate such as 100mbit, 1gbit, 2.5gbit or 'unlimited', "
        f"got {bandwidth!r}"
    )
