"""The state of TernGrad's reduce-scatter on one model's FSDP2 modules: one group's
reduce-scatter (quantized on the shared grid, or in full precision for the warm-up and the kept
parameters), the skipped groups, and the counts a checkpoint keeps."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.exchanges.link import Link
from terngrad.comm.exchanges.reduce_scatter import grid_reduce_scatter
from terngrad.comm.rank import saved_state
from terngrad.comm.rank.rank_state import RankState
from terngrad.comm.spec.options import Options
from terngrad.fsdp.groups import Group, Spans

__all__ = ["State", "check_op"]


class State(RankState):
    """TernGrad's reduce-scatter on the FSDP modules of one model (made by :func:`register`, a
    collective): the options, byte counters (:attr:`stats`), the skipped-step flag, and a
    ``state_dict`` for an exact resume (save one per rank). A step is a backward pass: it
    starts with the first reduce-scatter of some group that has done as many as any other."""

    kind = "terngrad.fsdp state"

    def __init__(self, options: Options, model: nn.Module, groups: list[tuple[nn.Module, Group]],
                 process_group: dist.ProcessGroup) -> None:  # fmt: skip
        self.groups = [g for _, g in groups]
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        excluded = {n for g in self.groups for n, k in zip(g.names, g.kept, strict=True) if k}
        super().__init__(
            options, Link(process_group), params[0][1].device, params, excluded,
            fsdp_groups=[(g.names, g.segments) for g in self.groups],
        )  # fmt: skip
        #: reduce-scatters done, by group index (a group's count is its step)
        self.calls = dict.fromkeys(range(len(self.groups)), 0)
        #: the groups whose latest reduce-scatter found a NaN or Inf on some rank
        self._skipped: set[int] = set()
        self._spans: dict[int, Spans] = {}
        #: what PyTorch's fp32 ring reduce-scatter of the same gradients would have sent
        self.fp32_bytes_sent = 0

    @property
    def last_step_skipped(self) -> bool:
        """Some group's latest reduce-scatter found a NaN or Inf on some rank (its shard was
        zeroed on every rank): skip ``optimizer.step()``."""
        return bool(self._skipped)

    @property
    def fp32_bytes_per_step(self) -> int:
        """What FSDP2's own fp32 reduce-scatter sends per rank and step: ``(N-1)/N`` of every
        group's flat input of ``N`` chunks, 4 bytes an element (:attr:`fp32_bytes_sent` counts
        the same, call by call)."""
        return sum((self.link.size - 1) * 4 * g.chunk for g in self.groups)

    # --- one group's reduce-scatter

    def reduce_scatter(self, index: int, output: torch.Tensor, input: torch.Tensor,
                       op: dist.ReduceOp) -> None:  # fmt: skip
        """Group ``index``'s reduce-scatter: ``output`` gets this rank's shard of the mean
        (``op`` AVG) or sum (SUM) of ``input`` over the ranks."""
        check_op(op)
        group = self.groups[index]
        if output.numel() != group.chunk:
            raise RuntimeError(
                f"terngrad.fsdp: FSDP reduced {output.numel()} elements per rank in the group of "
                f"{group.names[0]}..., registered with {group.chunk}: a parameter without a "
                "gradient this step, or a model changed after register; call register again "
                "on a model whose trainable parameters all get gradients"
            )
        self._count_call(index)
        ranks = self.link.size
        self.fp32_bytes_sent += (ranks - 1) * input.numel() * 4 // ranks
        with self.counters.timed():
            if self.calls[index] <= self.options.full_precision_steps or all(group.kept):
                self.link.reduce_scatter(output, input, op)
                finite = self._agree_finite(bool(torch.isfinite(output).all()), output.device)
            else:
                finite = self._quantized(index, group, output, input)
                if finite and op == dist.ReduceOp.SUM:
                    output.mul_(ranks)
        if finite:
            self._skipped.discard(index)
        else:
            output.zero_()
            self._skipped.add(index)
            self.counters.skip_open_step()
            warnings.warn(
                f"terngrad.fsdp: a NaN or Inf gradient on some rank in the group of "
                f"{group.names[0]}...; its shard was zeroed on every rank (check "
                "state.last_step_skipped before optimizer.step())",
                RuntimeWarning,
                stacklevel=2,
            )

    def _count_call(self, index: int) -> None:
        """One more reduce-scatter of group ``index``; the first of a new backward pass starts
        a new step, whose bytes :attr:`stats` reports as the last step's."""
        if self.calls[index] == max(self.calls.values()):
            self.counters.open_step()
        self.calls[index] += 1

    def _agree_finite(self, finite: bool, device: torch.device) -> bool:
        flag = torch.tensor([0.0 if finite else 1.0], device=device)
        return float(self.link.all_reduce(flag, dist.ReduceOp.MAX)) == 0.0

    def _quantized(self, index: int, group: Group, output: torch.Tensor,
                   input: torch.Tensor) -> bool:  # fmt: skip
        spans = self._spans.get(index)
        if spans is None:
            spans = self._spans[index] = Spans(group, self.link.size, self.quantizer.bucket_size)
        kept = None
        if spans.kept_out.numel():
            kept = input.new_empty(spans.kept_out.numel())
            self.link.reduce_scatter(kept, input[spans.kept_in].contiguous(), dist.ReduceOp.AVG)
        whole = kept is None  # every element on the grid: no gather, no scatter
        flat = input.float() if whole else input[spans.quantized_in].float()
        name, sizes = (f"fsdp-group-{index}",), (flat.numel(),)
        if self.memory is not None:
            flat = self.memory.compensate(name, sizes, flat)
        shard = torch.empty(spans.quantized_out.numel(), device=flat.device)
        own = torch.empty_like(flat) if self.memory is not None else None
        # segment p of rank r at the group's step t: the stream stream_seed(seed, r, index, t, p)
        draws = self.draws(index, self.calls[index], parts=range(len(spans.layout.segments)))
        finite = grid_reduce_scatter(
            self.link, self.kernels, self.quantizer, flat, spans.layout, draws, shard, own,
            also_finite=kept is None or bool(torch.isfinite(kept).all()),
        )  # fmt: skip
        if not finite:
            if self.memory is not None:
                self.memory.discard()
            return False
        if self.memory is not None:
            self.memory.update(name, sizes, flat, own)
            self.memory.commit()
        if whole:
            output.copy_(shard)
        else:
            output[spans.quantized_out] = shard.to(output.dtype)
        if kept is not None:
            output[spans.kept_out] = kept
        return True

    # --- checkpoints: the reduce-scatters done per group (the draws follow from them), the
    # groups and steps skipped, the bytes

    def _own_state(self) -> dict[str, Any]:
        c = self.counters
        return {
            "calls": dict(self.calls),
            "skipped": sorted(self._skipped),
            "skipped_steps": c.skipped_steps,
            "skipped_step": c.skipped_step,
            "bytes": (c.bytes.sent, c.bytes.received, self.fp32_bytes_sent),
            "messages_sent": c.bytes.messages,
        }

    def residual_sizes(self) -> dict[str, int]:
        """One residual per group: its quantized elements over all ranks' chunks."""
        sizes = {
            f"fsdp-group-{g.index}": self.link.size
            * sum(n for n, k in zip(g.segments, g.kept, strict=True) if not k)
            for g in self.groups
        }
        return {name: n for name, n in sizes.items() if n}

    def _check_own(self, state: dict[str, Any]) -> None:
        kind = self.kind
        calls = saved_state.entry(state, "calls", dict, "the reduce-scatters done by group", kind)
        if sorted(map(str, calls)) != sorted(map(str, range(len(self.groups)))) or not all(
            type(v) is int and v >= 0 for v in calls.values()
        ):
            raise ValueError(
                f"not a {kind}: its 'calls' is {calls!r}, not a count >= 0 for each of the "
                f"{len(self.groups)} groups 0..{len(self.groups) - 1}"
            )
        skipped = saved_state.entry(state, "skipped", list, "a list of group indices", kind)
        if not all(type(i) is int and 0 <= i < len(self.groups) for i in skipped):
            raise ValueError(f"not a {kind}: its 'skipped' is {skipped!r}, not group indices")
        for key in ("skipped_steps", "skipped_step"):
            saved_state.count(state, key, kind)
        saved_state.count(state, "messages_sent", kind, optional=True)
        counts = saved_state.entry(state, "bytes", tuple | list, "three byte counts", kind)
        if len(counts) != 3 or not all(type(v) is int and v >= 0 for v in counts):
            raise ValueError(
                f"not a {kind}: its 'bytes' is {counts!r}, not three byte counts (sent, "
                "received, fp32's)"
            )

    def _load_own(self, state: dict[str, Any]) -> None:
        self.calls = {int(k): int(v) for k, v in state["calls"].items()}
        self._skipped = set(state["skipped"])
        sent, received, self.fp32_bytes_sent = state["bytes"]
        self.counters.load_state_dict({
            "steps": max(self.calls.values(), default=0),
            "skipped_steps": state["skipped_steps"],
            "bytes_sent": sent,
            "bytes_received": received,
            "messages_sent": state.get("messages_sent", 0),  # not counted before 0.3
        })  # fmt: skip
        self.counters.skipped_step = state["skipped_step"]


def check_op(op: Any) -> None:
    """Refuse a reduce-scatter op other than FSDP's default mean or sum (a gradient divide
    factor makes it a ``PREMUL_SUM``), in terngrad's words."""
    if op not in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
        name = getattr(op, "name", None)
        what = f"ReduceOp.{name}" if name else "ReduceOp.PREMUL_SUM (a gradient divide factor)"
        raise ValueError(
            f"terngrad.fsdp: FSDP asked for a reduce-scatter with {what}; terngrad serves "
            "FSDP's default (AVG or SUM): leave set_gradient_divide_factor unset"
        )
