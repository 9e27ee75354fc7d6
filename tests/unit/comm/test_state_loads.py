"""A saved state that cannot load is refused in one line naming what is wrong, before any of it
is taken: the DDP hook's (built, and before first use), the Synchronizer's,
and FSDP's — on one process, a gloo group of one rank."""

from __future__ import annotations

import copy
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

import terngrad.ddp
import terngrad.fsdp

W = "0.weight"  # the quantized parameter (1,200 elements), whose residual the state holds


@pytest.fixture
def one_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 30), nn.ReLU(), nn.Linear(30, 2))


def _trained_hook():
    ddp = nn.parallel.DistributedDataParallel(_model())
    state = terngrad.ddp.register(ddp, error_feedback=True)
    ddp(torch.randn(4, 40)).sum().backward()
    return ddp, state


def _broken(saved: dict) -> list[tuple[object, str]]:
    """Bad copies of a DDP hook's ``saved`` state, with what each refusal must say."""

    def bad(change) -> dict:
        s = copy.deepcopy(saved)
        change(s)
        return s

    return [
        ([saved], "not a terngrad hook state: a list, not a dict"),
        (bad(lambda s: s.pop("generator")), "not a terngrad hook state: it has no 'generator'"),
        (bad(lambda s: s.update(generator=torch.zeros(3))),
         "its 'generator' is torch.float32, not a torch.uint8 tensor"),
        (bad(lambda s: s.update(counters="3 steps")),
         "not a terngrad hook state: its 'counters' is a str, not a dict of counts"),
        (bad(lambda s: s["counters"].pop("steps")),
         "not a terngrad hook state (counters): it has no 'steps' (a whole number)"),
        (bad(lambda s: s["counters"].update(bytes_sent=-1)),
         "its 'bytes_sent' is -1, not a whole number >= 0"),
        (bad(lambda s: s.update(rank="0")), "its 'rank' is a str, not the rank that saved it"),
        (bad(lambda s: s.pop("config")), "it has no 'config'"),
        (bad(lambda s: s["residuals"].update({W: torch.zeros(5)})),
         f"terngrad hook state: residuals['{W}'] has shape (5,), not (1200,) as this model's: "
         "saved from another model"),
        (bad(lambda s: s["residuals"].update({W: torch.zeros(1200, dtype=torch.float64)})),
         f"residuals['{W}'] is torch.float64, not torch.float32"),
        (bad(lambda s: s["residuals"].update({"head.weight": torch.zeros(3)})),
         "residuals['head.weight']: no such parameter here"),
        (bad(lambda s: s["residuals"].update({W: [0.0] * 1200})),
         f"residuals['{W}'] is a list, not a tensor"),
        (bad(lambda s: s.update(server_residuals=None)),
         "its 'server_residuals' is a NoneType, not a dict of tensors"),
    ]  # fmt: skip


def _refused(load, bad, says) -> None:
    with pytest.raises(ValueError) as exc:
        load(bad)
    text = str(exc.value)
    assert says in text and "\n" not in text, text


def test_a_built_hooks_state_names_what_is_wrong_and_takes_nothing(one_rank):
    ddp, state = _trained_hook()
    saved = state.state_dict()
    residual = state.reducer.memory.residuals[W].clone()
    for bad, says in _broken(saved):
        _refused(state.load_state_dict, bad, says)
        assert torch.equal(state.reducer.memory.residuals[W], residual)  # nothing taken
    ddp(torch.randn(4, 40)).sum().backward()  # and it still works
    state.load_state_dict(saved)  # as does its own state


def test_a_hooks_state_loaded_before_first_use_is_checked_at_once(one_rank):
    _, trained = _trained_hook()
    saved = trained.state_dict()
    for bad, says in _broken(saved):
        fresh = terngrad.ddp.State(error_feedback=True, model=_model())
        _refused(fresh.load_state_dict, bad, says)


def test_the_synchronizers_state_is_checked_alike(one_rank):
    model = _model()
    sync = terngrad.comm.Synchronizer(model, error_feedback=True)
    model(torch.randn(4, 40)).sum().backward()
    sync.step()
    saved = sync.state_dict()
    for bad, says in _broken(saved):
        _refused(sync.load_state_dict, bad, says)
    sync.load_state_dict(saved)


def test_an_fsdp_state_names_what_is_wrong(one_rank):
    from torch.distributed.fsdp import fully_shard

    net = _model()
    fully_shard(net[0])
    fully_shard(net)
    state = terngrad.fsdp.register(net, error_feedback=True)
    net(torch.randn(4, 40)).sum().backward()
    saved = state.state_dict()  # (one rank: FSDP reduces nothing, so no residual yet)

    def bad(change) -> dict:
        s = copy.deepcopy(saved)
        change(s)
        return s

    kind = "not a terngrad.fsdp state"
    cases = [
        (bad(lambda s: s.pop("calls")), f"{kind}: it has no 'calls'"),
        (bad(lambda s: s.update(calls="1")), f"{kind}: its 'calls' is a str, not the reduce-"),
        (bad(lambda s: s.update(calls={0: 1, 5: 1})), "not a count >= 0 for each of the 2 groups"),
        (bad(lambda s: s.update(skipped=[7])), f"{kind}: its 'skipped' is [7], not group indices"),
        (bad(lambda s: s.update(bytes=(1, 2))), "its 'bytes' is (1, 2), not three byte counts"),
        (bad(lambda s: s.pop("skipped_steps")), f"{kind}: it has no 'skipped_steps'"),
        (bad(lambda s: s["residuals"].update({"fsdp-group-1": torch.zeros(3)})),
         "residuals['fsdp-group-1'] has shape (3,), not (1200,) as this model's"),
        (bad(lambda s: s["residuals"].update({"fsdp-group-0": torch.zeros(3)})),
         "residuals['fsdp-group-0']: no such parameter here"),  # the root's: all full precision
        ("state", f"{kind}: a str, not a dict"),
    ]  # fmt: skip
    for bad_state, says in cases:
        _refused(state.load_state_dict, bad_state, says)
    state.load_state_dict(saved)
