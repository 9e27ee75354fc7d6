"""Hugging Face accelerate with the terngrad hook and gradient accumulation:

    torchrun --standalone --nproc-per-node 2 examples/accelerate_terngrad.py

(or ``accelerate launch --num_processes 2 --cpu examples/accelerate_terngrad.py``). Rank 0
prints a JSON line with the bytes per optimizer step, what an fp32 ring all-reduce would move,
and whether every rank ends with the same parameters.
"""

import argparse
import json
import zlib

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import terngrad.integrations.accelerate

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
args = parser.parse_args()

torch.set_num_threads(1)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(4096, 784, generator=torch.Generator().manual_seed(0))
y = (x @ torch.randn(784, 10, generator=torch.Generator().manual_seed(1))).argmax(1)
loader = DataLoader(TensorDataset(x, y), batch_size=16)

model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
state = terngrad.integrations.accelerate.register(accelerator, model, quantizer="terngrad")

batches = iter(loader)
for _ in range(args.steps * args.accumulate):
    inputs, labels = next(batches)
    with accelerator.accumulate(model):
        accelerator.backward(nn.functional.cross_entropy(model(inputs), labels))
        if not state.last_step_skipped:
            optimizer.step()
        optimizer.zero_grad()

params = list(accelerator.unwrap_model(model).parameters())
checksum = zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in params))
every = [None] * accelerator.num_processes
dist.all_gather_object(every, checksum)
if accelerator.is_main_process:
    world = accelerator.num_processes
    print(json.dumps({
        "bytes_sent_per_step": state.stats.bytes_sent_per_step,
        "steps": state.stats.steps,
        "fp32_ring_bytes_per_step": 2 * (world - 1) * 4 * sum(p.numel() for p in params) / world,
        "replicas_identical": len(set(every)) == 1,
    }))  # fmt: skip
accelerator.end_training()
