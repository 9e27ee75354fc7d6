"""What each rank runs in the tests of the (state, hook) pair (top level, so spawned processes
import it)."""

from __future__ import annotations

import gc
import warnings
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

import terngrad.ddp
from terngrad.comm import ring_bytes


def _mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10)).to(dtype)


def _steps(ddp: nn.Module, state, rank: int, steps: int, dtype=torch.float32) -> list[float]:
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen).to(dtype)
        loss = ddp(x).float().square().mean()
        optimizer.zero_grad()
        loss.backward()
        if state is None or not state.last_step_skipped:
            optimizer.step()
        losses.append(loss.item())
    return losses


def pair_against_register(rank: int, world: int) -> dict:
    """The same 6 steps through ``register`` and through an unbound State registered with
    ``ddp.register_comm_hook(state, terngrad.ddp.hook)`` (several buckets)."""
    out = {}
    for how in ("register", "pair"):
        model = _mlp()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
        if how == "register":
            state = terngrad.ddp.register(ddp, min_numel=100)
        else:
            state = terngrad.ddp.State(min_numel=100)
            built_before = state.reducer is not None
            ddp.register_comm_hook(state, terngrad.ddp.hook)
        _steps(ddp, state, rank, 6)
        out[how] = {
            "params": [p.detach().clone() for p in model.parameters()],
            "stats": state.stats,
            "excluded": sorted(state.reducer.excluded),
        }
    out["pair_built_at_first_use"] = not built_before
    return out


@contextmanager
def groups_made():
    """Count the process groups made inside the block (the list's length)."""
    made: list[int] = []
    original = dist.new_group
    dist.new_group = lambda *a, **k: made.append(1) or original(*a, **k)
    try:
        yield made
    finally:
        dist.new_group = original


def _errors(attempts) -> list[str]:
    """What each of the callables raised (``"no error"`` if nothing)."""
    out = []
    for attempt in attempts:
        try:
            attempt()
            out.append("no error")
        except Exception as exc:
            out.append(str(exc))
    return out


def second_registration(rank: int, world: int) -> dict:
    """A second ``register`` on the same DDP model is refused before any group is made."""
    ddp = nn.parallel.DistributedDataParallel(_mlp())
    terngrad.ddp.register(ddp)
    builtin = nn.parallel.DistributedDataParallel(_mlp())
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    with groups_made() as made:
        errors = _errors(
            lambda m=m: terngrad.ddp.register(m, quantizer="qsgd") for m in (ddp, builtin)
        )
    return {"errors": errors, "groups_made": len(made)}


def failed_first_use(rank: int, world: int) -> dict:
    """A State whose first use fails (a saved state of another configuration) fails the same
    way at every later use, without making its process group again."""
    source = terngrad.ddp.register(nn.parallel.DistributedDataParallel(_mlp()), quantizer="qsgd")
    saved = source.state_dict()
    with groups_made() as made:
        state = terngrad.ddp.State()
        state.load_state_dict(saved)
        ddp = nn.parallel.DistributedDataParallel(_mlp())
        ddp.register_comm_hook(state, terngrad.ddp.hook)
        step = lambda: ddp(torch.randn(4, 32)).square().mean().backward()  # noqa: E731
        errors = _errors([step, step])
    return {"errors": errors, "groups_made": len(made)}


def full_precision_dtypes(rank: int, world: int) -> dict:
    """Every tensor kept in full precision (``min_numel`` above the model): bf16 goes as bf16,
    fp64 as fp64; fp64 against PyTorch's own DDP all-reduce."""
    out = {}
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        model = _mlp(dtype)
        ddp = nn.parallel.DistributedDataParallel(model)
        state = terngrad.ddp.register(ddp, min_numel=10**9)
        _steps(ddp, state, rank, 3, dtype)
        native = _mlp(dtype)
        _steps(nn.parallel.DistributedDataParallel(native), None, rank, 3, dtype)
        params = sum(p.numel() for p in model.parameters())
        out[str(dtype)] = {
            "bytes_per_step": state.stats.bytes_sent_per_step,
            "expected": ring_bytes(params * torch.tensor([], dtype=dtype).element_size(), world),
            "drift": max(float((a - b).detach().abs().max()) for a, b in
                         zip(model.parameters(), native.parameters(), strict=True)),
            "param_dtypes": {str(p.dtype) for p in model.parameters()},
        }  # fmt: skip
    return out


def load_before_first_use(rank: int, world: int) -> dict:
    """A state_dict loaded into a State before its first use is applied when it is built."""
    ddp = nn.parallel.DistributedDataParallel(_mlp())
    first = terngrad.ddp.register(ddp, error_feedback=True)
    _steps(ddp, first, rank, 3)
    saved = first.state_dict()
    again = nn.parallel.DistributedDataParallel(_mlp())
    state = terngrad.ddp.State(error_feedback=True)
    state.load_state_dict(saved)
    pending = state.state_dict() is saved
    again.register_comm_hook(state, terngrad.ddp.hook)
    _steps(again, state, rank, 2)
    return {"steps": state.stats.steps, "pending_kept": pending,
            "residuals": sorted(state.reducer.memory.residuals)}  # fmt: skip


def python_reducer(rank: int, world: int) -> dict:
    """Compiled DDP's python_reducer mode is refused at registration with a clear message."""
    import torch._dynamo

    torch._dynamo.config.optimize_ddp = "python_reducer"
    try:
        ddp = nn.parallel.DistributedDataParallel(_mlp())
        out = {}
        for how in ("register", "pair"):
            try:
                if how == "register":
                    terngrad.ddp.register(ddp)
                else:  # the pair: DDP itself accepts it; the hook refuses the per-tensor call
                    terngrad.ddp.hook(terngrad.ddp.State(), (torch.zeros(1), torch.zeros(1)))
                out[how] = "no error"
            except RuntimeError as exc:
                out[how] = str(exc)
        return out
    finally:
        torch._dynamo.config.optimize_ddp = True


def unused_state_warns(rank: int, world: int) -> list[str]:
    """A State that no gradient went through says so when it goes (here: dropped)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = terngrad.ddp.State()
        del state
        gc.collect()
        used = terngrad.ddp.State()
        ddp = nn.parallel.DistributedDataParallel(_mlp())
        ddp.register_comm_hook(used, terngrad.ddp.hook)
        _steps(ddp, used, rank, 1)
        del used, ddp
        gc.collect()
    return [str(w.message) for w in caught if "no gradient ever went" in str(w.message)]
