"""TernGrad as FSDP2's reduce-scatter: compressed gradients in sharded training.

``fully_shard`` (FSDP2) averages each parameter group's gradients with a reduce-scatter: every
rank hands in the group's flat, padded gradient of ``N * S`` elements and gets back its own
shard of ``S``. :func:`register` puts TernGrad there, through PyTorch's public setter
``FSDPModule.set_custom_reduce_scatter``, on every FSDP module of a model::

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    state = terngrad.fsdp.register(model, quantizer="terngrad")
    ...  # train as usual; state.stats.bytes_sent_per_step, state.last_step_skipped

Each reduce-scatter (:func:`~terngrad.comm.reduce_scatter.grid_reduce_scatter`): the scales of
every bucket shared by an all-reduce MAX (the paper's scalar sharing), the codes exchanged
all-to-all (1.6 bits an element), summed exactly as integers by each shard's owner, and decoded
into the mean — FSDP's own all-gather of the parameters does the rest, so the sharded exchange's
second half is not needed. Scales are per parameter (the flat buffer's layout is known: each
rank's chunk holds every parameter's padded shard in turn), and per bucket of ``bucket_size``
elements inside it where the quantizer has one. As in DDP, the last layer (unless
``quantize_last``) and tensors under ``min_numel`` elements travel in full precision: their
spans of the buffer go through a plain reduce-scatter in the reduce dtype. Every rank's shard
of a quantized gradient is the same function of all ranks' gradients, so the replicas' full
parameters, all-gathered from the shards, stay consistent.

Honoured: the mixed-precision policy's reduce dtype (fp32, bf16: quantized from float32, the
shard written back in the reduce dtype), uneven and padded shards, error feedback
(``error_feedback=True``), a full-precision warm-up (``full_precision_steps``), ``seed`` and
``timeout``. Refused at :func:`register`, in one line and before any collective: a model that is
not ``fully_shard``-ed, a quantizer that cannot sum exactly in the sharded layout (only the
shared-grid ones can: ``terngrad``, ``qsgd``), another topology, the auto policy or
``fuse_buckets`` (the DDP hook's), HSDP or
several meshes, a second registration. A gradient divide factor other than FSDP's default fails
at the first reduce-scatter.

A NaN or Inf in some rank's gradient is seen by every rank (it travels with the shared scales):
that group's shard is zeroed on every rank and ``state.last_step_skipped`` is True — skip
``optimizer.step()`` then, as with the DDP hook.

FSDP2's internals read at :func:`register` (torch 2.13): the module's parameter groups, their
parameters' padded shard sizes and the mesh; the reduce-scatter itself goes through the public
``ReduceScatter`` interface.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm import saved_state
from terngrad.comm.link import Link
from terngrad.comm.methods import hook_options
from terngrad.comm.options import Options
from terngrad.comm.plans import full_precision_names, last_layer_names
from terngrad.comm.rank_state import RankState, resolve_timeout, twin_group
from terngrad.comm.reduce_scatter import grid_reduce_scatter
from terngrad.quantize import Layout, SymmetricGrid

__all__ = ["State", "register"]

_REGISTERED = "_terngrad_fsdp_state"


def _fsdp_api():
    """FSDP2's module class and the reduce-scatter interface (imported when first needed)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    return FSDPModule, ReduceScatter


@dataclass(frozen=True)
class _Group:
    """One FSDP parameter group as its reduce-scatter sees it: per rank chunk, the parameters'
    padded shard sizes in order (``segments``), which of them stay in full precision
    (``kept``), and their names."""

    index: int
    names: tuple[str, ...]
    segments: tuple[int, ...]
    kept: tuple[bool, ...]

    @property
    def chunk(self) -> int:
        return sum(self.segments)


