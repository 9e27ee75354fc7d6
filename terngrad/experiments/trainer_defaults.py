"""The Hugging Face Trainer as a new user runs it, with and without ``TernGradCallback``:
which setting of the callback gives fp32's loss with the Trainer's defaults.

    torchrun --standalone --nproc-per-node 2 -m terngrad.experiments.trainer_defaults \\
        --model gpt2 --setting local16 --seed 0 --out docs/results/trainer-defaults

A model nobody here tuned, made from a config (nothing downloaded): a GPT-2 (``gpt2``: vocabulary
256, width 64, 4 layers, tied embeddings as GPT-2 has them) or a BERT-style encoder trained as a
masked language model (``bert``: vocabulary 256 bytes + 4 specials, width 64, 4 layers, its
decoder tied to the word embeddings), on Python's documentation read as bytes
(:func:`byte_streams`: every 10th file held out, as :mod:`terngrad.train.text` splits it). The
Trainer's defaults: AdamW at lr 1e-3 with a linear warm-up (``--warmup``) and cosine decay,
``max_grad_norm`` 1.0, weight decay 0, 16 windows of 128 bytes per rank and step; gloo, one
thread per rank. The eval loss on fixed held-out windows every ``--eval-every`` steps and at
the end (multiples of every H of :data:`SETTINGS`, where the replicas of local steps are one
model).

Each run writes ``<out>/<model>-<setting>-s<seed>.json``: the final eval loss, the curve, and
the callback's bytes per step per rank (``terngrad/bytes_sent_per_step``) against DDP's fp32
ring all-reduce (``terngrad/fp32_bytes_per_step``; for ``ddp``, the same formula).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from terngrad.comm.exchanges.traffic import ring_bytes
from terngrad.train import text
from terngrad.util.files import atomic_write_text


@dataclass(frozen=True)
class Setting:
    """A setting of the callback compared: a ``method`` of the one table (``None``: the
    callback's own default, :data:`~terngrad.integrations.transformers.DEFAULT_METHOD` as this
    version has it) with ``keywords`` over it (DiLoCo's outer step)."""

    method: str | None
    keywords: Mapping[str, Any] = field(default_factory=dict)

    def callback(self) -> Any:
        """``TernGradCallback(method=..., **keywords)``."""
        from terngrad.integrations.transformers import TernGradCallback

        method = {} if self.method is None else {"method": self.method}
        return TernGradCallback(**method, **self.keywords)


#: plain averaging as DiLoCo's outer step: SGD at rate 1 without momentum
AVERAGE = {"outer_lr": 1.0, "outer_momentum": 0.0}

#: the callback's settings compared, by the names their records carry (``None``: plain DDP, no
#: callback); each a method of the table (docs/methods.md) — ``hook`` the per-step hook,
#: ``local<H>`` local steps, ``-b<n>`` a scale per n elements, ``-last`` the last layer (here
#: the tied embedding) quantized too, ``-ef`` error feedback, ``-fit`` fitted scales, ``-noef``
#: none, ``-min0`` the small tensors quantized too, ``-qsgd5`` QSGD's 5 levels, ``-fp32`` fp32
#: outer gradients, ``-avg`` plain averaging as the outer step
SETTINGS: dict[str, Setting | None] = {
    "ddp": None,
    "default": Setting(None),
    "hook": Setting("terngrad"),
    "hook-ef": Setting("terngrad-ef"),
    "hook-last": Setting("terngrad-last"),
    "hook-ef-last": Setting("terngrad-last-ef"),
    "hook-ef-fit": Setting("terngrad-ef-fit"),
    "hook-ef-fit-last": Setting("terngrad-last-ef-fit"),
    "hook-b256": Setting("terngrad-b256"),
    "hook-b64": Setting("terngrad-b64"),
    "hook-last-b256": Setting("terngrad-b256-last"),
    "hook-last-b128": Setting("terngrad-b128-last"),
    "hook-last-b64": Setting("terngrad-b64-last"),
    "hook-last-b32": Setting("terngrad-b32-last"),
    "hook-last-min0-b64": Setting("terngrad-b64-last-min0"),
    "hook-last-b64-noclip": Setting("terngrad-b64-noclip-last"),
    "hook-last-qsgd5-b256": Setting("qsgd-5-b256-last"),
    "hook-qsgd5-b64": Setting("qsgd-5-b64"),
    "hook-last-qsgd5-b64": Setting("qsgd-5-b64-last"),
    "local16-noef-last-qsgd5-b64": Setting("qsgd-5-b64-last-local16"),
    "local8": Setting("terngrad-ef-local8"),
    "local16": Setting("terngrad-ef-local16"),
    "local8-last": Setting("terngrad-last-ef-local8"),
    "local16-last": Setting("terngrad-last-ef-local16"),
    "local16-fp32": Setting("fp32-sharded-local16"),
    "local16-noef": Setting("terngrad-local16"),
    "local8-noef": Setting("terngrad-local8"),
    "local16-noef-last": Setting("terngrad-last-local16"),
    "local16-noef-b64": Setting("terngrad-b64-local16"),
    "local16-fit": Setting("terngrad-ef-fit-local16"),
    "local16-fit-last": Setting("terngrad-last-ef-fit-local16"),
    "local16-avg": Setting("terngrad-ef-local16", AVERAGE),
    "local8-avg": Setting("terngrad-ef-local8", AVERAGE),
}
MODELS = ("gpt2", "bert")
CONTEXT = 128  # bytes a window
BATCH = 16  # windows per rank and step
EVAL_WINDOWS = 256  # fixed held-out windows
VOCAB = 256  # bytes
MASK = VOCAB  # BERT's [MASK]; ids 257-259 are its other specials, unused here
MASK_SHARE = 0.15  # of the tokens BERT predicts (80% masked, 10% random, 10% kept)


def byte_streams(folder: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training and held-out text of Python's documentation (or ``folder``'s ``*.txt``)
    as UTF-8 bytes: the files in path order, every :data:`~terngrad.train.text.HELD_OUT`-th
    held out, as :func:`terngrad.train.text.load_pydoc` splits them."""
    root = Path(folder) if folder else text.pydoc_folder()
    if root is None:
        raise SystemExit(f"Python's documentation is missing: {text.PYDOC_INSTALL}")
    files = sorted(root.rglob("*.txt"), key=lambda p: p.relative_to(root).as_posix())
    held = text.HELD_OUT
    parts = (
        [f for i, f in enumerate(files) if i % held != held - 1],
        [f for i, f in enumerate(files) if i % held == held - 1],
    )
    return tuple(
        torch.frombuffer(bytearray(text._read(p).encode("utf-8")), dtype=torch.uint8) for p in parts
    )


class Windows(torch.utils.data.Dataset):
    """Windows of :data:`CONTEXT` bytes of ``tokens`` at ``starts``; for BERT with a
    ``mask_seed`` each window masked by its own seeded draw (the held-out set: the same masks
    at every evaluation), else by the collator, anew each time."""

    def __init__(self, tokens: torch.Tensor, starts: torch.Tensor, model: str,
                 mask_seed: int | None = None) -> None:  # fmt: skip
        self.tokens, self.starts, self.model, self.mask_seed = tokens, starts, model, mask_seed

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = int(self.starts[i])
        ids = self.tokens[start : start + CONTEXT].long()
        if self.model == "gpt2":
            return {"input_ids": ids, "labels": ids}
        if self.mask_seed is None:
            return {"input_ids": ids}
        g = torch.Generator().manual_seed(self.mask_seed * len(self) + i)
        return dict(zip(("input_ids", "labels"), mask(ids[None], g), strict=True))


def mask(ids: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """BERT's masking of a batch: :data:`MASK_SHARE` of the tokens to predict, of those 80%
    become [MASK], 10% a random byte, 10% stay; labels -100 elsewhere."""
    u = torch.rand((*ids.shape, 3), generator=generator)
    chosen = u[..., 0] < MASK_SHARE
    inputs = ids.clone()
    inputs[chosen & (u[..., 1] < 0.8)] = MASK
    randomised = chosen & (u[..., 1] >= 0.8) & (u[..., 2] < 0.5)
    inputs[randomised] = torch.randint(0, VOCAB, ids.shape, generator=generator)[randomised]
    return inputs.squeeze(0), torch.where(chosen, ids, -100).squeeze(0)


def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack a batch; BERT's training windows get their masks here (the held-out ones have
    them)."""
    batch = {k: torch.stack([e[k] for e in examples]) for k in examples[0]}
    if "labels" not in batch:
        batch["input_ids"], batch["labels"] = mask(batch["input_ids"])
    return batch


def build_model(name: str) -> torch.nn.Module:
    """The untuned model ``name`` from its config (the caller seeds torch first)."""
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=4,
                            n_head=4, bos_token_id=0, eos_token_id=0)  # fmt: skip
        return GPT2LMHeadModel(config)
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=VOCAB + 4, hidden_size=64, num_hidden_layers=4,
                        num_attention_heads=4, intermediate_size=256,
                        max_position_embeddings=CONTEXT, pad_token_id=VOCAB + 1)  # fmt: skip
    return BertForMaskedLM(config)


