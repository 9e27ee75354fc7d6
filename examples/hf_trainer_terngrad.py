"""The Hugging Face Trainer with the terngrad hook — one line, ``callbacks=[TernGradCallback()]``:

    torchrun --standalone --nproc-per-node 2 examples/hf_trainer_terngrad.py

A tiny GPT-2 made from a config (nothing downloaded) learns an in-memory toy language on CPU,
2 gloo ranks, 2 micro-batches per optimizer step (``--local-steps 4``: the Trainer's AdamW
steps each replica on its own, and every 4th step the replicas average what they moved through
the ternary exchange). Rank 0 prints the Trainer's logs (terngrad's
bytes among them), the bytes per step against DDP's fp32 all-reduce, and then a JSON line
that says whether every rank ends with the same parameters.
"""

import argparse
import json
import tempfile
import zlib

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from terngrad.integrations.transformers import TernGradCallback

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
parser.add_argument(
    "--local-steps", type=int, default=1,
    help="H > 1: local steps (DiLoCo), the ternary exchange once every H optimizer steps",
)  # fmt: skip
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
config = GPT2Config(
    vocab_size=64, n_positions=32, n_embd=128, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
)
model = GPT2LMHeadModel(config)

# the toy language: arithmetic sequences of tokens, mod the vocabulary
g = torch.Generator().manual_seed(0)
starts, strides = torch.randint(0, 64, (512, 1), generator=g), torch.randint(1, 5, (512, 1))
tokens = (starts + strides * torch.arange(32)) % 64
data = [{"input_ids": t, "labels": t} for t in tokens]

out = tempfile.TemporaryDirectory()  # nothing is saved, but the Trainer makes its output_dir
training = TrainingArguments(
    output_dir=out.name, use_cpu=True, ddp_timeout=120,
    max_steps=args.steps, per_device_train_batch_size=8,
    gradient_accumulation_steps=args.accumulate, learning_rate=1e-3, logging_steps=5,
    save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
)  # fmt: skip
terngrad_callback = TernGradCallback(
    quantizer="terngrad", topology="sharded", local_steps=args.local_steps
)
trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[terngrad_callback])
trainer.train()

stats = terngrad_callback.state.stats
checksum = zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
every = [None] * dist.get_world_size()
dist.all_gather_object(every, checksum)
if trainer.is_world_process_zero():
    logs = trainer.state.log_history[-1]  # the callback puts terngrad's bytes in every log
    sent, fp32 = logs["terngrad/bytes_sent_per_step"], logs["terngrad/fp32_bytes_per_step"]
    print(
        f"terngrad on {dist.get_world_size()} ranks: {sent:,.0f} bytes sent per step per rank; "
        f"DDP's fp32 all-reduce sends {fp32:,.0f} ({logs['terngrad/compression']:.1f}x more)"
    )
    print(json.dumps({
        "bytes_sent_per_step": sent,
        "steps": stats.steps,
        "fp32_ring_bytes_per_step": fp32,
        "replicas_identical": len(set(every)) == 1,
    }))  # fmt: skip
dist.destroy_process_group()
out.cleanup()
