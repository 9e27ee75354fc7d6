"""The model zoo of the Trainer's experiment (:mod:`terngrad.experiments.trainer_defaults`):
models nobody here tuned, each made from a config (nothing downloaded) at about 200k
parameters, and the real data each trains on.

Six families, split before any result was looked at into the half a default is chosen on
(:data:`TUNING`) and the half it is then checked on (:data:`CHECK`):

* ``gpt2``: GPT-2 (learned positions, LayerNorm, GELU, tied head), next byte;
* ``bert``: a BERT-style encoder, masked bytes (15%: 80% [MASK], 10% random, 10% kept);
* ``llama``: Llama-style (RMSNorm, rotary positions, SwiGLU, grouped-query attention with 2
  key/value heads for 4 query heads, an untied head), next byte;
* ``qwen2``: Qwen2-style (the same, with biases on q/k/v and a tied head), next byte;
* ``t5``: a T5-style encoder-decoder (relative position buckets, gated GELU, T5's tied head),
  the second half of a window from its first (a continuation, not T5's span corruption);
* ``vit``: a vision transformer (4×4 patches of 28×28 images, a class token), MNIST digits.

Text is read as UTF-8 bytes from one of two sources on the machine (:data:`TEXTS`): Python's
documentation (Debian's ``python3-doc``) or Vim's help files (``vim-runtime``); each file in
path order, every :data:`~terngrad.train.text.HELD_OUT`-th held out. The text models train on
their family's source unless told (:data:`Family.text`), so the zoo covers both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from terngrad.train import text

CONTEXT = 128  # bytes a window
VOCAB = 256  # bytes
MASK = VOCAB  # BERT's [MASK]; ids 257-259 its other specials, unused
MASK_SHARE = 0.15  # of the tokens BERT predicts (80% masked, 10% random, 10% kept)
T5_START, T5_PAD, T5_EOS = VOCAB + 1, VOCAB + 2, VOCAB + 3  # T5's own specials


def vim_folder() -> Path | None:
    """Vim's help files (``vim-runtime``): the newest ``/usr/share/vim/vim*/doc``, if any."""
    found = sorted(Path("/usr/share/vim").glob("vim*/doc"))
    return found[-1] if found else None


#: the text sources: a folder of ``*.txt`` files each, where the machine has it
TEXTS: dict[str, Callable[[], Path | None]] = {"pydoc": text.pydoc_folder, "vimdoc": vim_folder}
_INSTALL = {"pydoc": text.PYDOC_INSTALL, "vimdoc": "apt-get install vim-runtime"}


def byte_streams(source: str = "pydoc", folder: str | None = None) -> tuple[torch.Tensor, ...]:
    """The training and held-out text of ``source`` (or ``folder``'s ``*.txt``) as UTF-8
    bytes: the files in path order, every :data:`~terngrad.train.text.HELD_OUT`-th held out,
    as :func:`terngrad.train.text.load_pydoc` splits them."""
    root = Path(folder) if folder else TEXTS[source]()
    if root is None:
        raise SystemExit(f"{source} is missing: {_INSTALL[source]}, or pass --data-dir")
    files = sorted(root.rglob("*.txt"), key=lambda p: p.relative_to(root).as_posix())
    held = text.HELD_OUT
    parts = (
        [f for i, f in enumerate(files) if i % held != held - 1],
        [f for i, f in enumerate(files) if i % held == held - 1],
    )
    return tuple(
        torch.frombuffer(bytearray(text._read(p).encode("utf-8")), dtype=torch.uint8) for p in parts
    )


# --------------------------------------------------------------------------- the families


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=4, n_head=4, bos_token_id=0,
        eos_token_id=0,
    ))  # fmt: skip


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(
        vocab_size=VOCAB + 4, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=CONTEXT, pad_token_id=VOCAB + 1,
    ))  # fmt: skip


def _decoder(config: str, model: str, tied: bool) -> torch.nn.Module:
    """A Llama-style decoder of transformers' ``config`` and ``model`` classes: RMSNorm, rotary
    positions, SwiGLU, grouped-query attention (2 key/value heads for 4), ``tied`` head or not."""
    import transformers

    made = getattr(transformers, config)(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
        tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return getattr(transformers, model)(made)


def _t5() -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    # (T5Config's tied head, its output scaled by d_model ** -0.5 as T5 has it)
    return T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB + 4, d_model=64, d_kv=16, d_ff=128, num_layers=2,
        num_decoder_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
        decoder_start_token_id=T5_START, pad_token_id=T5_PAD, eos_token_id=T5_EOS,
    ))  # fmt: skip


