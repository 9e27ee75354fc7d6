"""PyTorch Lightning with the terngrad hook, on CPU (where Lightning itself would ignore
``DDPStrategy(ddp_comm_hook=...)``):

    torchrun --standalone --nproc-per-node 2 examples/lightning_terngrad.py

(or plain ``python examples/lightning_terngrad.py``: Lightning starts the 2 processes itself).
Rank 0 prints a JSON line with the bytes per step, what an fp32 ring all-reduce would move, and
whether every rank ends with the same parameters. ``--fsdp``: FSDP2 instead of DDP —
``ModelParallelStrategy``, ``fully_shard`` in ``configure_model`` — and the same callback puts
TernGrad in FSDP's reduce-scatter (the JSON then compares with FSDP's fp32 reduce-scatter).
"""

import argparse
import json
import zlib

import lightning.pytorch as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

import terngrad.ddp
from terngrad.integrations.lightning import TernGradCallback

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument(
    "--strategy-pair", action="store_true",
    help="give the (state, hook) pair to DDPStrategy, as Lightning documents; the callback "
    "then registers that pair on CPU too",
)  # fmt: skip
parser.add_argument(
    "--fsdp", action="store_true",
    help="FSDP2: ModelParallelStrategy, fully_shard in configure_model; terngrad's reduce-scatter",
)  # fmt: skip
parser.add_argument(
    "--local-steps", type=int, default=1,
    help="H > 1: local steps (DiLoCo), the ternary exchange once every H optimizer steps",
)  # fmt: skip
args = parser.parse_args()


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))

    def configure_model(self):
        """FSDP2 (``--fsdp``): the first layer its own FSDP module, the rest the root's."""
        if args.fsdp:
            mesh = self.device_mesh["data_parallel"]
            fully_shard(self.net[0], mesh=mesh)
            fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


torch.set_num_threads(1)
x = torch.randn(4096, 784, generator=torch.Generator().manual_seed(0))
y = (x @ torch.randn(784, 10, generator=torch.Generator().manual_seed(1))).argmax(1)
loader = DataLoader(TensorDataset(x, y), batch_size=32)  # Lightning shards it per rank

L.seed_everything(0, verbose=False)
model = Classifier()
if args.strategy_pair:
    state = terngrad.ddp.State(quantizer="terngrad", topology="sharded")
    strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=terngrad.ddp.hook)
    terngrad_callback = TernGradCallback()  # takes the strategy's pair
elif args.fsdp:
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    terngrad_callback = TernGradCallback(quantizer="terngrad")  # the same callback
else:
    strategy = "ddp"
    terngrad_callback = TernGradCallback(
        quantizer="terngrad", topology="sharded", local_steps=args.local_steps
    )
trainer = L.Trainer(
    accelerator="cpu", devices=2, strategy=strategy, max_steps=args.steps,
    callbacks=[terngrad_callback],
    logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False,
)  # fmt: skip
trainer.fit(model, loader)

# FSDP2's parameters are shards: all-gathered, every rank's full model
full = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
checksum = zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in full))
every = [None] * trainer.world_size
dist.all_gather_object(every, checksum)
if trainer.global_rank == 0:
    state, world = terngrad_callback.state, trainer.world_size
    params = sum(p.numel() for p in full)
    fp32 = {"fp32_reduce_scatter_bytes_per_step": state.fp32_bytes_per_step} if args.fsdp else {
        "fp32_ring_bytes_per_step": 2 * (world - 1) * 4 * params / world}  # fmt: skip
    print(json.dumps({
        "route": f"{type(state).__module__}.{type(state).__name__}",
        "bytes_sent_per_step": state.stats.bytes_sent_per_step,
        "steps": state.stats.steps,
        **fp32,
        "replicas_identical": len(set(every)) == 1,
    }))  # fmt: skip
# Lightning leaves the process groups up after fit; a gloo group still up when the interpreter
# exits can abort the process ("terminate called without an active exception")
dist.destroy_process_group()
