"""The fused CPU backend: each of the exchange's operations in one parallel pass over CPU
tensors, through the numba kernels of :mod:`terngrad.kernels.encode_cpu`,
:mod:`~terngrad.kernels.decode_cpu` and :mod:`~terngrad.kernels.draws_cpu`; and the level
quantizers' fit, rounding and decoding through those of :mod:`terngrad.kernels.level_fit_cpu`
and :mod:`terngrad.kernels.levels_cpu`.

numba is imported when a :class:`NumbaKernels` is made, not when this module is.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import threading

import numpy as np
import torch

from terngrad.kernels.checks import _check_out, _check_payload, _check_range, _moments
from terngrad.quantize import TorchKernels
from terngrad.quantize.bingrad import PB_SWEEPS, BinGradB, BinGradPB
from terngrad.quantize.grid import overflow_limit
from terngrad.quantize.kernels import GridInput, Kernels, check_draws
from terngrad.quantize.linear import Linear
from terngrad.quantize.orq import ORQ
from terngrad.quantize.random import Streams
from terngrad.quantize.signsgd import SignSGD
from terngrad.wire import BLOCK_WORDS, Codec, word_layout

_TARGET_CHUNK = 32768  # elements per parallel task: a few hundred KB of scratch, in L2


def _codec_args(codec: Codec) -> tuple[int, int, int, int]:
    """``(kind, param, k, w)`` for the kernels: kind 0 base-B (k digits per w-byte word),
    1 n-bit stream."""
    from terngrad.kernels.packing_cpu import BASE, NBIT

    base = _word_base(codec)
    if base is not None:
        return (BASE, base, *word_layout(base))
    if codec.kind == "nbit":
        return NBIT, codec.param, 0, 0
    raise ValueError(f"the fused kernels pack digits, not {codec} floats")


def _word_base(codec: Codec) -> int | None:
    """The base of a codec packed in planar words (an n-bit codec whose digits fill whole
    bytes is base 2**bits), or ``None``."""
    if codec.kind == "base":
        return codec.param
    if codec.kind == "nbit" and 8 % codec.param == 0:
        return 1 << codec.param
    return None


def _chunk(*codecs: Codec) -> int:
    """Elements per task: a multiple of every codec's planar block (8 digits for a bit
    stream), so that every task starts at a block."""
    unit = 1
    for codec in codecs:
        base = _word_base(codec)
        unit = math.lcm(unit, BLOCK_WORDS * word_layout(base)[0] if base else 8)
    return unit * max(1, _TARGET_CHUNK // unit)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


@functools.cache
def numba_available() -> bool:
    """True if the fused CPU kernels can run here."""
    return importlib.util.find_spec("numba") is not None


def _level_method(q) -> int | None:
    """The level kernels' code for ``q``'s method (its exact class: a subclass may change the
    fit or the rounding), or ``None``: the reference runs that quantizer's level operations."""
    from terngrad.kernels import level_fit_cpu as lc

    codes = {Linear: lc.LINEAR, ORQ: lc.ORQ, BinGradB: lc.BINGRAD_B, BinGradPB: lc.BINGRAD_PB}
    return {**codes, SignSGD: lc.SIGNSGD}.get(type(q))


_launch = threading.Lock()


