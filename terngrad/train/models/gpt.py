"""A small GPT for character-level language modelling: token and position embeddings, pre-norm
blocks of causal self-attention and a GELU MLP, a final layer norm and an untied head, weights
initialised as in GPT-2."""

from __future__ import annotations

import math

import torch
from torch import nn

from terngrad.train.models.base import Model, dropout_layers


class _CausalSelfAttention(nn.Module):
    """Multi-head self-attention over the positions up to each one: ``qkv`` (d -> 3d) splits into
    ``heads`` heads of ``d / heads``, ``softmax(q k^T / sqrt(d/heads) + causal mask) v``, then
    ``proj`` (d -> d) (Vaswani et al. 2017, Sec. 3.2)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            part.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for part in self.qkv(x).split(d, dim=2)
        )
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    """A pre-norm transformer block (GPT-2): ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))`` with
    ``mlp`` = Linear(d, 4d) -> GELU -> Linear(4d, d)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = _CausalSelfAttention(width, heads, dropout)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width),
            nn.GELU(),
            nn.Linear(4 * width, width),
            *dropout_layers(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(Model):
    """A small GPT-style character-level language model (not from the paper; Radford et al.
    2019's layout at a small size): token and learned position embeddings (d each), ``layers``
    pre-norm blocks of causal self-attention with ``heads`` heads and a 4d MLP, a final layer
    norm and a linear head to the vocabulary (not tied to the embedding, so the head is the
    last layer the DDP hook keeps in fp32). Defaults: 4 layers, d = 256, 4 heads, context 128,
    about 3.2 million parameters. Inputs are token ids ``(B, T)`` with ``T <= context``; outputs
    are next-token logits ``(B, T, num_classes)``. Initialisation as GPT-2: weights
    ``N(0, 0.02)``, the residual projections ``N(0, 0.02 / sqrt(2 * layers))``, zero biases."""

    name = "gpt"
    task = "text"
    default_input_shape = (128,)

    def __init__(
        self,
        input_shape: tuple[int] = default_input_shape,
        num_classes: int = 256,
        dropout: float = 0.0,
        width: int = 256,
        layers: int = 4,
        heads: int = 4,
    ) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"gpt: width {width} does not split into {heads} heads")
        self.context = input_shape[0]
        self.token = nn.Embedding(num_classes, width)
        self.position = nn.Embedding(self.context, width)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.blocks = nn.Sequential(*(_Block(width, heads, dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                residual = name.endswith(("attn.proj.weight", "mlp.2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.context:
            raise ValueError(
                f"gpt: a sequence of {t} tokens is longer than the context {self.context}"
            )
        h = self.drop(self.token(x) + self.position(torch.arange(t, device=x.device)))
        return self.head(self.norm(self.blocks(h)))


class GPTSmall(GPT):
    """:class:`GPT` at half the width: d = 128, 4 layers, 4 heads, context 128 (about 0.8
    million parameters, a quarter of the compute a token): sized so that the AdamW comparison
    (``terngrad reproduce transformer --model gpt-small``: four methods, three seeds, 1,000
    steps) should fit about three hours of a 2-core machine (estimated from that share, not
    yet timed)."""

    name = "gpt-small"

    def __init__(
        self,
        input_shape: tuple[int] = GPT.default_input_shape,
        num_classes: int = 256,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(input_shape, num_classes, dropout, width=128, layers=4, heads=4)
