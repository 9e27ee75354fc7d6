"""Every quantizer on a model's real gradients: which one, for this model, and why.

:func:`study` trains a model in one process, keeps every parameter's gradient at chosen steps,
and measures each quantizer on each of them (:func:`measure`), the way the TernGrad paper
(gradient histograms, clipping at c σ, Sec. 3.3 and Fig. 2) and the optimal-quantization
paper (levels from the gradient's own distribution minimise the variance) argue. Per parameter
tensor ``g`` (quantized on its own, as the DDP hook does) and quantizer ``Q``:

* normalised variance ``E‖Q(g) − g‖² / ‖g‖²``, exact over the random draws
  (:meth:`~terngrad.quantize.Quantizer.variance`; it includes the squared bias of biased
  methods), and the same averaged over the sampled draws as a check;
* bias ``‖E Q(g) − g‖ / ‖g‖``, estimated from R draws: ``‖mean − g‖² − tr Σ̂ / R`` (the
  sample mean's own spread removed), with its noise floor ``sqrt(tr Σ̂ / R) / ‖g‖``;
* the angle between ``Q(g)`` and ``g``, the share of zeros, bits per element on the wire
  (the encoded frame's exact bytes), and the encode time (median over the draws).

Totals over a model's parameters add the squared errors and norms (layer-wise quantization).
:mod:`terngrad.bench.study_report` writes the report.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from terngrad import quantize
from terngrad.comm.spec import methods as table
from terngrad.comm.spec.options import Options

#: the methods compared by default (names of :data:`terngrad.comm.spec.methods.METHODS`)
DEFAULT_METHODS = (
    "fp16", "terngrad", "terngrad-noclip", "terngrad-b512",
    *(f"{q}-{s}" for q in ("qsgd", "linear", "orq") for s in (3, 5, 9)),
    "bingrad-b", "bingrad-pb", "signsgd",
)  # fmt: skip


@dataclass(frozen=True)
class Measure:
    """One quantizer on one gradient tensor (sums over the draws kept per draw, so totals over
    tensors can be formed draw by draw)."""

    numel: int
    sq_norm: float  # ‖g‖²
    sq_error: float  # exact E‖Q(g) − g‖²
    sampled_sq_error: float  # mean over draws of ‖Q(g) − g‖²
    mean_sq_error: float  # ‖mean of draws − g‖²
    spread: float  # tr Σ̂: unbiased sample variance of Q(g), summed over elements
    dots: tuple[float, ...]  # ⟨Q(g), g⟩ per draw
    q_sq_norms: tuple[float, ...]  # ‖Q(g)‖² per draw
    zeros: float  # mean share of elements that are exactly 0 in Q(g)
    nbytes: int
    encode_seconds: float

    @property
    def draws(self) -> int:
        return len(self.dots)

    @property
    def bits_per_element(self) -> float:
        return 8 * self.nbytes / self.numel


@dataclass(frozen=True)
class Total:
    """Measures added over tensors: the model's view of one quantizer."""

    numel: int
    normalized_variance: float
    sampled_normalized_variance: float
    bias: float
    bias_floor: float
    angle_degrees: float
    zeros: float
    bits_per_element: float
    encode_seconds: float


def combine(measures: Sequence[Measure]) -> Total:
    """The total over tensors (each quantized on its own)."""
    sq_norm = sum(m.sq_norm for m in measures) or math.inf
    draws = min(m.draws for m in measures)
    g_norm = math.sqrt(sum(m.sq_norm for m in measures))
    angles = []
    for r in range(draws):
        dot = sum(m.dots[r] for m in measures)
        q_norm = math.sqrt(sum(m.q_sq_norms[r] for m in measures))
        cos = dot / (q_norm * g_norm) if q_norm > 0 and g_norm > 0 else 0.0
        angles.append(math.degrees(math.acos(max(-1.0, min(1.0, cos)))))
    numel = sum(m.numel for m in measures)
    noise = sum(m.spread / m.draws for m in measures)
    bias_sq = sum(m.mean_sq_error for m in measures) - noise
    return Total(
        numel=numel,
        normalized_variance=sum(m.sq_error for m in measures) / sq_norm,
        sampled_normalized_variance=sum(m.sampled_sq_error for m in measures) / sq_norm,
        bias=math.sqrt(max(bias_sq, 0.0) / sq_norm),
        bias_floor=math.sqrt(noise / sq_norm),
        angle_degrees=statistics.fmean(angles),
        zeros=sum(m.zeros * m.numel for m in measures) / numel,
        bits_per_element=8 * sum(m.nbytes for m in measures) / numel,
        encode_seconds=sum(m.encode_seconds for m in measures),
    )


