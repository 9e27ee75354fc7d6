"""The Hugging Face Trainer with the terngrad hook — one line, ``callbacks=[TernGradCallback()]``:

    torchrun --standalone --nproc-per-node 2 examples/hf_trainer_terngrad.py

A tiny GPT-2 made from a config (nothing downloaded) learns an in-memory toy language on CPU,
2 gloo ranks, 2 micro-batches per optimizer step, the callback's default method
(``DEFAULT_METHOD``: 5 levels, a scale per 64 elements, the tied head quantized too;
``--local-steps 4``: the Trainer's AdamW steps each replica on its own, and every 4th step the
replicas average what they moved through the same exchange). Rank 0 prints the Trainer's logs
(terngrad's bytes among them), the bytes per step against DDP's fp32 all-reduce, and then a
JSON line that says whether every rank ends with the same parameters.

``--fsdp``: the Trainer's FSDP2 (``fsdp_config={"fsdp_version": 2}``, a ``GPT2Block`` per FSDP
module), the same callback putting TernGrad in FSDP's reduce-scatter, compared with FSDP's fp32
reduce-scatter. accelerate 1.15 runs FSDP on GPUs only: on CPU the Trainer trains through DDP
and the callback warns that it hooks DDP instead (the JSON's ``route`` says which ran).
"""

import argparse
import json
import tempfile
import zlib

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from terngrad.integrations.transformers import TernGradCallback

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
parser.add_argument(
    "--local-steps", type=int, default=1,
    help="H > 1: local steps (DiLoCo), the ternary exchange once every H optimizer steps",
)  # fmt: skip
parser.add_argument("--fsdp", action="store_true", help="FSDP2 (on GPUs; DDP on CPU)")
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
fsdp = {"fsdp": True, "fsdp_config": {"fsdp_version": 2, "transformer_layer_cls_to_wrap": [
    "GPT2Block"]}} if args.fsdp else {}  # fmt: skip
training = TrainingArguments(
    output_dir=out.name, use_cpu=not (args.fsdp and torch.cuda.is_available()), ddp_timeout=120,
    **fsdp,
    max_steps=args.steps, per_device_train_batch_size=8,
    gradient_accumulation_steps=args.accumulate, learning_rate=1e-3, logging_steps=5,
    save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
)  # fmt: skip
terngrad_callback = TernGradCallback(local_steps=args.local_steps)  # the default method
trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[terngrad_callback])
trainer.train()

state = terngrad_callback.state
# FSDP2's parameters are shards: all-gathered, every rank's full model
full = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
checksum = zlib.crc32(b"".join(p.detach().cpu().numpy().tobytes() for p in full))
every = [None] * dist.get_world_size()
dist.all_gather_object(every, checksum)
if trainer.is_world_process_zero():
    logs = trainer.state.log_history[-1]  # the callback puts terngrad's bytes in every log
    sent, fp32 = logs["terngrad/bytes_sent_per_step"], logs["terngrad/fp32_bytes_per_step"]
    baseline = "FSDP's fp32 reduce-scatter" if trainer.is_fsdp_enabled else "DDP's fp32 all-reduce"
    print(
        f"terngrad on {dist.get_world_size()} ranks: {sent:,.0f} bytes sent per step per rank; "
        f"{baseline} sends {fp32:,.0f} ({logs['terngrad/compression']:.1f}x more)"
    )
    # what FSDP's fp32 reduce-scatter sends under FSDP2, DDP's fp32 ring all-reduce otherwise
    baseline_key = "fp32_reduce_scatter" if trainer.is_fsdp_enabled else "fp32_ring"
    print(json.dumps({
        "route": f"{type(state).__module__}.{type(state).__name__}",
        "bytes_sent_per_step": sent,
        "steps": state.stats.steps,
        f"{baseline_key}_bytes_per_step": fp32,
        "replicas_identical": len(set(every)) == 1,
    }))  # fmt: skip
dist.destroy_process_group()
out.cleanup()