class _Spans:
    """Where the quantized and the full-precision elements lie in a group's flat input of
    ``ranks`` chunks, and in this rank's output chunk (index tensors, made once)."""

    def __init__(self, group: _Group, ranks: int, bucket_size: int | None) -> None:
        per_chunk = torch.arange(group.chunk)
        pairs = zip(group.segments, group.kept, strict=True)
        keep = torch.cat([torch.full((n,), k, dtype=torch.bool) for n, k in pairs])
        self.quantized_out = per_chunk[~keep]
        self.kept_out = per_chunk[keep]
        offsets = torch.arange(ranks).repeat_interleave(group.chunk) * group.chunk
        whole = offsets + per_chunk.repeat(ranks)
        self.quantized_in = whole[~keep.repeat(ranks)]
        self.kept_in = whole[keep.repeat(ranks)]
        quantized = [n for n, k in zip(group.segments, group.kept, strict=True) if not k]
        self.layout = Layout.of(ranks * sum(quantized), quantized * ranks, bucket_size)


class State(RankState):
    """TernGrad's reduce-scatter on the FSDP modules of one model (made by :func:`register`, a
    collective): the options, byte counters (:attr:`stats`), the skipped-step flag, and a
    ``state_dict`` for an exact resume (save one per rank). A step is a backward pass: it
    starts with the first reduce-scatter of some group that has done as many as any other."""

    kind = "terngrad.fsdp state"

    def __init__(self, options: Options, model: nn.Module, groups: list[tuple[nn.Module, _Group]],
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
        self._spans: dict[int, _Spans] = {}
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
        _check_op(op)
        start = time.perf_counter()
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
        try:
            if self.calls[index] <= self.options.full_precision_steps or all(group.kept):
                self.link.reduce_scatter(output, input, op)
                finite = self._agree_finite(bool(torch.isfinite(output).all()), output.device)
            else:
                finite = self._quantized(index, group, output, input)
                if finite and op == dist.ReduceOp.SUM:
                    output.mul_(ranks)
        finally:
            self.counters.exchange_seconds += time.perf_counter() - start
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

    def _quantized(self, index: int, group: _Group, output: torch.Tensor,
                   input: torch.Tensor) -> bool:  # fmt: skip
        spans = self._spans.get(index)
        if spans is None:
            spans = self._spans[index] = _Spans(group, self.link.size, self.quantizer.bucket_size)
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


def _check_op(op: Any) -> None:
    """Refuse a reduce-scatter op other than FSDP's default mean or sum (a gradient divide
    factor makes it a ``PREMUL_SUM``), in terngrad's words."""
    if op not in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
        name = getattr(op, "name", None)
        what = f"ReduceOp.{name}" if name else "ReduceOp.PREMUL_SUM (a gradient divide factor)"
        raise ValueError(
            f"terngrad.fsdp: FSDP asked for a reduce-scatter with {what}; terngrad serves "
            "FSDP's default (AVG or SUM): leave set_gradient_divide_factor unset"
        )


def _reduce_scatter_class():
    _, ReduceScatter = _fsdp_api()

    class TernGradReduceScatter(ReduceScatter):
        """The reduce-scatter of one FSDP parameter group, through :class:`State`."""

        def __init__(self, state: State, index: int) -> None:
            self.state, self.index = state, index

        def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            self.state.reduce_scatter(self.index, output_tensor, input_tensor, op)
            return None

    return TernGradReduceScatter


def register(model: nn.Module, quantizer: str | Options = "terngrad", **options: Any) -> State:
    """Put TernGrad's reduce-scatter on every FSDP module of ``model`` (``fully_shard`` first,
    ``torch.distributed`` initialised); returns the :class:`State`. ``quantizer`` and
    ``options``: as :class:`terngrad.ddp.Options` (``bucket_size=512`` among the quantizer's
    options, ``error_feedback``, ``quantize_last``, ``min_numel``, ``full_precision_steps``,
    ``seed``, ``timeout``). Every rank must call it alike (it checks, with a collective)."""
    opts = quantizer if isinstance(quantizer, Options) else hook_options(quantizer, **options)
    if isinstance(quantizer, Options) and options:
        raise TypeError("give either an Options object or keyword options, not both")
    groups, process_group = _fsdp_groups(model, opts)
    if not dist.is_initialized():
        raise RuntimeError(
            "terngrad.fsdp needs torch.distributed initialised: call "
            "torch.distributed.init_process_group(...) before fully_shard and register"
        )
    opts = resolve_timeout(opts)  # unset: the default group's (said in state.options)
    state = State(opts, model, groups, twin_group(process_group, opts.timeout))
    comm = _reduce_scatter_class()
    for module, group in groups:
        module.set_custom_reduce_scatter(comm(state, group.index))
    setattr(model, _REGISTERED, state)
    return state


def _fsdp_groups(
    model: nn.Module, opts: Options
) -> tuple[list[tuple[nn.Module, _Group]], dist.ProcessGroup]:
    """Every FSDP module's parameter group, and the one process group they reduce over; a
    ``ValueError`` for what :func:`register` cannot serve."""
    FSDPModule, _ = _fsdp_api()
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo, FSDPMeshInfo

    q = opts.make_quantizer()
    if not isinstance(q, SymmetricGrid):
        raise ValueError(
            f"terngrad.fsdp: {opts.quantizer} cannot sum exactly in FSDP's sharded layout; "
            "choose a shared-grid quantizer: terngrad or qsgd"
        )
    if opts.fuse_buckets:
        raise ValueError(
            "terngrad.fsdp: fuse_buckets is the DDP hook's; FSDP reduce-scatters each FSDP "
            "module's gradients when its backward is done (wrap fewer modules for fewer "
            "exchanges): leave fuse_buckets off"
        )
    if opts.fit_scale:
        raise ValueError(
            "terngrad.fsdp: fit_scale is the DDP hook's and DiLoCo's; FSDP's reduce-scatter "
            "decodes on the shared scale: leave fit_scale off"
        )
    if opts.topology != "sharded" or opts.policy != "quantize":
        raise ValueError(
            "terngrad.fsdp: FSDP's reduce-scatter is the sharded exchange with every group "
            f"quantized; leave topology and policy at their defaults (got {opts.topology!r}, "
            f"{opts.policy!r})"
        )
    if getattr(model, _REGISTERED, None) is not None:
        raise ValueError("terngrad.fsdp: this model is registered already; register it once")
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError(
            "terngrad.fsdp: the model is not sharded: call "
            "torch.distributed.fsdp.fully_shard on its blocks and on the model first"
        )
    names = {id(p): n for n, p in model.named_parameters()}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    kept_names = full_precision_names(trainable, last_layer_names(model), opts)
    out, meshes, process_group, seen = [], set(), None, set()
    for module in modules:
        fsdp_state = module._get_fsdp_state()
        if id(fsdp_state) in seen:  # fully_shard([a, b]): one state, one group, two modules
            continue
        seen.add(id(fsdp_state))
        param_groups = fsdp_state._fsdp_param_groups
        if len(param_groups) > 1:
            raise ValueError(
                "terngrad.fsdp: a module with several parameter groups (a per-parameter mesh, "
                "shard_placement_fn) is not supported; shard it on one mesh"
            )
        for pg in param_groups:
            mesh = pg.mesh_info
            if isinstance(mesh, DDPMeshInfo) or not isinstance(mesh, FSDPMeshInfo):
                raise ValueError(
                    "terngrad.fsdp: HSDP or replication (a 2-D mesh) is not supported; "
                    "shard over a 1-D mesh"
                )
            process_group = mesh.shard_process_group
            meshes.add(tuple(dist.get_process_group_ranks(process_group)))
            params = [fp for fp in pg.fsdp_params if fp.sharded_param.requires_grad]
            if not params:
                continue
            pnames = tuple(names[id(fp.sharded_param)] for fp in params)
            out.append((module, _Group(
                index=len(out), names=pnames,
                segments=tuple(fp.padded_sharded_param_size.numel() for fp in params),
                kept=tuple(n in kept_names for n in pnames),
            )))  # fmt: skip
    if len(meshes) > 1:
        raise ValueError(
            "terngrad.fsdp: the FSDP modules shard over several meshes; register serves one"
        )
    if not out:
        raise ValueError("terngrad.fsdp: the model has no parameters that require gradients")
    return out, process_group
