"""What each rank runs in the tests of the Hugging Face Trainer callback (top level, so spawned
processes import it): a tiny GPT-2 made from a config, on an in-memory toy language."""

from __future__ import annotations

import os
import tempfile
import warnings
import zlib

import torch


def tiny_gpt2():
    """A 2-layer GPT-2 of width 128 over 64 tokens (about 0.4M parameters; nothing downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=128, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def toy_data(n: int = 256) -> list[dict[str, torch.Tensor]]:
    """Arithmetic sequences of tokens, mod the vocabulary."""
    g = torch.Generator().manual_seed(0)
    starts, strides = torch.randint(0, 64, (n, 1), generator=g), torch.randint(1, 5, (n, 1))
    tokens = (starts + strides * torch.arange(16)) % 64
    return [{"input_ids": t, "labels": t} for t in tokens]


def training_args(out: str, **changes):
    from transformers import TrainingArguments

    settings = dict(
        output_dir=out, use_cpu=True, max_steps=6, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
    )  # fmt: skip
    return TrainingArguments(**{**settings, **changes})


def checksum(model: torch.nn.Module) -> int:
    return zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))


def as_torchrun(rank: int, world: int) -> None:
    """The environment torchrun gives each rank, which accelerate reads (the process group
    itself is up already: accelerate uses it)."""
    for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world),
                        ("LOCAL_WORLD_SIZE", world)):  # fmt: skip
        os.environ[name] = str(value)


def train_with_a_nan(rank: int, world: int, nan_step: int) -> dict:
    """6 optimizer steps of 2 micro-batches with ``TernGradCallback()``, rank 1's loss NaN at
    optimizer step ``nan_step``; then a second ``train()`` of 2 steps on the same Trainer (its
    DDP model kept, the hook on it kept); then a second TernGradCallback, refused."""
    from transformers import Trainer, TrainerCallback

    from terngrad.integrations.transformers import TernGradCallback

    as_torchrun(rank, world)

    class NanTrainer(Trainer):
        inject = True

        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            if self.inject and rank == 1 and self.state.global_step + 1 == nan_step:
                loss = loss * float("nan")
            return loss

    class Checksums(TrainerCallback):
        def __init__(self):
            self.after = {}  # optimizer step -> parameters' checksum after it

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.after[state.global_step] = checksum(model)

    model, checksums, callback = tiny_gpt2(), Checksums(), TernGradCallback()
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = NanTrainer(model=model, args=training_args(out), train_dataset=toy_data(),
                             callbacks=[checksums, callback])  # fmt: skip
        first = trainer.callback_handler.callbacks[0] is callback
        trainer.train()
        stats, state = callback.state.stats, callback.state
        after = dict(checksums.after)  # the second train() counts its steps from 1 again
        logs = [e for e in trainer.state.log_history if "terngrad/bytes_sent_per_step" in e]
        adam_steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
        trainer.inject = False
        trainer.args.max_steps = 2
        trainer.train()  # the same DDP model and hook
        second = callback.state is state and callback.state.stats.steps == stats.steps + 2
        trainer.remove_callback(callback)
        trainer.add_callback(TernGradCallback())
        try:
            trainer.train()
            refused = None
        except RuntimeError as exc:
            refused = str(exc)
    numel = sum(p.numel() for p in model.parameters())
    return {
        "stats": stats,
        "checksum_after": after,
        "final": checksum(model),
        "numel": numel,
        "adam_steps": adam_steps,
        "logs": logs,
        "first_in_line": first,
        "second_train_kept_the_hook": second,
        "refused": refused,
        "warnings": [str(w.message) for w in caught],
    }
