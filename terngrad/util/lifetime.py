"""A process that ends with the one that started it.

A training worker is started by a launcher (``terngrad train``'s, through a fork server, or
torchrun's agent, or the testbed's): when the launcher is killed with a signal it cannot catch,
the workers would train on, write checkpoints into a folder nobody holds any more, and wait in
their collectives. :func:`exit_with` watches the launcher through a pidfd (which names that one
process, not a PID that may be reused) and ends this process as soon as the launcher is gone.
"""

from __future__ import annotations

import os
import select
import sys
import threading

#: the status of a worker that stopped because its launcher was gone
ORPHANED = 1


def exit_with(pid: int, who: str) -> None:
    """End this process (status :data:`ORPHANED`, one line on stderr) as soon as process
    ``pid`` ends, ``who`` naming it in that line; at once if it has ended already. A daemon
    thread waits on the process's pidfd: nothing is polled."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        _orphaned(pid, who)
        return

    def watch() -> None:
        select.select([fd], [], [])  # readable once the process has exited
        _orphaned(pid, who)

    threading.Thread(target=watch, name="terngrad-exit-with", daemon=True).start()


def _orphaned(pid: int, who: str) -> None:
    sys.stderr.write(f"terngrad: PID {os.getpid()}: {who} (PID {pid}) is gone; stopping\n")
    sys.stderr.flush()
    os._exit(ORPHANED)  # at once, from this thread: the run is over