def measure(q: quantize.Quantizer, grad: torch.Tensor, draws: int, seed: int = 0) -> Measure:
    """``q`` on ``grad`` over ``draws`` independent draws (1 if ``q`` is deterministic)."""
    g = grad.detach().reshape(-1).to(torch.float32)
    draws = draws if q.stochastic else 1
    generator = torch.Generator().manual_seed(seed)
    total = torch.zeros_like(g, dtype=torch.float64)
    total_sq = torch.zeros_like(g, dtype=torch.float64)
    errors, dots, q_norms, zeros, times = [], [], [], [], []
    nbytes = 0
    for _ in range(draws):
        start = time.perf_counter()
        enc = q.encode(g, generator=generator)
        times.append(time.perf_counter() - start)
        nbytes = enc.nbytes
        out = q.decode(enc).reshape(-1).to(torch.float32)
        out64 = out.double()
        total += out64
        total_sq += out64.square()
        errors.append(float((out - g).double().square().sum()))
        dots.append(float((out64 * g.double()).sum()))
        q_norms.append(float(out64.square().sum()))
        zeros.append(float((out == 0).double().mean()) if g.numel() else 0.0)
    mean = total / draws
    spread = (
        float(((total_sq - draws * mean.square()) / (draws - 1)).clamp_min(0).sum())
        if draws > 1
        else 0.0
    )
    return Measure(
        numel=g.numel(),
        sq_norm=float(g.double().square().sum()),
        sq_error=q.variance(g),
        sampled_sq_error=statistics.fmean(errors),
        mean_sq_error=float((mean - g.double()).square().sum()),
        spread=spread,
        dots=tuple(dots),
        q_sq_norms=tuple(q_norms),
        zeros=statistics.fmean(zeros),
        nbytes=nbytes,
        encode_seconds=statistics.median(times),
    )


@dataclass
class Capture:
    """The gradients of every parameter at one step (after ``step`` updates), and the loss."""

    step: int
    loss: float
    grads: dict[str, torch.Tensor]


@dataclass
class Study:
    """What :func:`study` found: the captures and, per (step, method, parameter), a measure."""

    title: str
    methods: dict[str, tuple[str, dict]]
    draws: int
    captures: list[Capture]
    measures: dict[tuple[int, str, str], Measure] = field(default_factory=dict)

    @property
    def layers(self) -> list[str]:
        return list(self.captures[0].grads)

    @property
    def kinds(self) -> dict[str, list[str]]:
        """The parameter tensors grouped by kind (:func:`tensor_kinds`), in the model's order."""
        return tensor_kinds({n: tuple(g.shape) for n, g in self.captures[0].grads.items()})

    def total(self, step: int, method: str, names: Sequence[str] | None = None) -> Total:
        """``method``'s total at ``step`` over the tensors ``names`` (default: all)."""
        chosen = self.layers if names is None else names
        return combine([self.measures[(step, method, name)] for name in chosen])

    def sq_norm(self, step: int, names: Sequence[str] | None = None) -> float:
        """``Σ ‖g‖²`` at ``step`` over the tensors ``names`` (default: all), as measured."""
        first = next(iter(self.methods))
        chosen = self.layers if names is None else names
        return sum(self.measures[(step, first, name)].sq_norm for name in chosen)