def _vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(
        image_size=28, patch_size=4, num_channels=1, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, intermediate_size=256, num_labels=10,
    ))  # fmt: skip


@dataclass(frozen=True)
class Family:
    """A family of the zoo: what it learns (``task``: ``causal``, ``masked``, ``seq2seq`` or
    ``image``), its text source where it reads text, and its model from a config."""

    task: str
    build: Callable[[], torch.nn.Module]
    text: str | None = None


FAMILIES: dict[str, Family] = {
    "gpt2": Family("causal", _gpt2, "pydoc"),
    "bert": Family("masked", _bert, "pydoc"),
    "llama": Family("causal", lambda: _decoder("LlamaConfig", "LlamaForCausalLM", False), "vimdoc"),
    "qwen2": Family("causal", lambda: _decoder("Qwen2Config", "Qwen2ForCausalLM", True), "pydoc"),
    "t5": Family("seq2seq", _t5, "vimdoc"),
    "vit": Family("image", _vit),
}
#: the half a default is chosen on, and the half it is checked on (fixed before any run)
TUNING = ("gpt2", "bert", "llama")
CHECK = ("qwen2", "t5", "vit")


def build_model(name: str) -> torch.nn.Module:
    """The untuned model ``name`` from its config (the caller seeds torch first)."""
    return FAMILIES[name].build()


# --------------------------------------------------------------------------- the data


class Windows(torch.utils.data.Dataset):
    """Windows of :data:`CONTEXT` bytes of ``tokens`` at ``starts`` as ``task`` reads them;
    for the masked task with a ``mask_seed`` each window masked by its own seeded draw (the
    held-out set: the same masks at every evaluation), else by :func:`collate`, anew."""

    def __init__(self, tokens: torch.Tensor, starts: torch.Tensor, task: str,
                 mask_seed: int | None = None) -> None:  # fmt: skip
        self.tokens, self.starts, self.task, self.mask_seed = tokens, starts, task, mask_seed

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = int(self.starts[i])
        ids = self.tokens[start : start + CONTEXT].long()
        if self.task == "causal":
            return {"input_ids": ids, "labels": ids}
        if self.task == "seq2seq":  # the second half from the first
            half = CONTEXT // 2
            return {"input_ids": ids[:half].clone(), "labels": ids[half:].clone()}
        if self.mask_seed is None:
            return {"input_ids": ids}
        g = torch.Generator().manual_seed(self.mask_seed * len(self) + i)
        return dict(zip(("input_ids", "labels"), mask(ids[None], g), strict=True))


class Images(torch.utils.data.Dataset):
    """Images (N, C, H, W, uint8 or float) in [0, 1] and their labels, for the ViT."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x = x.float() / 255 if x.dtype == torch.uint8 else x.float()
        self.y = y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


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
    """Stack a batch; the masked task's training windows get their masks here (the held-out
    ones have them)."""
    batch = {k: torch.stack([e[k] for e in examples]) for k in examples[0]}
    if "labels" not in batch:
        batch["input_ids"], batch["labels"] = mask(batch["input_ids"])
    return batch


def datasets(
    name: str, eval_windows: int, source: str | None = None, folder: str | None = None
) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """The training and held-out sets of family ``name``: its text (``source``, by default its
    own; ``folder``: a folder of ``*.txt`` instead) cut into windows in an order fixed for
    every seed, ``eval_windows`` of them held out, evenly spread; or MNIST's images for the
    ViT (its test set held out, the first ``eval_windows`` of it)."""
    family = FAMILIES[name]
    if family.task == "image":
        from terngrad.train import data

        mnist = data.load("mnist", folder)
        assert isinstance(mnist, data.DataSet)
        return (Images(mnist.train_x, mnist.train_y),
                Images(mnist.test_x[:eval_windows], mnist.test_y[:eval_windows]))  # fmt: skip
    train, held_out = byte_streams(source or family.text or "pydoc", folder)
    g = torch.Generator().manual_seed(1234)  # the data, the same for every seed
    starts = torch.randperm((len(train) - CONTEXT) // CONTEXT, generator=g) * CONTEXT
    spread = torch.linspace(0, len(held_out) - CONTEXT - 1, eval_windows).long()
    return (Windows(train, starts, family.task),
            Windows(held_out, spread, family.task, mask_seed=99))  # fmt: skip