class NumbaKernels(Kernels, name="numba", devices=("cpu",)):
    """Fused CPU kernels (numba), parallel over chunks with as many threads as torch uses.

    Numba's thread pool is its ``workqueue`` layer unless ``NUMBA_THREADING_LAYER`` says
    otherwise: the OpenMP layer's threads spin while they wait, and with one training process
    per core that spinning took the cores from the other processes (measured: LeNet with 4
    workers on 2 cores ran 4.5x slower). Launches are serialised by a lock, as the workqueue
    layer must not be entered from two threads at once.
    """

    def __init__(self) -> None:
        import numba  # ImportError here when numba is missing

        if "NUMBA_THREADING_LAYER" not in os.environ:
            numba.config.THREADING_LAYER = "workqueue"
        from terngrad.kernels import decode_cpu, draws_cpu, encode_cpu

        self._encode, self._decode, self._draws = encode_cpu, decode_cpu, draws_cpu
        #: the level operations of a quantizer these kernels do not know
        self._reference = TorchKernels()

    @classmethod
    def unavailable(cls, device: torch.device) -> str | None:
        if device.type != "cpu":
            return (
                f"kernels='numba' runs on CPU tensors; these are on {device}: "
                "use kernels='auto', 'triton' or 'torch'"
            )
        if not numba_available():
            return "kernels='numba' needs the numba package: pip install numba"
        return None

    @staticmethod
    def _run(kernel, *args):
        """``kernel(*args)`` (a :class:`~terngrad.kernels.compile_cpu.Kernel`) on as many threads as
        torch uses: the serial build for one (no parallel launch), else the parallel one, one
        launch at a time."""
        import numba

        threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
        if threads == 1:
            return kernel.serial(*args)
        with _launch:
            numba.set_num_threads(threads)
            return kernel.parallel(*args)

    def grid_prepare(self, q, flat, layout):
        x = _np(flat)
        starts = _np(layout.bucket_starts)
        raw = torch.from_numpy(
            self._run(self._encode.bucket_moments, x, x.view(np.int32), starts, 1 << 16)
        )
        shift = torch.from_numpy(x[starts[:-1]]).double()
        moments = _moments(raw[:, 0], raw[:, 1], raw[:, 2], raw[:, 3], raw[:, 4], shift)
        bound = q.clip_bound(moments)
        return GridInput(q, flat, layout, bound, q.scale_from_moments(moments, bound))

    def grid_pack(self, grid, shared, draws, lo, hi, codec, out):
        _check_range(lo, hi - lo, grid.layout, shared)
        check_draws(draws, grid.layout)
        _check_payload(out, codec, hi - lo)
        layout = grid.layout
        bound = np.full(layout.n_buckets, np.inf, np.float32)
        if grid.bound is not None:  # a bucket whose bound is 0 (sigma = 0) is not clipped
            bound = np.where(_np(grid.bound) > 0, _np(grid.bound), bound)
        if isinstance(draws, Streams):
            keys, uniform = draws.key_array(), np.empty(0, np.float32)
        else:
            keys, uniform = np.zeros(len(layout.segments), np.uint64), _np(draws.reshape(-1))
        self._run(
            self._encode.grid_pack,
            _np(grid.flat), lo, hi, _np(layout.bucket_starts), bound, _np(shared),
            grid.quantizer.m, _np(layout.segment_starts), keys, uniform,
            *_codec_args(codec), _chunk(codec), out.numpy(),
        )  # fmt: skip

    def sum_packed(self, payloads, numel, codec, out_codec, out):
        for p in payloads:
            _check_payload(p, codec, numel)
        _check_payload(out, out_codec, numel)
        rows = np.stack([_np(p) for p in payloads]) if payloads else np.empty((0, 0), np.uint8)
        ok = self._run(
            self._decode.sum_packed, rows, numel, *_codec_args(codec), *_codec_args(out_codec),
            _chunk(codec, out_codec), out.numpy(),
        )  # fmt: skip
        if not ok:
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def decode_into(
        self, out, payload, codec, offset, divisor, lo, layout, scales, accumulate=False
    ):
        _check_out(out, torch.device("cpu"))
        _check_range(lo, out.numel(), layout, scales)
        _check_payload(payload, codec, out.numel())
        ok = self._run(
            self._decode.decode_packed, _np(payload), out.numel(), *_codec_args(codec), offset,
            np.float32(divisor), np.float32(overflow_limit(offset)), lo,
            _np(layout.bucket_starts), _np(scales.to(torch.float32)),
            _chunk(codec), accumulate, out.numpy(),
        )  # fmt: skip
        if not ok:
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    # --- the level quantizers (terngrad.quantize.levels): those of level_fit_cpu.py, levels_cpu.py

    def level_fit(self, q, flat, layout):
        method = _level_method(q)
        if method is None:
            return self._reference.level_fit(q, flat, layout)
        from terngrad.kernels import level_fit_cpu

        sweeps = q.sweeps if isinstance(q, ORQ) else PB_SWEEPS
        out = np.empty((layout.n_buckets, q._scales_per_bucket(q.levels)), np.float32)
        x = _np(flat)
        finite = self._run(
            level_fit_cpu.fit, x, x.view(np.uint32), _np(layout.bucket_starts), method, q.levels,
            sweeps, out,
        )  # fmt: skip
        return torch.from_numpy(out) if finite else None

    def level_pack(self, q, flat, layout, levels, draws):
        if _level_method(q) is None:
            return self._reference.level_pack(q, flat, layout, levels, draws)
        from terngrad.kernels import levels_cpu

        mids = (levels[:, 1:] + levels[:, :-1]) / 2  # the reference's midpoints, in float32
        empty = np.empty(0, np.float32)
        if isinstance(draws, Streams):
            keys, uniform = draws.key_array(), empty
        else:
            keys = np.zeros(len(layout.segments), np.uint64)
            uniform = empty if draws is None else _np(draws.reshape(-1))
        payload = torch.empty(q.codec.nbytes(layout.numel), dtype=torch.uint8)
        self._run(
            levels_cpu.round_pack, _np(flat), _np(layout.bucket_starts), _np(levels), _np(mids),
            q.stochastic, _np(layout.segment_starts), keys, uniform, *_codec_args(q.codec),
            _chunk(q.codec), payload.numpy(),
        )  # fmt: skip
        return payload

    def level_decode(self, q, payload, codec, layout, levels, out):
        if _level_method(q) is None:
            self._reference.level_decode(q, payload, codec, layout, levels, out)
            return
        from terngrad.kernels import levels_cpu

        _check_payload(payload, codec, layout.numel)
        _check_out(out, torch.device("cpu"))
        ok = self._run(
            levels_cpu.decode_levels, _np(payload), layout.numel, *_codec_args(codec),
            _np(layout.bucket_starts), _np(levels), _chunk(codec), out.numpy(),
        )  # fmt: skip
        if not ok:
            codec.unpack(payload, layout.numel)  # the wire layer says what is wrong
            raise ValueError(f"{codec} payload holds an invalid word or padding (corrupted data)")

    def uniform(self, streams, layout, device="cpu"):
        check_draws(streams, layout)
        out = np.empty(layout.numel, np.float32)
        self._run(
            self._draws.uniform_into, _np(layout.segment_starts), streams.key_array(),
            _TARGET_CHUNK, out,
        )  # fmt: skip
        return torch.from_numpy(out)