def tensor_kinds(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, list[str]]:
    """Parameter tensors by kind: the same tensor of every repeated block together.

    Where the modules ``P.0``, ``P.1``, ... of a name's first index all hold the same tensors
    with the same shapes (the blocks of a transformer), a tensor's kind is its name with that
    index written ``*`` (``blocks.2.attn.qkv.weight`` -> ``blocks.*.attn.qkv.weight``);
    otherwise (the differing layers of an ``nn.Sequential``) each tensor is its own kind."""

    def split(name: str) -> tuple[str, str, str] | None:
        parts = name.split(".")
        i = next((i for i, part in enumerate(parts) if part.isdigit()), None)
        if i is None:
            return None
        return ".".join(parts[:i]), parts[i], ".".join(parts[i + 1 :])

    contents: dict[str, dict[str, set]] = {}  # prefix -> index -> {(rest, shape)}
    for name, shape in shapes.items():
        if (where := split(name)) is not None:
            prefix, index, rest = where
            contents.setdefault(prefix, {}).setdefault(index, set()).add((rest, tuple(shape)))
    repeated = {
        prefix for prefix, modules in contents.items()
        if len(modules) > 1 and all(m == next(iter(modules.values())) for m in modules.values())
    }  # fmt: skip
    kinds: dict[str, list[str]] = {}
    for name in shapes:
        where = split(name)
        kind = name
        if where is not None and where[0] in repeated:
            kind = ".".join(p for p in (where[0], "*", where[2]) if p)
        kinds.setdefault(kind, []).append(name)
    return kinds


def _quantizer_alone(x: Options) -> str | None:
    """What the study cannot measure of exchange options ``x``: anything but the quantizer."""
    alone = Options(x.quantizer, quantizer_options=x.quantizer_options)
    found = alone.diff(x)
    return f"it measures the quantizer alone, not {', '.join(found)}" if found else None


def check_methods(names: Iterable[str]) -> dict[str, tuple[str, dict]]:
    """What each method of ``names`` does to one tensor: name -> (quantizer, its options);
    ``ValueError`` with one line for an unknown method, one that is not a quantizer (PowerSGD)
    or one with more than a quantizer (a topology, exchange settings, a recipe, a warm-up)."""
    catalogue = {}
    for m in table.select(names):
        m.require("the study", baselines=("fp32", "fp16"), exchange=_quantizer_alone)
        q = m.quantizer()
        catalogue[m.name] = (q.name, q.options)
    return catalogue


