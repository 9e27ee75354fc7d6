"""PyTorch's (state, hook) convention, the state made before the process group exists:

    torchrun --standalone --nproc-per-node 2 examples/ddp_state_hook.py [--register]

``--register`` uses the one-line form ``terngrad.ddp.register(ddp)`` instead; both train the
same bits and send the same bytes. Rank 0 prints a JSON line with the bytes per step, what an
fp32 ring all-reduce would move, and whether every rank ends with the same parameters.
"""

import argparse
import datetime
import json
import zlib

import torch
import torch.distributed as dist
from torch import nn

import terngrad.ddp

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--register", action="store_true", help="terngrad.ddp.register instead")
args = parser.parse_args()

if not args.register:  # the pair: made before init_process_group, no collective yet
    state = terngrad.ddp.State(quantizer="terngrad", topology="sharded")

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
ddp = nn.parallel.DistributedDataParallel(model)
if args.register:
    state = terngrad.ddp.register(ddp, quantizer="terngrad", topology="sharded")
else:
    ddp.register_comm_hook(state, terngrad.ddp.hook)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

data = torch.Generator().manual_seed(1000 + rank)
teacher = torch.randn(784, 10, generator=torch.Generator().manual_seed(1))
for _ in range(args.steps):
    x = torch.randn(32, 784, generator=data)
    loss = nn.functional.cross_entropy(ddp(x), (x @ teacher).argmax(1))
    optimizer.zero_grad()
    loss.backward()
    if not state.last_step_skipped:
        optimizer.step()

checksum = zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
every = [None] * world
dist.all_gather_object(every, checksum)
if rank == 0:
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "bytes_sent_per_step": state.stats.bytes_sent_per_step,
        "fp32_ring_bytes_per_step": 2 * (world - 1) * 4 * params / world,
        "replicas_identical": len(set(every)) == 1,
        "checksum": checksum,
        "loss": loss.item(),
    }))  # fmt: skip
dist.destroy_process_group()
