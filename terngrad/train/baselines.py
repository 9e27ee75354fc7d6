"""PyTorch's own ways of averaging gradients under DDP, the baselines terngrad is measured
against: ``fp32`` (DDP's built-in all-reduce), ``fp16`` (``default_hooks.fp16_compress_hook``:
cast to fp16, all-reduce, cast back) and ``powersgd`` (``powerSGD_hook``, Vogels et al. 2019,
rank :data:`POWERSGD_RANK` unless the method names one, ``powersgd-r8``, compressing from step
:data:`POWERSGD_START`).

PowerSGD runs with DDP in a single bucket: on gloo, PyTorch's hook hangs with several.
"""

from __future__ import annotations

from torch import nn

from terngrad.comm.spec.methods import BASELINES, POWERSGD_RANK

POWERSGD_START = 2  # plain all-reduce for the first steps, as PyTorch's docs advise


def wrap(
    model: nn.Module, baseline: str, seed: int, powersgd_rank: int = POWERSGD_RANK
) -> nn.parallel.DistributedDataParallel:
    """``model`` under DDP, averaging its gradients the ``baseline`` way (the process group
    must be initialised); ``powersgd_rank``: PowerSGD's ``matrix_approximation_rank``."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; choose one of: {', '.join(BASELINES)}")
    if baseline == "powersgd":
        size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=size_mb + 1)
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=POWERSGD_START,
            random_seed=seed,
        )
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        return ddp
    ddp = nn.parallel.DistributedDataParallel(model)
    if baseline == "fp16":
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    return ddp