def counted_bytes(model: torch.nn.Module, setting: Setting | None,
                  world: int = 2) -> tuple[float, int]:  # fmt: skip
    """The bytes per step per rank that ``setting``'s callback sends for ``model``
    on ``world`` ranks (``None``: DDP's), and DDP's fp32 ring all-reduce's, from the shapes
    alone (a model on the meta device will do) through the traffic model that
    ``tests/distributed/test_traffic_model.py`` checks against the hook's counters: a steady
    step, or with local steps the outer step's bytes over its ``H`` inner steps."""
    from terngrad.bench.profile import Param, Profile
    from terngrad.bench.traffic_model import transfers
    from terngrad.comm.rank.plans import last_layer_names
    from terngrad.comm.spec.methods import Method

    last = last_layer_names(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = tuple(  # ready in the backward pass in the reverse of the definition order
        Param(n, tuple(p.shape), 1 - i / len(named), n in last, i)
        for i, (n, p) in reversed(list(enumerate(named)))
    )
    profile = Profile("model", params, 0.0)
    fp32 = ring_bytes(4 * profile.numel, world)
    if setting is None:
        return float(fp32), fp32
    callback = setting.callback()
    method = Method(exchange=callback.options, local=callback.local)
    sent = sum(t.ranks[0].sent * t.weight for t in transfers(profile, method, world))
    return sent, fp32


def report(folder: Path) -> str:
    """``results.md`` in ``folder`` from its records: per model and setting, the eval loss
    (mean ± sample sd over the seeds), its gap to DDP's mean, the bytes per step per rank and
    the compression; returns the Markdown."""
    from terngrad.experiments.comparison import spread
    from terngrad.train.report import markdown_table

    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*-s*.json")):
        record = json.loads(path.read_text())
        runs.setdefault((record["model"], record["setting"]), []).append(record)
    rows = []
    for (model, setting), records in sorted(runs.items()):
        losses = [r["eval_loss"] for r in records]
        ddp = [r["eval_loss"] for r in runs.get((model, "ddp"), [])]
        gap = (
            f"{100 * (statistics.fmean(losses) / statistics.fmean(ddp) - 1):+.2f}%" if ddp else "—"
        )
        sent = statistics.fmean(r["bytes_sent_per_step"] for r in records)
        rows.append([
            model, setting, ", ".join(str(r["seed"]) for r in records), spread(losses, 4), gap,
            f"{sent:,.0f}", f"{records[0]['fp32_bytes_per_step'] / sent:.1f}x",
        ])  # fmt: skip
    table = markdown_table(
        ["model", "setting", "seeds", "eval loss", "vs DDP", "bytes / step / rank", "fewer bytes"],
        rows,
    )
    atomic_write_text(folder / "results.md", table)
    return table


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="gpt2")
    parser.add_argument("--setting", choices=tuple(SETTINGS), default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=320, help="optimizer steps")
    parser.add_argument("--eval-every", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=30, help="linear warm-up steps")
    parser.add_argument("--data-dir", default=None, help="a folder of .txt files (pydoc)")
    parser.add_argument("--out", required=True, help="folder of the result files")
    parser.add_argument("--report", action="store_true",
                        help="no training: write --out's results.md from its records")  # fmt: skip
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    made = None if setting is None else setting.callback().local
    local = 1 if made is None else made.every
    for name in ("steps", "eval_every"):
        value = getattr(args, name)
        if value < 1 or (isinstance(local, int) and value % local):
            parser.error(f"--{name.replace('_', '-')} {value} must be a positive multiple of "
                         f"the setting's local steps {local}")  # fmt: skip
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """One run on the ranks torchrun started; rank 0 writes its record and returns it (or,
    with ``--report``, the table of the records)."""
    import torch.distributed as dist
    from transformers import Trainer, TrainingArguments, set_seed

    args = parse_args(argv)
    if args.report:
        print(report(Path(args.out)))
        return {}
    torch.set_num_threads(1)
    train, held_out = byte_streams(args.data_dir)
    g = torch.Generator().manual_seed(1234)  # the data, the same for every seed
    starts = torch.randperm((len(train) - CONTEXT) // CONTEXT, generator=g) * CONTEXT
    spread = torch.linspace(0, len(held_out) - CONTEXT - 1, EVAL_WINDOWS).long()
    evaluation = Windows(held_out, spread, args.model, mask_seed=99)
    set_seed(args.seed)
    model = build_model(args.model)
    setting = SETTINGS[args.setting]
    callback = None if setting is None else setting.callback()
    out = Path(args.out)
    scratch = tempfile.TemporaryDirectory()  # the Trainer makes its output_dir; nothing saved
    training = TrainingArguments(
        output_dir=scratch.name, use_cpu=True, ddp_timeout=600,
        max_steps=args.steps, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=2 * BATCH, learning_rate=1e-3, warmup_steps=args.warmup,
        lr_scheduler_type="cosine", eval_strategy="steps", eval_steps=args.eval_every,
        logging_steps=args.eval_every, save_strategy="no", report_to="none",
        disable_tqdm=True, seed=args.seed,
    )  # fmt: skip
    trainer = Trainer(
        model=model, args=training, train_dataset=Windows(train, starts, args.model),
        eval_dataset=evaluation, data_collator=collate,
        callbacks=[] if callback is None else [callback],
    )  # fmt: skip
    began = time.perf_counter()
    trainer.train()
    final = trainer.evaluate()["eval_loss"]
    seconds = time.perf_counter() - began
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    fp32 = ring_bytes(4 * numel, dist.get_world_size())
    sent = fp32 if callback is None else callback.state.stats.bytes_sent_per_step
    record = {
        "model": args.model, "setting": args.setting, "seed": args.seed,
        "callback": None if setting is None else {"method": setting.method, **setting.keywords},
        "options": None if callback is None else callback.options.to_dict(),
        "steps": args.steps, "world": dist.get_world_size(), "numel": numel,
        "eval_loss": final,
        "curve": [[e["step"], e["eval_loss"]] for e in trainer.state.log_history
                  if "eval_loss" in e],
        "bytes_sent_per_step": sent, "fp32_bytes_per_step": fp32, "compression": fp32 / sent,
        "seconds": seconds,
    }  # fmt: skip
    if trainer.is_world_process_zero():
        out.mkdir(parents=True, exist_ok=True)
        name = f"{args.model}-{args.setting}-s{args.seed}.json"
        atomic_write_text(out / name, json.dumps(record) + "\n")
        print(json.dumps({k: v for k, v in record.items() if k != "curve"}), flush=True)
    dist.destroy_process_group()
    scratch.cleanup()
    return record


if __name__ == "__main__":
    main()
