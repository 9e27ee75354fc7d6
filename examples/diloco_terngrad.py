"""Local steps with ternary outer gradients (DiLoCo), launched by torchrun:

    torchrun --nproc_per_node 4 examples/diloco_terngrad.py [--local-steps 16] [--steps 160]

Each rank trains its own replica of an MLP with AdamW (clipping at 1.0, untouched) on its own
synthetic batches; every ``--local-steps`` steps the ranks average what their replicas moved
through terngrad's sharded exchange (TernGrad, error feedback) and a Nesterov outer step moves
the shared anchor. Rank 0 prints the loss, and at the end one JSON line: bytes sent per inner
step against what DDP's fp32 all-reduce would move every step, and whether the replicas are
bitwise one model after the last outer step.
"""

import argparse
import datetime
import json

import torch
import torch.distributed as dist
from torch import nn

import terngrad.diloco
from terngrad.comm.rank.consistency import check_replicas

parser = argparse.ArgumentParser()
parser.add_argument("--local-steps", type=int, default=16)
parser.add_argument("--steps", type=int, default=160)
parser.add_argument("--quantizer", default="terngrad")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # DiLoCo broadcasts rank 0's parameters anyway
model = nn.Sequential(
    nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
)
inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
outer = terngrad.diloco.DiLoCo(model, inner, args.local_steps, args.quantizer)

data = torch.Generator().manual_seed(1000 + rank)
teacher = torch.randn(784, 10, generator=torch.Generator().manual_seed(1))
for step in range(1, args.steps + 1):
    x = torch.randn(64, 784, generator=data)
    loss = nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
    inner.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    inner.step()
    if outer.step() and rank == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}  (outer step {outer.stats.outer_steps})")

check_replicas(model, step=args.steps)  # raises, naming the parameter, if a replica differs
if rank == 0:
    params = sum(p.numel() for p in model.parameters())
    fp32 = 2 * (world - 1) * 4 * params / world
    print(json.dumps({
        "inner_steps": outer.stats.inner_steps,
        "outer_steps": outer.stats.outer_steps,
        "bytes_sent_per_step": outer.stats.bytes_sent_per_step,
        "fp32_ring_bytes_per_step": fp32,
        "replicas_identical": True,
        "loss": loss.item(),
    }))  # fmt: skip
dist.destroy_process_group()
