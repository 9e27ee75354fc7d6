"""What a network interface really sent: the kernel's counters, read from this process's
network namespace (``/sys/class/net``, ``/proc/net/snmp``). The testbed of
:mod:`terngrad.bench.network` names each rank's interface in :data:`INTERFACE_ENV`."""

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
