"""The measured figures of docs/integrations.md that ``test_doc_tables.py`` leaves unchecked (it
reads the Trainer's and the zoo's tables, the zoo's ablation and FSDP2's table), each read where
the page states it (the words around it, white space normalised) and made again with the
page's rounding: from the committed records of the Trainer's runs
(``docs/results/trainer-defaults/``), FSDP2's two runs (``docs/results/fsdp/``) and the GPT's
(``docs/results/transformer/``), and for the bytes of the examples' models from the traffic
model, which ``tests/distributed/test_traffic_model.py`` holds to the hook's and DiLoCo's own
counters. A figure that drifts from its source, or a source that changes under a figure, fails
here. The bytes the examples print are example output (the page says so) where the traffic
model's steady step is not the figure a run averages."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
WORDS = " ".join((DOCS / "integrations.md").read_text().split())
RESULTS = DOCS / "results"
TRAINER = RESULTS / "trainer-defaults"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _sent(prof, method, world: int = 2) -> float:
    """Bytes a step per rank of ``method`` on ``prof`` (a steady step, an outer step over its
    H), from the traffic model."""
    from terngrad.bench.traffic_model import transfers

    return sum(t.ranks[0].sent * t.weight for t in transfers(prof, method, world))


def _mlp():
    """The examples' MLP (784-256-10) and its profile."""
    import torch
    from torch import nn

    from terngrad.bench.profile import profile

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return profile(mlp, (784,))


def _tiny_gpt2():
    """``examples/hf_trainer_terngrad.py``'s GPT-2, its shapes only."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=128, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    with torch.device("meta"):
        return GPT2LMHeadModel(config)


def test_the_examples_mlp_bytes_are_the_traffic_models():
    """The page's opening (and the installation's example output): sharded TernGrad on the
    examples' MLP at 2 ranks against PyTorch's fp32 ring all-reduce."""
    from terngrad.comm import ring_bytes

    prof = _mlp()
    sent, fp32 = _sent(prof, "terngrad"), ring_bytes(4 * prof.numel, 2)
    assert (
        f"the scripts' MLP (784-256-10, {prof.numel:,} parameters; its last layer and biases stay "
        f"fp32), 2 ranks, TernGrad sharded: **{sent:,.0f} bytes sent per step per rank against "
        f"{fp32:,} for fp32 ({fp32 / sent:.1f}× fewer)**" in WORDS
    )
    assert f'{{"bytes_sent_per_step": {sent:.1f}, "steps": 30,' in WORDS


def test_the_trainer_scripts_bytes_are_the_traffic_models():
    """The Trainer's script: its tiny GPT-2's parameters, DDP's fp32 ring all-reduce and the
    callback's default method against it (a steady step), said in the opening, in the
    Trainer's section and in the FSDP2 table."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from terngrad.experiments import trainer_defaults as td

    model = _tiny_gpt2()
    sent, fp32 = td.counted_bytes(model, td.SETTINGS["default"])
    numel = sum(p.numel() for p in model.parameters())
    assert f"Trainer callback's own default, 5 levels: {fp32 / sent:.1f}× fewer, below" in WORDS
    assert (
        f"width 128 over 64 tokens, {numel:,} parameters, made from a config): "
        f"**{fp32 / sent:.1f}× fewer bytes sent per step per rank than DDP's fp32 all-reduce** "
        f"(example output: 181,088 against {fp32:,})" in WORDS
    )
    assert f"tiny GPT-2 (2 layers, width 128, vocabulary 64; {numel:,} parameters)" in WORDS


