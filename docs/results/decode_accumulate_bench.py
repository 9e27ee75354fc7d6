"""Four TernGrad messages decoded and summed in rank order, as ``own_scales`` does: decoded into
a buffer and then added (the path before ``accumulate``) against ``decode_into(...,
accumulate=True)``. One thread, medians of 30 alternated calls; the two sums are checked equal
bit for bit first. Run: ``.venv/bin/python docs/results/decode_accumulate_bench.py``."""

import time
from collections.abc import Callable
from functools import partial

import torch

from terngrad import quantize
from terngrad.kernels import resolve
from terngrad.quantize import Encoded, Layout

KERNELS, Q = resolve("numba"), quantize.get("terngrad")


def decode_then_add(messages: list[Encoded], layout: Layout, total, part) -> None:
    for r, message in enumerate(messages):
        Q._decode(KERNELS, message, layout, total if r == 0 else part)
        if r:
            total += part


def decode_adding(messages: list[Encoded], layout: Layout, total) -> None:
    for r, message in enumerate(messages):
        Q._decode(KERNELS, message, layout, total, accumulate=r > 0)


def median_ms(calls: dict[str, Callable[[], None]], repeats: int = 30) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[repeats // 2] * 1e3 for name, t in times.items()}


def main() -> None:
    torch.set_num_threads(1)
    for numel in (431_080, 4_000_000):  # LeNet's gradient; a larger one
        layout = Layout.of(numel)
        messages = [Q.encode(torch.randn(numel), kernels=KERNELS) for _ in range(4)]
        total, part = torch.empty(numel), torch.empty(numel)
        decode_then_add(messages, layout, total, part)
        before = total.clone()
        decode_adding(messages, layout, total)
        assert torch.equal(before, total)
        ms = median_ms(
            {
                "decode, then add": partial(decode_then_add, messages, layout, total, part),
                "accumulate": partial(decode_adding, messages, layout, total),
            }
        )
        times = ", ".join(f"{name} {t:.2f} ms" for name, t in ms.items())
        ratio = ms["decode, then add"] / ms["accumulate"]
        print(f"{numel:>9,} elements x 4 messages: {times} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
