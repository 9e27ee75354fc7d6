"""FSDP2's parameter groups as terngrad's reduce-scatter sees them, read from FSDP2's internals
once, at :func:`~terngrad.fsdp.register` (torch 2.13): each module's group, its parameters'
padded shard sizes, which stay in full precision, and the one mesh; what cannot be served is
refused here, in one line and before any collective. :class:`Spans`: where a group's quantized
and full-precision elements lie in its flat input and in this rank's output chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.rank.plans import full_precision_names, last_layer_names
from terngrad.comm.spec.options import Options
from terngrad.quantize import Layout, SymmetricGrid

#: the attribute a registered model carries (its State)
REGISTERED = "_terngrad_fsdp_state"


def fsdp_api():
    """FSDP2's module class and the reduce-scatter interface (imported when first needed)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    return FSDPModule, ReduceScatter


@dataclass(frozen=True)
class Group:
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


class Spans:
    """Where the quantized and the full-precision elements lie in a group's flat input of
    ``ranks`` chunks, and in this rank's output chunk (index tensors, made once)."""

    def __init__(self, group: Group, ranks: int, bucket_size: int | None) -> None:
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


def fsdp_groups(
    model: nn.Module, opts: Options
) -> tuple[list[tuple[nn.Module, Group]], dist.ProcessGroup]:
    """Every FSDP module's parameter group, and the one process group they reduce over; a
    ``ValueError`` for what :func:`register` cannot serve."""
    FSDPModule, _ = fsdp_api()
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
    if getattr(model, REGISTERED, None) is not None:
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
            out.append((module, Group(
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