def test_the_callbacks_local_steps_bytes_are_the_traffic_models():
    """``--local-steps 4`` in the Trainer's and Lightning's examples (docs/integrations.md and
    docs/local-steps.md): DDP's fp32 all-reduce over what an outer step sends per inner step,
    the Trainer's with its callback's default method, Lightning's with TernGrad (and TernGrad
    per step), from the traffic model."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from terngrad.comm import ring_bytes
    from terngrad.experiments import trainer_defaults as td

    sent, fp32 = td.counted_bytes(_tiny_gpt2(), td.Setting(None, {"local_steps": 4}))
    trainer = fp32 / sent
    prof = _mlp()
    mlp_fp32 = ring_bytes(4 * prof.numel, 2)
    lightning = mlp_fp32 / _sent(prof, "terngrad-local4")
    per_step = mlp_fp32 / _sent(prof, "terngrad")
    assert (
        f"on 2 gloo ranks {trainer:.1f}× and {lightning:.1f}× fewer bytes per step than DDP's "
        "fp32 all-reduce, one model at the end" in WORDS
    )
    local_steps = " ".join((DOCS / "local-steps.md").read_text().split())
    assert (
        f"the Trainer's tiny GPT-2, 8 steps, {trainer:.1f}× fewer bytes per step than DDP's fp32 "
        f"all-reduce, replicas identical at the end; Lightning's MLP, 12 steps, {lightning:.1f}× "
        f"(per-step TernGrad: {per_step:.1f}×)" in local_steps
    )


# --------------------------------------------------------------------------- the Trainer's runs


def _records(model: str, setting: str) -> list[dict]:
    return sorted((_json(p) for p in TRAINER.glob(f"{model}-{setting}-s*.json")),
                  key=lambda r: r["seed"])  # fmt: skip


def _gap(model: str, setting: str, seed: int | None = None) -> float:
    """``setting``'s mean eval loss (or ``seed``'s) over DDP's 3-seed mean, minus one, in
    percent: the table's "vs DDP"."""
    runs = [r for r in _records(model, setting) if seed is None or r["seed"] == seed]
    ddp = statistics.fmean(r["eval_loss"] for r in _records(model, "ddp"))
    return 100 * (statistics.fmean(r["eval_loss"] for r in runs) / ddp - 1)


def _fewer(model: str, setting: str, digits: int = 1) -> str:
    """The setting's compression (every seed's the same) as the page writes it."""
    (compression,) = {round(r["compression"], 6) for r in _records(model, setting)}
    return f"{compression:.{digits}f}×"


def test_the_trainers_models_are_their_records():
    """The two models' parameters, and their sizes in thousands at the section's end."""
    numel = {m: _records(m, "ddp")[0]["numel"] for m in ("gpt2", "bert")}
    assert (
        f"n_head=4)`, its head tied to the token embedding: {numel['gpt2']:,} parameters)" in WORDS
    )
    assert f"tied to the word embeddings: {numel['bert']:,} parameters)" in WORDS
    k = sorted(round(n / 1000) for n in numel.values())
    assert f"These are small models ({k[0]}k and {k[1]}k parameters, 320 steps)" in WORDS


def test_the_defaults_reading_is_its_records():
    """The section 'What it says', the default: its gaps over 3 seeds (and against each seed's own
    DDP), its compression, and TernGrad per tensor's, from ``trainer-defaults``."""
    default = "hook-last-qsgd5-b64"

    def own(model: str) -> str:
        pairs = zip(_records(model, default), _records(model, "ddp"), strict=True)
        return ", ".join(f"{100 * (a['eval_loss'] / b['eval_loss'] - 1):+.2f}%" for a, b in pairs)

    assert (
        f"GPT-2 {_gap('gpt2', default):+.2f}% (3 seeds; against each seed's DDP {own('gpt2')}) at "
        f"{_fewer('gpt2', default)}, BERT {_gap('bert', default):+.2f}% (3 seeds; {own('bert')}) "
        f"at {_fewer('bert', default)}." in WORDS
    )
    assert (
        f"TernGrad per tensor (`hook`) was {_gap('gpt2', 'hook'):+.2f}% and "
        f"{_gap('bert', 'hook'):+.2f}% at {_fewer('gpt2', 'hook')} and {_fewer('bert', 'hook')}."
        in WORDS
    )


def test_the_rounding_variances_reading_is_its_records():
    """The section 'What it says', the gap and the rounding's variance: per-bucket scales, the tied
    embedding ternary at each bucket size (seed 0), and the settings that were not better."""
    ternary = {b: f"{_gap('gpt2', f'hook-last{b}', 0):+.2f}%"
               for b in ("", "-b256", "-b128", "-b64", "-b32")}  # fmt: skip
    assert (
        f"TernGrad `hook-b64` {_gap('gpt2', 'hook-b64'):+.2f}% on GPT-2 (3 seeds), "
        f"{_gap('bert', 'hook-b64'):+.2f}% on BERT; on GPT-2 with the tied embedding ternary, per "
        f"tensor {ternary['']}, b256 {ternary['-b256']}, b128 {ternary['-b128']}, b64 "
        f"{ternary['-b64']}, b32 {ternary['-b32']} (seed 0)" in WORDS
    )
    assert (
        f"(`-min0`, {_gap('gpt2', 'hook-last-min0-b64'):+.2f}% / "
        f"{_gap('bert', 'hook-last-min0-b64'):+.2f}%), TernGrad without clipping (`-noclip`, "
        f"{_gap('gpt2', 'hook-last-b64-noclip'):+.2f}%), 5 levels with a scale per 256 "
        f"({_gap('gpt2', 'hook-last-qsgd5-b256'):+.2f}% on GPT-2)" in WORDS
    )


