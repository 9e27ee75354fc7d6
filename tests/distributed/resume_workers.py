"""What each rank runs in the tests of terngrad's state in the frameworks' checkpoints (top
level, so spawned processes import it): train straight, then again from a checkpoint taken on
the way, in the same processes with a new model, Trainer and callback, for the per-step hook
with error feedback and for local steps (H = 2, with and without overlap), each checkpoint
taken between two outer steps."""

from __future__ import annotations

import os
import shutil
import warnings

import torch
import torch.distributed as dist
from hf_workers import as_torchrun, checksum, tiny_gpt2, toy_data, training_args
from torch import nn

#: the callbacks' settings each framework resumes under
MODES = {
    "hook": {"error_feedback": True},
    "local": {"local_steps": 2, "error_feedback": True},  # the residuals resume too
    "overlap": {"local_steps": 2, "overlap": True, "error_feedback": True},
}
#: Lightning's (the suite's time is short: local steps with overlap, the superset of without)
LIGHTNING_MODES = ("hook", "overlap")


def _refusals(states: dict, entry: dict) -> dict[str, str | None]:
    """What loading the hook's ``entry`` into what it does not fit says: the DiLoCo of local
    steps, a state saved by 4 ranks, one saved with another quantizer."""
    from terngrad.integrations.checkpoints import load_entry

    saved = entry["state"]
    other = {**entry, "state": {**saved, "config": {**saved["config"], "quantizer": "linear"}}}
    said = {}
    for name, state, bad in (
        ("other_method", states["local"], entry),
        ("other_world", states["hook"], {**entry, "world_size": 4}),
        ("other_quantizer", states["hook"], other),
    ):
        try:
            load_entry(state, bad)
            said[name] = None
        except ValueError as exc:
            said[name] = str(exc)
    return said


def trainer_resumes(rank: int, world: int, folder: str, steps: int = 4, at: int = 3) -> dict:
    """Per mode: the parameters' checksum after ``steps`` optimizer steps straight, and after
    resuming at ``at`` (``train(resume_from_checkpoint=...)``), with a warm-up, a cosine
    schedule, clipping at 1.0 and GPT-2's dropout; then the refusals and the warning."""
    from transformers import Trainer

    from terngrad.integrations import checkpoints
    from terngrad.integrations.transformers import TernGradCallback

    as_torchrun(rank, world)
    out: dict = {}

    def train(run: str, settings: dict, resume: str | None = None):
        model, callback = tiny_gpt2(), TernGradCallback(**settings)
        args = training_args(run, max_steps=steps, save_strategy="steps", save_steps=at,
                             lr_scheduler_type="cosine", warmup_steps=2)  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=toy_data(64),
                          callbacks=[callback])  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return checksum(model), callback

    states = {}
    for name, settings in MODES.items():
        run = os.path.join(folder, name)
        straight, _ = train(run, settings)
        resumed, callback = train(run, settings, os.path.join(run, f"checkpoint-{at}"))
        out[name], states[name] = (straight, resumed, callback.state.stats.steps), callback.state
    saved = os.path.join(folder, "hook", f"checkpoint-{at}")
    out.update(_refusals(states, checkpoints.read_file(saved)))
    bare = os.path.join(folder, "bare")
    if rank == 0:  # a checkpoint made without the callback: the same, less terngrad's files
        shutil.copytree(saved, bare, ignore=shutil.ignore_patterns("terngrad-rank*"))
    dist.barrier()
    out["warnings"] = _terngrad_warnings(
        train, os.path.join(folder, "bare-run"), MODES["hook"], bare
    )
    return out


def lightning_resumes(rank: int, world: int, folder: str, epochs: int = 2) -> dict:
    """Per mode of :data:`LIGHTNING_MODES`: the parameters' checksum after ``epochs`` epochs
    of 3 optimizer steps each straight, and after resuming from the first epoch's checkpoint
    (``fit(..., ckpt_path=...)``; an epoch's end: Lightning restarts a non-resumable data
    loader's epoch from its start); then a checkpoint without terngrad's state."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from terngrad.integrations.lightning import TernGradCallback

    as_torchrun(rank, world)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64),
                                     nn.ReLU(), nn.Linear(64, 4))  # fmt: skip

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6)
            return [optimizer], [{"scheduler": schedule, "interval": "step"}]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 32, generator=g)
    data = TensorDataset(x, (x[:, :4] * 3).argmax(1))

    def fit(run: str, settings: dict, ckpt: str | None = None):
        net = Net()
        callbacks = [ModelCheckpoint(dirpath=run, save_top_k=-1, every_n_epochs=1),
                     TernGradCallback(**settings)]  # fmt: skip
        trainer = pl.Trainer(
            accelerator="cpu", devices=world, strategy="ddp", max_epochs=epochs,
            accumulate_grad_batches=2, callbacks=callbacks, logger=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        loader = DataLoader(data, batch_size=8, shuffle=True)  # Lightning shards it per rank
        trainer.fit(net, loader, ckpt_path=ckpt)
        return checksum(net)

    out: dict = {}
    first = "epoch=0-step=3.ckpt"
    for name in LIGHTNING_MODES:
        run, settings = os.path.join(folder, name), MODES[name]
        straight = fit(run, settings)
        out[name] = (straight, fit(run, settings, os.path.join(run, first)))
    bare = os.path.join(folder, "bare.ckpt")
    if rank == 0:  # a checkpoint made without the callback: the same, less terngrad's state
        ckpt = torch.load(os.path.join(folder, "hook", first), weights_only=True)
        ckpt["callbacks"] = {k: v for k, v in ckpt["callbacks"].items() if "TernGrad" not in k}
        torch.save(ckpt, bare)
    dist.barrier()
    out["warnings"] = _terngrad_warnings(fit, os.path.join(folder, "bare-run"), MODES["hook"], bare)
    return out


def _terngrad_warnings(run, *args) -> list[str]:
    """The terngrad warnings ``run(*args)`` raises (a resume without terngrad state)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(*args)
    return [str(w.message) for w in caught if "terngrad" in str(w.message)]
