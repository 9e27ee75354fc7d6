"""The one way terngrad says how two sets of settings differ (ranks against rank 0, a run
against its checkpoint, a hook state against the hook it is loaded into)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

import torch


def same(a: Any, b: Any) -> bool:
    """``a == b``, with NaN equal to NaN (a setting of NaN is the same setting everywhere),
    through mappings and sequences; tensors bit for bit (dtype, shape and every byte)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(_bytes(a), _bytes(b))
        )  # fmt: skip
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, flat (so that a NaN equals the same NaN)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def differences(
    reference: Mapping[str, Any], other: Mapping[str, Any], ignore: Collection[str] = ()
) -> list[str]:
    """``key=<other> instead of <reference>`` for every key whose values differ, sorted; a
    nested mapping by its own keys (``quantizer_options.clip=2.0 instead of 2.5``), a list by
    its length or its first differing entry (``parameters[3]=... instead of ...``)."""
    out: list[str] = []
    for key in sorted((reference.keys() | other.keys()) - set(ignore)):
        a, b = reference.get(key), other.get(key)
        if same(a, b):
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += [f"{key}.{line}" for line in differences(a, b)]
        elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
            if len(a) != len(b):
                out.append(f"{key}: {len(b)} entries instead of {len(a)}")
            else:
                i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if not same(x, y))
                out.append(f"{key}[{i}]={b[i]!r} instead of {a[i]!r}")
        else:
            out.append(f"{key}={b!r} instead of {a!r}")
    return out
