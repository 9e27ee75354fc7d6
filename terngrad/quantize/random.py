"""The random draws of stochastic rounding: counter-based, so any kernel can compute any one.

Each stream has a 63-bit key; draws ``2p`` and ``2p + 1`` of the stream keyed ``K`` are two
24-bit fields of splitmix64's output at position ``p`` (Steele, Lea & Flood, OOPSLA 2014)::

    z = K + (p + 1) * 0x9E3779B97F4A7C15                  (mod 2**64)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    u_2p = (z >> 40) * 2**-24                             bits 40..63
    u_2p+1 = ((z >> 16) & (2**24 - 1)) * 2**-24           bits 16..39

each in [0, 1 - 2**-24], float32 exact. One 64-bit hash gives two draws: the hash's three 64-bit
multiplies were most of the cost of a fused rounding pass (without AVX-512 each is three 32-bit
vector multiplies), and splitmix64's output bits are all of the same quality, so the two fields
are as uniform and as independent as two outputs (tested).

A draw depends on the key and the index only, not on the order elements are visited in, the
chunking, the thread count or the device: a fused kernel, the pure-torch reference and a test
all compute the same ``u`` for the same element. The exchange keys one stream per parameter and
step, ``stream_seed(seed, rank, step, parameter index)``, and indexes it by the element's
position inside the parameter, so the draws do not depend on how DDP groups parameters into
buckets either.

Resolution and bias: ``u`` takes the 2**24 values ``r / 2**24``; rounding up when ``u < f``
happens with probability ``ceil(f 2**24) / 2**24``, which exceeds ``f`` by less than 2**-24.
A value on a grid of step ``s/m`` is therefore biased by less than ``(s/m) 2**-24`` (always away
from zero) — 6e-8 of the scale for TernGrad — far below float32 rounding of the gradient itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_MASK64 = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
UNIFORM_BITS = 24


def stream_seed(*parts: int) -> int:
    """A 63-bit stream key mixed from integers (splitmix64's finaliser after each), so that the
    streams of different (seed, rank, step, parameter) tuples are unrelated."""
    x = 0
    for part in parts:
        x = (x + (part & _MASK64) + GOLDEN) & _MASK64
        x = ((x ^ (x >> 30)) * MIX1) & _MASK64
        x = ((x ^ (x >> 27)) * MIX2) & _MASK64
        x ^= x >> 31
    return x >> 1


def counter_uniform(key: int, start: int, count: int) -> torch.Tensor:
    """Draws ``start .. start + count - 1`` of the stream ``key`` (float32): the reference
    definition, in numpy's wrapping uint64 arithmetic."""
    i = np.arange(start, start + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(key) + ((i >> np.uint64(1)) + np.uint64(1)) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    z ^= z >> np.uint64(31)
    shift = np.where(i & np.uint64(1), np.uint64(16), np.uint64(64 - UNIFORM_BITS))
    r = ((z >> shift) & np.uint64(2**UNIFORM_BITS - 1)).astype(np.float32)
    return torch.from_numpy(r * np.float32(2.0**-UNIFORM_BITS))


@dataclass(frozen=True)
class Streams:
    """The draws of a flat gradient cut into segments: element ``e`` of segment ``p`` takes
    draw ``e`` of the stream ``keys[p]``."""

    keys: tuple[int, ...]

    def __post_init__(self) -> None:
        if any(not 0 <= k < 2**63 for k in self.keys):
            raise ValueError("stream keys must be integers in [0, 2**63)")

    def uniform(self, segments: Sequence[int]) -> torch.Tensor:
        """Every draw of a flat gradient of ``segments`` (the reference, one stream at a time)."""
        if len(segments) != len(self.keys):
            raise ValueError(f"{len(self.keys)} stream keys for {len(segments)} segments")
        parts = [counter_uniform(k, 0, n) for k, n in zip(self.keys, segments, strict=True)]
        return torch.cat(parts) if parts else torch.empty(0)

    @classmethod
    def from_generator(cls, generator: torch.Generator | None, segments: int) -> Streams:
        """One stream per segment, keyed from one 62-bit draw of ``generator`` (the global
        generator if ``None``): how ``Quantizer.encode`` turns a generator into draws, so that
        the reference and every fused kernel round with the same ones."""
        device = generator.device if generator is not None else "cpu"
        key = int(torch.randint(2**62, (1,), generator=generator, device=device))
        return cls(tuple(stream_seed(key, p) for p in range(segments)))

    def key_array(self) -> np.ndarray:
        """The keys as uint64, for the kernels."""
        return np.array(self.keys, dtype=np.uint64)


def stochastic_round(t: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Unbiased random rounding: ``floor(t) + 1[u < t - floor(t)]``, so ``E = t`` for u ~ U[0, 1).

    The variance of one rounding is ``f (1 - f)`` with ``f = t - floor(t)``. ``uniform`` comes
    from ``torch.rand`` (24-bit resolution), so the probability of rounding up is off from ``f``
    by less than 2**-24.
    """
    lower = t.floor()
    return lower + (uniform < t - lower)