def test_the_tied_embeddings_reading_is_its_records():
    """The section 'What it says', the tied embedding: the default against it kept in fp32 (seed 0,
    loss and compression), and ternary against TernGrad per 64 (3 seeds) and per tensor (seed 0)."""
    gpt2 = [_gap("gpt2", s, 0) for s in ("hook-qsgd5-b64", "hook-last-qsgd5-b64")]
    bert = [_gap("bert", s, 0) for s in ("hook-qsgd5-b64", "hook-last-qsgd5-b64")]
    saved = [gpt2[1] - gpt2[0], bert[1] - bert[0]]
    assert (
        f"in fp32 it saves {min(saved):.1f}–{max(saved):.1f} points of loss (GPT-2 {gpt2[0]:+.2f}% "
        f"against {gpt2[1]:+.2f}% on seed 0; BERT {bert[0]:+.2f}% against "
        f"{bert[1]:+.2f}% on seed 0) but sends {_fewer('gpt2', 'hook-qsgd5-b64')} and "
        f"{_fewer('bert', 'hook-qsgd5-b64')} fewer bytes instead of "
        f"{_fewer('gpt2', 'hook-last-qsgd5-b64')} and {_fewer('bert', 'hook-last-qsgd5-b64')}"
        in WORDS
    )
    assert (
        f"Ternary, it cost more ({_gap('gpt2', 'hook-last-b64'):+.2f}% against "
        f"{_gap('gpt2', 'hook-b64'):+.2f}% at b64, 3 seeds on GPT-2; "
        f"{_gap('gpt2', 'hook-last', 0):+.1f}% per tensor)" in WORDS
    )


def test_the_error_feedback_and_local_steps_reading_is_its_records():
    """The section 'What it says', error feedback (plain and fitted, per step and with H = 16) and
    local steps on both models, gaps against DDP's 3-seed mean."""
    assert f"under AdamW**: {_gap('gpt2', 'hook-ef'):+.1f}% on GPT-2." in WORDS
    assert (
        f"GPT-2 ends {_gap('gpt2', 'hook-ef-fit'):+.1f}% per step (`hook-ef-fit`, 1 seed) and "
        f"{_gap('gpt2', 'local16-fit'):+.1f}% with H = 16 (`local16-fit`)" in WORDS
    )
    tern = [r["eval_loss"] for r in _records("gpt2", "local16-noef")]
    ddp = statistics.fmean(r["eval_loss"] for r in _records("gpt2", "ddp"))
    gaps = [100 * (loss / ddp - 1) for loss in tern]
    bert = [
        _gap("bert", p.name[5:].rsplit("-s", 1)[0]) for p in TRAINER.glob("bert-local16*-s0.json")
    ]
    assert (
        f"with the default method send {_fewer('gpt2', 'local16-noef-last-qsgd5-b64', 0)} "
        f"fewer bytes and end {_gap('gpt2', 'local16-noef-last-qsgd5-b64'):+.2f}% on GPT-2 (seed "
        f"0; TernGrad per tensor without error feedback {statistics.fmean(gaps):+.2f}% ± "
        f"{statistics.stdev(gaps):.2f}% over 3 seeds at {_fewer('gpt2', 'local16-noef', 0)}, "
        f"with fp32 outer gradients {_gap('gpt2', 'local16-fp32'):+.2f}% at "
        f"{_fewer('gpt2', 'local16-fp32', 0)}). On BERT every local-steps setting ends "
        f"**{min(bert):+.1f}% to {max(bert):+.1f}%**" in WORDS
    )
    assert (
        f"worse than Nesterov's ({_gap('gpt2', 'local16-avg', 0):+.2f}% against "
        f"{_gap('gpt2', 'local16', 0):+.2f}% on seed 0, error feedback on)" in WORDS
    )