def study(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    steps: int,
    capture_at: Sequence[int] | None = None,
    methods: Iterable[str] = DEFAULT_METHODS,
    draws: int = 16,
    optimizer: torch.optim.Optimizer | None = None,
    title: str = "model",
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Study:
    """Train ``model`` for ``steps`` steps on ``batches`` (pairs of inputs and targets) with
    ``optimizer`` (default: SGD, lr 0.01, momentum 0.9), keep the gradients at the steps in
    ``capture_at`` (default: five evenly spaced from 0 to ``steps``), and measure every method
    of ``methods`` (names of :data:`terngrad.comm.spec.methods.METHODS`) on them with ``draws``
    draws each."""
    catalogue = check_methods(methods)
    if not (isinstance(steps, int) and steps >= 0):
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    if not (isinstance(draws, int) and draws >= 2):
        raise ValueError(f"draws must be an integer >= 2 (the bias needs a spread), got {draws!r}")
    if capture_at is None:
        capture_at = sorted({round(steps * k / 4) for k in range(5)})
    wanted = sorted(set(capture_at))
    if not wanted or wanted[0] < 0 or wanted[-1] > steps:
        raise ValueError(f"capture steps must lie in [0, {steps}], got {list(capture_at)}")
    say = progress or (lambda _: None)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no parameters that require gradients")
    optimizer = optimizer or torch.optim.SGD([p for _, p in params], lr=0.01, momentum=0.9)
    captures = []
    batch_iter = iter(batches)
    model.train()
    for step in range(wanted[-1] + 1):
        try:
            x, y = next(batch_iter)
        except StopIteration:
            raise ValueError(f"the batches ran out at step {step} of {wanted[-1]}") from None
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if step in wanted:
            grads = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
            captures.append(Capture(step, loss.item(), grads))
            say(f"step {step}: loss {loss.item():.4f}, gradients kept")
        if step < wanted[-1]:
            optimizer.step()
    result = Study(title, catalogue, draws, captures)
    for capture in captures:
        for label, (name, options) in catalogue.items():
            q = quantize.get(name, **options)
            say(f"step {capture.step}: measuring {label}")
            for i, (layer, grad) in enumerate(capture.grads.items()):
                result.measures[(capture.step, label, layer)] = measure(
                    q, grad, draws, seed=seed * 1_000_003 + capture.step * 1009 + i
                )
    return result


def clip_effect(grad: torch.Tensor, c: float = 2.5) -> tuple[float, float, float]:
    """TernGrad's clipping ``g -> sign(g) min(|g|, c σ)`` on ``grad``: (σ, share of elements
    clipped, angle in degrees between the clipped and the original gradient; 90° if clipping
    wipes a non-zero gradient out, as it does when σ = 0)."""
    g = grad.detach().reshape(-1).double()
    sigma = float(g.std(unbiased=False)) if g.numel() > 1 else 0.0
    bound = c * sigma
    clipped = g.clamp(-bound, bound)
    share = float((g.abs() > bound).double().mean()) if g.numel() else 0.0
    norms = float(clipped.norm()) * float(g.norm())
    if norms == 0.0:
        return sigma, share, 90.0 if float(g.norm()) > 0 else 0.0
    cos = float(clipped @ g) / norms
    return sigma, share, math.degrees(math.acos(max(-1.0, min(1.0, cos))))


@dataclass
class Setup:
    """What :func:`study` trains: the model, its optimizer, the batches and the report's title."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    title: str


def setup(
    model: str | None = None, dataset: str | None = None, data_dir: str | None = None,
    from_checkpoint: str | None = None, batch_size: int = 64, steps: int = 200,
    lr: float | None = None, seed: int = 0,
) -> Setup:  # fmt: skip
    """A model to study, fresh (``model``, default LeNet, on ``dataset``, default its own; SGD
    with momentum 0.9 at ``lr``, default 0.01) or as a ``terngrad train`` checkpoint left it
    (``from_checkpoint``: its model, data set and its own optimizer with its saved state; ``lr``
    replaces only the rate); ``steps + 1`` batches of ``batch_size`` from ``seed``."""
    from terngrad.train import data
    from terngrad.train.config import TrainConfig
    from terngrad.train.setup import load_data, restore

    if from_checkpoint is not None:
        run = restore(from_checkpoint, data_dir=data_dir, dataset=dataset, seed=seed)
        if model and model != run.config.model:
            raise ValueError(
                f"--model {model} does not match the checkpoint's model {run.config.model} "
                "(leave --model out with --from-checkpoint)"
            )
        net, optimizer, ds, cfg = run.model, run.optimizer, run.data, run.config
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        title = f"{cfg.model} on {cfg.dataset} (from a checkpoint)"
    else:
        cfg = TrainConfig(out="-", model=model or "lenet", dataset=dataset, data_dir=data_dir)
        ds = load_data(cfg, seed=seed)
        torch.manual_seed(seed)
        from terngrad.train import models

        net = models.build(cfg.model, ds.input_shape, ds.num_classes)
        optimizer = torch.optim.SGD(net.parameters(), lr=lr or 0.01, momentum=0.9)
        title = f"{cfg.model} on {cfg.dataset}"
    sampler = data.ShardSampler(ds.train_size, 0, 1, batch_size, seed)
    gen = torch.Generator().manual_seed(seed)
    batches = (ds.train_batch(sampler.batch(s), gen) for s in range(steps + 1))
    return Setup(net, optimizer, batches, title)
