"""A method as a spec (the rule that names it: :mod:`terngrad.comm.spec.naming`; the table, the
older names and the lookups: :mod:`terngrad.comm.spec.methods`, whose docstring to read first).

:class:`Method` is PyTorch's ``baseline`` or terngrad's ``exchange`` options, with an optimizer
``recipe`` (:class:`FrozenVariance`, :class:`LocalVariance`) and a full-precision ``warmup``,
checked and put in its one canonical form where it is made; :attr:`Method.name` writes its one
name, :attr:`Method.label` says it in words, :meth:`Method.require` is what a consumer honours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from terngrad import quantize
from terngrad.comm.spec.local import LocalSteps
from terngrad.comm.spec.options import Options

#: PyTorch's own averaging, by the name a method calls it (:mod:`terngrad.train.baselines`
#: runs them)
BASELINES: Mapping[str, str] = {
    "fp32": "DDP fp32 all-reduce",
    "fp16": "PyTorch fp16_compress_hook",
    "powersgd": "PyTorch powerSGD_hook (one bucket)",
}
#: the rank of PowerSGD's low-rank factors where a method names none (``powersgd``;
#: ``powersgd-r8``: rank 8)
POWERSGD_RANK = 2
#: the exchange's settings that are the run's, not a method's, and their values in a method
RUN_DEFAULTS: Mapping[str, Any] = {
    "seed": 0, "timeout": None, "kernels": "auto", "full_precision_steps": 0
}  # fmt: skip
RUN_SETTINGS = tuple(RUN_DEFAULTS)


@dataclass(frozen=True)
class FrozenVariance:
    """AdamW's variance frozen after the ``share`` of the run's steps, its preconditioned
    momentum exchanged from then on (:class:`terngrad.optim.FrozenVarianceAdamW`, 1-bit Adam's
    scheme)."""

    share: float
    optimizer: ClassVar[str] = "frozen-adamw"

    @property
    def token(self) -> str:
        return f"frozen{_number(self.share)}"

    @property
    def words(self) -> str:
        return (
            f"AdamW's variance frozen after {_percent(self.share)} of the steps, its "
            "preconditioned momentum exchanged"
        )


@dataclass(frozen=True)
class LocalVariance:
    """AdamW's momentum exchanged, its variance each rank's own, averaged over the ranks every
    ``every`` steps (:class:`terngrad.optim.LocalVarianceAdamW`)."""

    every: int
    optimizer: ClassVar[str] = "local-adamw"

    @property
    def token(self) -> str:
        return f"localvar{self.every}"

    @property
    def words(self) -> str:
        return (
            "AdamW's momentum exchanged, its variance each rank's own, averaged every "
            f"{self.every} steps"
        )


Recipe = FrozenVariance | LocalVariance


@dataclass(frozen=True)
class Method:
    """One way to average gradients: a PyTorch ``baseline`` (a key of :data:`BASELINES`) or
    terngrad's hook with ``exchange`` options; with the hook, an optimizer ``recipe`` and a
    full-precision ``warmup`` (a share of the steps, in [0, 1)), or ``local`` steps (DiLoCo:
    :class:`~terngrad.comm.spec.local.LocalSteps`, ``H`` of at least 2 or ``auto``, and the
    outer step). Its :attr:`name` is written by the module's rule; :attr:`label` says it in
    words."""

    baseline: str | None = None
    exchange: Options | None = field(default=None, hash=False)
    recipe: Recipe | None = None
    warmup: float = 0.0
    #: local steps (DiLoCo); ``None``: the exchange every step
    local: LocalSteps | None = None
    #: PowerSGD's rank (``matrix_approximation_rank``): the ``powersgd`` baseline's only setting
    powersgd_rank: int = POWERSGD_RANK

    def __post_init__(self) -> None:
        if (self.baseline is None) == (self.exchange is None):
            raise ValueError("a method is either a PyTorch baseline or terngrad's exchange")
        if self.baseline is not None:
            if self.baseline not in BASELINES:
                raise ValueError(
                    f"unknown baseline {self.baseline!r}; choose one of: {', '.join(BASELINES)}"
                )
            if self.recipe is not None or self.warmup or self.local is not None:
                raise ValueError(
                    f"{self.baseline} is PyTorch's own: it takes no recipe, warm-up or local steps"
                )
        if (
            isinstance(self.powersgd_rank, bool)
            or not isinstance(self.powersgd_rank, int)
            or self.powersgd_rank < 1
        ):
            raise ValueError(f"powersgd_rank must be an integer >= 1, got {self.powersgd_rank!r}")
        if self.powersgd_rank != POWERSGD_RANK and self.baseline != "powersgd":
            other = self.baseline or "terngrad's hook"
            raise ValueError(f"powersgd_rank is PowerSGD's rank; {other} has none")
        if self.baseline is not None:
            return
        x = self.exchange
        run_level = x.replace(**{name: RUN_DEFAULTS[name] for name in RUN_SETTINGS})
        if run_level != x:
            raise ValueError(
                "a method's exchange leaves the run's settings at their defaults (seed, timeout, "
                "kernels; full_precision_steps is its warm-up share): "
                + "; ".join(x.diff(run_level))
            )
        if not (isinstance(self.warmup, int | float) and 0 <= self.warmup < 1):
            raise ValueError(f"warmup is a share of the steps in [0, 1), got {self.warmup!r}")
        if self.local is not None and not isinstance(self.local, LocalSteps):
            raise ValueError(f"local must be a LocalSteps, got {type(self.local).__name__}")
        if self.local is not None and self.local.every == 1:
            raise ValueError(
                "local steps of H = 1 are the exchange every step: give H of at least 2 or "
                "'auto', or no local steps"
            )
        if self.local is not None and (
            self.recipe is not None or self.warmup or x.fuse_buckets or x.policy != "quantize"
        ):
            raise ValueError(
                "local steps (DiLoCo) average the pseudo-gradients once every H steps with the "
                "run's own optimizer: no optimizer recipe, warm-up, fused buckets or auto policy"
            )
        named = _named_options(x)
        if named != dict(x.quantizer_options):  # one spec, one form: defaults left out
            object.__setattr__(self, "exchange", x.replace(quantizer_options=named))

    # --------------------------------------------------------------------------- name, words

    @property
    def name(self) -> str:
        """The method's one name (the rule: :mod:`terngrad.comm.spec.naming`)."""
        from terngrad.comm.spec import naming  # (naming reads and writes a Method)

        if self.baseline == "powersgd" and self.powersgd_rank != POWERSGD_RANK:
            return f"powersgd-r{self.powersgd_rank}"
        if self.baseline is not None:
            return self.baseline
        return "-".join(naming.render(self))

    @property
    def label(self) -> str:
        """The method in words, for tables and plots."""
        from terngrad.comm.spec import naming

        if self.baseline == "powersgd":
            return f"PyTorch powerSGD_hook (rank {self.powersgd_rank}, one bucket)"
        if self.baseline is not None:
            return BASELINES[self.baseline]
        return naming.words(self)

    def __str__(self) -> str:
        return self.name

    def settings(self) -> dict[str, Any]:
        """Every setting of the method, by name (JSON-serialisable; the name alone is the
        spec: :func:`~terngrad.comm.spec.naming.parse` reads it back)."""
        x = self.exchange
        return {
            "baseline": self.baseline,
            "powersgd_rank": self.powersgd_rank if self.baseline == "powersgd" else None,
            "exchange": None if x is None else {
                k: v for k, v in x.to_dict().items()
                if k not in ("seed", "timeout", "kernels", "full_precision_steps")
            },
            "recipe": None if self.recipe is None else self.recipe.token,
            "warmup": self.warmup,
            "local": None if self.local is None else self.local.to_dict(),
        }  # fmt: skip

    @property
    def local_steps(self) -> int | str:
        """``H`` (an integer, or ``"auto"``); 1 without local steps."""
        return 1 if self.local is None else self.local.every

    @property
    def outer_overlap(self) -> bool:
        """True where the outer exchange of local steps runs behind the next inner steps."""
        return self.local is not None and self.local.overlap

    # --------------------------------------------------------------------------- use

    @property
    def one_bucket(self) -> bool:
        """True where DDP must run in a single bucket (PowerSGD: it hangs on gloo with more)."""
        return self.baseline == "powersgd"

    def quantizer(self) -> quantize.Quantizer | None:
        """What the method does to one tensor as a quantizer: the hook's quantizer, fp32/fp16
        for PyTorch's plain and fp16 all-reduce, ``None`` for PowerSGD (a low-rank method)."""
        if self.exchange is not None:
            return self.exchange.make_quantizer()
        return quantize.get(self.baseline) if self.baseline in ("fp32", "fp16") else None

    def options(self, **protocol: Any) -> Options:
        """The hook's options with an experiment's ``protocol`` put over them (exchange fields
        by name; ``quantizer_options`` merged into the method's own)."""
        if self.exchange is None:
            raise ValueError(f"{self.name} is PyTorch's own averaging, not terngrad's hook")
        q_options = {**self.exchange.quantizer_options, **protocol.pop("quantizer_options", {})}
        return self.exchange.replace(**protocol, quantizer_options=q_options)

    def under(self, **protocol: Any) -> Method:
        """This method with an experiment's ``protocol`` put over its exchange (:meth:`options`:
        the same settings for every method it runs, which its report states); a PyTorch
        baseline is itself."""
        if self.exchange is None or not protocol:
            return self
        return dataclasses.replace(self, exchange=self.options(**protocol))

    def require(
        self,
        consumer: str,
        *,
        baselines: Iterable[str] = tuple(BASELINES),
        recipe: bool = False,
        warmup: bool = False,
        local: bool = False,
        exchange: Callable[[Options], str | None] | None = None,
    ) -> Method:
        """This method, if ``consumer`` can honour all of it: the PyTorch ``baselines`` it runs,
        whether it runs an optimizer ``recipe``, a full-precision ``warmup`` and ``local``
        steps (DiLoCo), and
        ``exchange``: what it cannot do with given options, in words (``None``: it can).
        ``ValueError`` with one line naming the part it cannot honour otherwise."""
        why = None
        if self.baseline is not None and self.baseline not in baselines:
            why = f"it does not run PyTorch's {self.baseline}"
        elif self.recipe is not None and not recipe:
            why = f"it does not run the optimizer recipe ({self.recipe.words})"
        elif self.local_steps != 1 and not local:
            why = f"it does not run local steps (DiLoCo, an outer step every {self.local_steps})"
        elif self.warmup and not warmup:
            why = f"it does not run a full-precision warm-up ({_percent(self.warmup)} of the steps)"
        elif self.exchange is not None and exchange is not None:
            why = exchange(self.exchange)
        if why:
            raise ValueError(f"{consumer} cannot run method {self.name}: {why}")
        return self


# --------------------------------------------------------------------------- canonical form

#: the quantizer options a name can hold
_NAMED_OPTIONS = ("levels", "bucket_size", "clip", "packing")


def _number(value: float) -> str:
    return f"{value:g}"


def _percent(share: float) -> str:
    return f"{100 * share:g}%"


def _named_options(x: Options) -> dict[str, Any]:
    """The quantizer options of ``x`` that differ from the quantizer's defaults, and its
    ``levels`` where it has levels: the options a name writes. ``ValueError`` for one that no
    name can hold."""
    defaults = quantize.get(x.quantizer).options
    named = {k: v for k, v in x.quantizer_options.items() if k not in defaults or v != defaults[k]}
    if "levels" in defaults:
        named.setdefault("levels", defaults["levels"])
    unnamed = sorted(set(named) - set(_NAMED_OPTIONS))
    if named.get("bucket_size", 1) is None:
        unnamed.append("bucket_size=None")
    if unnamed:
        raise ValueError(f"no method name holds the quantizer option {', '.join(unnamed)}")
    return named