def test_gpt2_smalls_bytes_are_the_traffic_models():
    """The section 'What it says', GPT-2 small's real shape: its parameters, the tied embedding's
    share, DDP's bytes and what each setting sends against them
    (``trainer_defaults.counted_bytes``)."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from terngrad.experiments import trainer_defaults as td

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    numel = sum(p.numel() for p in model.parameters())
    wte = model.transformer.wte.weight

    def fewer(setting: str, digits: int = 1) -> str:
        sent, fp32 = td.counted_bytes(model, td.SETTINGS[setting])
        return f"{fp32 / sent:.{digits}f}×"

    _, fp32 = td.counted_bytes(model, None)
    assert (
        f"(`GPT2Config()`: {numel:,} parameters, the {wte.shape[0]:,} × {wte.shape[1]} embedding "
        "tied to the head)" in WORDS
    )
    assert (
        f"2 ranks, DDP's fp32 all-reduce {fp32:,} bytes a step: **the default sends "
        f"{fewer('default')} fewer**; TernGrad per tensor with the last layer in fp32 (`hook`) "
        f"{fewer('hook')}, ternary with b64 and the head (`hook-last-b64`) "
        f"{fewer('hook-last-b64')}, per tensor with the head {fewer('hook-last')}, with H = 16 "
        f"{fewer('local16')} (`local16`) and {fewer('local16-last', 0)} (`local16-last`)" in WORDS
    )
    assert (
        f"on GPT-2 small's shape, where it is {100 * wte.numel() / numel:.0f}% of the parameters, "
        f"{fewer('hook-qsgd5-b64')} instead of {fewer('default')}" in WORDS
    )
    assert f"On GPT-2 small's real shape it sends {fewer('default')} fewer bytes (below)" in WORDS


# --------------------------------------------------------------------------- FSDP2


def test_fsdp2s_setting_and_reading_are_its_runs():
    """FSDP2, measured: the GPT's parameters, the tokens a step, the ranks and steps, and
    TernGrad's step against FSDP's (``fsdp/``); the DDP comparison it cites, ``terngrad-b512``
    against fp32 at steps 100 and 250 (``transformer/results.json``)."""
    fsdp, ours = (_json(RESULTS / "fsdp" / f"{n}.json") for n in ("fsdp", "terngrad"))
    assert fsdp["parameters"] == ours["parameters"] and fsdp["ranks"] == ours["ranks"] == 4
    assert (
        f"terngrad's GPT ({ours['parameters']:,} parameters, d = 256, 4 blocks each "
        f"`fully_shard`-ed, and the root) on Python's documentation, {ours['ranks']} gloo ranks"
        in WORDS
    )
    assert f"({ours['tokens_per_step']:,} tokens a step)" in WORDS
    assert f"one seed, {ours['steps']} steps, loopback links" in WORDS
    longer = 100 * (ours["step_seconds"] / fsdp["step_seconds"] - 1)
    assert f"TernGrad's own work makes the step {longer:.0f}% longer" in WORDS

    runs = {r["method"]: dict(map(tuple, r["curve"])) for r in
            _json(RESULTS / "transformer" / "results.json")["runs"]}  # fmt: skip
    gap = {s: 100 * (runs["terngrad-b512"][s] / runs["fp32"][s] - 1) for s in (100, 250)}
    assert f": {gap[100]:+.1f}% at step 100, {gap[250]:+.1f}% at 250 with buckets of 512)" in WORDS


def test_the_zoos_ablation_and_candidates_prose_is_its_table():
    """The zoo's prose figures (the ablation by class, the candidates at about 8x) are cells
    of its table (``docs/results/zoo/results.md``: "vs DDP" and "fewer bytes")."""
    from support import markdown_rows

    header, *rows = markdown_rows((RESULTS / "zoo" / "results.md").read_text(), "| model")
    cell = {(r[0], r[1]): dict(zip(header, r, strict=True)) for r in rows}

    def gap(model: str, setting: str) -> str:
        return cell[(model, setting)]["vs DDP"].replace("-", "−")

    def times(model: str, setting: str) -> str:
        return cell[(model, setting)]["fewer bytes"].replace("x", "×")

    llama = [gap("llama", f"only-{c}-qsgd5-b64") for c in ("attn", "mlp", "head", "norm", "emb")]
    assert (
        f"attention {llama[0]}, MLP {llama[1]}, the untied head {llama[2]}, norms "
        f"{llama[3]}, the embeddings {llama[4]}; the parts add up to about the whole "
        f"({gap('llama', 'default')})" in WORDS
    )
    bert = sorted(float(gap("bert", f"only-{c}-qsgd5-b64").replace("−", "-").rstrip("%"))
                  for c in ("attn", "mlp", "head", "norm", "emb"))  # fmt: skip
    assert f"(−{-bert[0]:.2f}% to −{-bert[-1]:.2f}%" in WORDS
    q7, b32, q9 = "hook-last-qsgd7-b64", "hook-last-qsgd5-b32", "hook-last-qsgd9-b256"
    assert (
        f"7 levels {gap('llama', q7)} at {times('llama', q7)} (GPT-2 {gap('gpt2', q7)}, BERT "
        f"{gap('bert', q7)}, both at {times('gpt2', q7)} and {times('bert', q7)}, short of 8×), "
        f"buckets of 32 {gap('llama', b32)} at {times('llama', b32)}, 9 levels in buckets of "
        f"256 {gap('llama', q9)} at {times('llama', q9)}." in WORDS
    )
