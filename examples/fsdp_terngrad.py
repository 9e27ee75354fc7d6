"""FSDP2 with TernGrad as its reduce-scatter — one line after ``fully_shard``:

    torchrun --standalone --nproc-per-node 4 examples/fsdp_terngrad.py --steps 300

terngrad's GPT (4 pre-norm blocks, d = 256, 3.2M parameters) learns Python's documentation
character by character (``apt-get install python3-doc``; ``--toy`` for an in-memory text),
sharded with ``fully_shard`` per block and at the root, AdamW, gloo on CPU.
``--reduce-scatter fsdp`` runs FSDP2's own fp32 reduce-scatter instead (counted the same way),
for the comparison. Rank 0 prints the validation loss as it goes and a JSON summary at the end
(``--json FILE`` writes it): reduce-scatter bytes per step, step time, the loss curve, and
whether every rank's full parameters are the same.
"""

import argparse
import json
import time
import zlib

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

import terngrad.fsdp
from terngrad.train import data
from terngrad.train.models.gpt import GPT
from terngrad.train.text import TextSet

parser = argparse.ArgumentParser()
parser.add_argument("--reduce-scatter", choices=["terngrad", "fsdp"], default="terngrad")
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=16, help="windows per rank and step")
parser.add_argument("--eval-every", type=int, default=25)
parser.add_argument("--toy", action="store_true", help="an in-memory text, no python3-doc")
parser.add_argument("--json", help="write the summary here (rank 0)")
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

if args.toy:
    context, width = 32, 64
    g = torch.Generator().manual_seed(0)
    starts, strides = torch.randint(0, 60, (400, 1), generator=g), torch.randint(1, 5, (400, 1))
    text = ((starts + strides * torch.arange(40)) % 60 + 1).flatten().to(torch.int16)
    corpus = TextSet("toy", text[:12000], text[12000:], "x" * 60, context)
    layers = 2
else:
    context, width, layers = 128, 256, 4
    corpus = data.load("pydoc", context=context)

torch.manual_seed(0)  # the same initial weights on every rank
model = GPT((context,), corpus.num_classes, width=width, layers=layers)
for block in model.blocks:
    fully_shard(block)
fully_shard(model)


class CountedReduceScatter(ReduceScatter):
    """FSDP2's own reduce-scatter (fp32), its bytes counted as terngrad counts its own."""

    sent = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        CountedReduceScatter.sent += (world - 1) * input_tensor.numel() * 4 // world
        dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group)


if args.reduce_scatter == "terngrad":
    state = terngrad.fsdp.register(model, quantizer="terngrad")  # the one line
else:
    state = None
    for module in [*model.blocks, model]:
        module.set_custom_reduce_scatter(CountedReduceScatter())

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
order = torch.Generator().manual_seed(1000 + rank)  # each rank its own windows
held_out = torch.arange(min(64, corpus.test_size))


def validation_loss() -> float:
    with torch.no_grad():
        x, y = corpus.test_batch(held_out)
        logits = model(x)
    model.reshard()  # no backward follows: the root's parameters back to their shards
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))


curve, seconds = [], 0.0
for step in range(1, args.steps + 1):
    index = torch.randint(0, corpus.train_size, (args.batch_size,), generator=order)
    x, y = corpus.train_batch(index, order)
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    if state is None or not state.last_step_skipped:
        optimizer.step()
    seconds += time.perf_counter() - start
    if step % args.eval_every == 0 or step == args.steps:
        curve.append({"step": step, "validation_loss": validation_loss(), "seconds": seconds})
        if rank == 0:
            print(f"step {step}: validation loss {curve[-1]['validation_loss']:.4f}", flush=True)

full = b"".join(p.full_tensor().detach().numpy().tobytes() for p in model.parameters())
every = [None] * world
dist.all_gather_object(every, zlib.crc32(full))
sent = state.stats.bytes_sent if state else CountedReduceScatter.sent
summary = {
    "reduce_scatter": args.reduce_scatter,
    "ranks": world,
    "parameters": sum(p.numel() for p in model.parameters()),
    "tokens_per_step": world * args.batch_size * context,
    "steps": args.steps,
    "reduce_scatter_bytes_per_step": sent / args.steps,
    "fp32_bytes_per_step": (state.fp32_bytes_sent if state else sent) / args.steps,
    "step_seconds": seconds / args.steps,
    "final_validation_loss": curve[-1]["validation_loss"],
    "curve": curve,
    "replicas_identical": len(set(every)) == 1,
}
if rank == 0:
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
dist.destroy_process_group()
