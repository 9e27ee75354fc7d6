"""The Hugging Face Trainer as a new user runs it, with and without ``TernGradCallback``:
which setting of the callback gives fp32's loss with the Trainer's defaults.

    torchrun --standalone --nproc-per-node 2 -m terngrad.experiments.trainer_defaults \\
        --model gpt2 --setting local16 --seed 0 --out docs/results/trainer-defaults

A model nobody here tuned, made from a config (nothing downloaded), of the zoo's six families
(:mod:`terngrad.experiments.zoo`: GPT-2, BERT, Llama-, Qwen2-, T5-style, a ViT), on real text
read as bytes (Python's documentation or Vim's help, every 10th file held out) or MNIST. The
Trainer's defaults: AdamW at lr 1e-3 with a linear warm-up (``--warmup``) and cosine decay,
``max_grad_norm`` 1.0, weight decay 0, 16 windows of 128 bytes (or images) per rank and step;
gloo, one thread per rank. The eval loss on fixed held-out windows every ``--eval-every``
steps and at the end (multiples of every H of :data:`SETTINGS`, where the replicas of local
steps are one model).

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
from terngrad.experiments import zoo
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
    # candidates for a default closer to DDP at about 8x fewer bytes (more levels or smaller
    # buckets than the default's)
    "hook-last-qsgd5-b32": Setting("qsgd-5-b32-last"),
    "hook-last-qsgd7-b64": Setting("qsgd-7-b64-last"),
    "hook-last-qsgd9-b256": Setting("qsgd-9-b256-last"),
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
    # the default's quantizer on one class of tensors alone, the rest in fp32 (an ablation)
    **{
        f"only-{c}-qsgd5-b64": Setting(f"qsgd-5-b64-only{c}")
        for c in ("emb", "attn", "mlp", "norm", "head")
    },
    "local8-avg": Setting("terngrad-ef-local8", AVERAGE),
}
MODELS = tuple(zoo.FAMILIES)
BATCH = 16  # windows (or images) per rank and step
EVAL_WINDOWS = 256  # fixed held-out windows (or images)


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
    parser.add_argument("--text", choices=tuple(zoo.TEXTS), default=None,
                        help="the text the model reads (default: its family's)")  # fmt: skip
    parser.add_argument("--data-dir", default=None,
                        help="a folder of .txt files instead (the ViT: MNIST's)")  # fmt: skip
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
    train, evaluation = zoo.datasets(args.model, EVAL_WINDOWS, args.text, args.data_dir)
    set_seed(args.seed)
    model = zoo.build_model(args.model)
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
        model=model, args=training, train_dataset=train, eval_dataset=evaluation,
        data_collator=zoo.collate,
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
        "text": None if zoo.FAMILIES[args.model].task == "image"
        else args.text or zoo.FAMILIES[args.model].text,
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
