"""The collectives the exchanges use, on one process group, each counting its bytes.

Byte counts come from the tensors handed to each collective, under the data movement that
collective needs at this rank (N ranks):

==================  =====================================  =====================================
collective          sent by this rank                      received by this rank
==================  =====================================  =====================================
all-reduce (ring)   2 (N-1)/N x tensor bytes               2 (N-1)/N x tensor bytes
reduce-scatter      (N-1)/N x input bytes                  (N-1)/N x input bytes
all-to-all          the chunks addressed to other ranks    the chunks from other ranks
all-gather          (N-1) x its chunk (padded to the max)  (N-1) x the padded chunk size
gather to root      its chunk (root: nothing)              nothing (root: the N-1 other chunks)
broadcast           root: (N-1) x tensor bytes             non-root: tensor bytes
==================  =====================================  =====================================

The all-reduce figure is what a bandwidth-optimal ring moves (reduce-scatter then all-gather),
the convention PyTorch's own hooks are measured by in this project as well, so comparisons are
like for like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class ByteCounter:
    """Running totals of bytes this rank sent and received through a :class:`Link`, and of the
    point-to-point messages it sent (a ring all-reduce 2 (N-1), an all-to-all or a ring
    all-gather N-1, a gather one from each non-root rank, a broadcast N-1 from its root)."""

    sent: int = 0
    received: int = 0
    messages: int = 0
    #: wall-clock seconds spent inside the collectives (waiting included)
    seconds: float = 0.0

    def add(self, sent: int, received: int, messages: int) -> None:
        self.sent += int(sent)
        self.received += int(received)
        self.messages += int(messages)

    @contextmanager
    def timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Link:
    """Counted collectives on ``group`` (the default group if ``None``), blocking calls."""

    def __init__(
        self, group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        #: shared by several links (of several groups) that count as one exchange
        self.counter = counter if counter is not None else ByteCounter()

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM):
        """In-place all-reduce; returns ``tensor``."""
        ring = 2 * (self.size - 1) * _nbytes(tensor) // self.size
        self.counter.add(ring, ring, 2 * (self.size - 1))
        with self.counter.timed():
            dist.all_reduce(tensor, op=op, group=self.group)
        return tensor

    def start_all_reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM
    ) -> Callable[[], torch.Tensor]:
        """Start an in-place all-reduce and return at once; the returned function waits for it
        (its seconds counted then) and returns ``tensor``. Collectives of other groups may run
        meanwhile."""
        ring = 2 * (self.size - 1) * _nbytes(tensor) // self.size
        self.counter.add(ring, ring, 2 * (self.size - 1))
        work = dist.all_reduce(tensor, op=op, group=self.group, async_op=True)

        def wait() -> torch.Tensor:
            with self.counter.timed():
                work.wait()
            return tensor

        return wait

    def reduce_scatter(
        self, output: torch.Tensor, tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM
    ) -> torch.Tensor:
        """Reduce ``tensor`` (``N x output.numel()`` elements) over the ranks and give rank k
        its k-th part, in ``output``; returns ``output``."""
        ring = (self.size - 1) * _nbytes(tensor) // self.size
        self.counter.add(ring, ring, self.size - 1)
        with self.counter.timed():
            dist.reduce_scatter_single(output, tensor, op=op, group=self.group)
        return output

    def all_to_all(self, chunks: list[torch.Tensor], recv_sizes: list[int]) -> list[torch.Tensor]:
        """Send ``chunks[j]`` (uint8) to rank j; receive ``recv_sizes[j]`` bytes from rank j."""
        send = torch.cat([c.reshape(-1) for c in chunks])
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=send.device)
        send_sizes = [c.numel() for c in chunks]
        me = self.rank
        self.counter.add(
            sum(send_sizes) - send_sizes[me], sum(recv_sizes) - recv_sizes[me], self.size - 1
        )
        with self.counter.timed():
            dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=self.group)
        return list(recv.split(recv_sizes))

    def all_gather(self, chunk: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        """Every rank's uint8 ``chunk``; rank j's is ``sizes[j]`` bytes (padded to the largest
        for the collective, which needs equal sizes)."""
        width = max(sizes)
        padded = torch.zeros(width, dtype=torch.uint8, device=chunk.device)
        padded[: chunk.numel()] = chunk.reshape(-1)
        out = torch.empty(self.size * width, dtype=torch.uint8, device=chunk.device)
        self.counter.add((self.size - 1) * width, (self.size - 1) * width, self.size - 1)
        with self.counter.timed():
            dist.all_gather_single(out, padded, group=self.group)
        return [out[j * width : j * width + n] for j, n in enumerate(sizes)]

    def gather(self, chunk: torch.Tensor, root: int) -> list[torch.Tensor] | None:
        """Every rank's equally sized uint8 ``chunk`` at ``root`` (``None`` elsewhere)."""
        chunk = chunk.reshape(-1)
        if self.rank == root:
            out = [torch.empty_like(chunk) for _ in range(self.size)]
            self.counter.add(0, (self.size - 1) * _nbytes(chunk), 0)
            with self.counter.timed():
                dist.gather(chunk, out, dst=self._global(root), group=self.group)
            return out
        self.counter.add(_nbytes(chunk), 0, 1)
        with self.counter.timed():
            dist.gather(chunk, None, dst=self._global(root), group=self.group)
        return None

    def broadcast(
        self, chunk: torch.Tensor | None, size: int, root: int, device: torch.device
    ) -> torch.Tensor:
        """``root``'s uint8 ``chunk`` of ``size`` bytes, on every rank."""
        if self.rank == root:
            assert chunk is not None and chunk.numel() == size
            buf = chunk.reshape(-1).contiguous()
            self.counter.add((self.size - 1) * size, 0, self.size - 1)
        else:
            buf = torch.empty(size, dtype=torch.uint8, device=device)
            self.counter.add(0, size, 0)
        with self.counter.timed():
            dist.broadcast(buf, src=self._global(root), group=self.group)
        return buf

    def _global(self, rank: int) -> int:
        """The global rank of ``rank`` in this link's group (what gather/broadcast take)."""
        if self.group is None:
            return rank
        return dist.get_global_rank(self.group, rank)
