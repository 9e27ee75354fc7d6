"""TernGrad under DDP, launched by torchrun:

    torchrun --nproc_per_node 4 examples/ddp_terngrad.py [--topology sharded|ps|allgather]

Each rank trains the same MLP on its own synthetic batches; the hook sends ternary gradients.
Rank 0 prints the loss and the bytes this rank sent per step, against what PyTorch's fp32
all-reduce would move for the same model (2 (N-1)/N x 4 bytes per parameter, ring).
"""

import argparse
import datetime

import torch
import torch.distributed as dist
from torch import nn

import terngrad.ddp

parser = argparse.ArgumentParser()
parser.add_argument("--topology", default="sharded", choices=["sharded", "ps", "allgather"])
parser.add_argument("--quantizer", default="terngrad")
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # DDP broadcasts rank 0's parameters anyway
model = nn.Sequential(
    nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
)
ddp = nn.parallel.DistributedDataParallel(model)
state = terngrad.ddp.register(ddp, quantizer=args.quantizer, topology=args.topology)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

data = torch.Generator().manual_seed(1000 + rank)
teacher = torch.randn(784, 10, generator=torch.Generator().manual_seed(1))
for step in range(1, args.steps + 1):
    x = torch.randn(64, 784, generator=data)
    loss = nn.functional.cross_entropy(ddp(x), (x @ teacher).argmax(1))
    optimizer.zero_grad()
    loss.backward()
    if not state.last_step_skipped:
        optimizer.step()
    if rank == 0 and step % 25 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")

if rank == 0:
    params = sum(p.numel() for p in model.parameters())
    fp32 = 2 * (world - 1) * 4 * params / world
    sent = state.stats.bytes_sent_per_step
    print(
        f"{args.quantizer}/{args.topology} on {world} ranks: {sent:,.0f} bytes sent per step per "
        f"rank; an fp32 ring all-reduce moves {fp32:,.0f} ({fp32 / sent:.1f}x more)"
    )
dist.destroy_process_group()
