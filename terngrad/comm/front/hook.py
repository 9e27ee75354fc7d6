"""The DDP communication hook: a ``(state, hook)`` pair in PyTorch's convention.

>>> state = terngrad.ddp.State(quantizer="terngrad", topology="sharded")  # before or after
>>> ddp.register_comm_hook(state, terngrad.ddp.hook)                      # init_process_group
>>> ... train ...; state.stats.bytes_sent_per_step

or in one line, ``state = terngrad.ddp.register(ddp, quantizer="terngrad")``. A :class:`State`
only checks its options when it is made; its collectives (a process group of its own, the
check that every rank configured it alike, the auto policy's measurements) happen at its first
use, so frameworks that take the pair up front (Lightning's ``DDPStrategy(ddp_comm_state=...,
ddp_comm_hook=...)``) can make it before the process group exists.

For each DDP bucket the hook

1. averages the quantized parameters through :mod:`terngrad.comm.exchanges.exchange`, one scale
   group per parameter, adding the worker-side error-feedback residual first when
   ``error_feedback=True``, and writes the mean into the bucket buffer in place (no second
   buffer of the bucket's size: PyTorch's hooks decompress in place for the same reason);
2. keeps the full-precision parameters (the last layer and tensors under ``min_numel``
   elements, by default) for the step's end: with the last bucket, one all-reduce of all of
   them in the model's parameter order (sums independent of DDP's bucket layout, so resumed
   runs are bitwise identical), on a second process group while that bucket's quantized
   exchange runs; then every bucket's future completes.

The exchanges run on one worker thread per process, bucket after bucket in the order DDP hands
them over, which is the same on every rank, so the collectives line up across ranks however many
buckets there are; the hook returns a future at once and DDP's backward pass goes on meanwhile.
"""

from __future__ import annotations

import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.errors import explain
from terngrad.comm.front.ddp_model import (
    DDP,
    PYTHON_REDUCER,
    check_registrable,
    registered_model,
    tied_warning,
    warn_if_unused,
)
from terngrad.comm.rank import saved_state
from terngrad.comm.rank.momentum import (
    LocalVariance,
    MomentumSource,
    VarianceSource,
    check_local_variance_entry,
    check_source,
    to_local_momentum,
)
from terngrad.comm.rank.plans import last_layer_names, tied_last_layer
from terngrad.comm.rank.policy import Decision, Estimate
from terngrad.comm.rank.reducer import Deferred, Reducer, check_own
from terngrad.comm.rank.stats import Stats, Timing
from terngrad.comm.spec.methods import hook_options
from terngrad.comm.spec.options import Options
from terngrad.quantize import Quantizer


class State:
    """The terngrad hook's state for one DDP model on one rank.

    ``quantizer`` (a name from ``quantize.names()``, or a quantizer) and ``topology``, then any
    field of :class:`~terngrad.comm.spec.options.Options` by name (``error_feedback``,
    ``quantize_last``, ``min_numel``, ``kernels``, ``policy``, ``aggregate``, ``seed``,
    ``timeout``), every other keyword a quantizer option (``clip=2.0``, ``bucket_size=512``);
    or ``options``, a ready :class:`Options`. ``model``: the model (or its DDP wrapper) whose
    parameters the hook exchanges: by default the DDP model the state is registered on, found
    at its first use. ``optimizer``: a :class:`terngrad.optim.FrozenVarianceAdamW` or
    :class:`~terngrad.optim.LocalVarianceAdamW`, whose momentum is then exchanged instead of
    the gradient (after the former's warm-up; the latter's variance measured on each rank and
    averaged by this hook: :mod:`terngrad.comm.rank.momentum`); give ``error_feedback=True`` too, as
    1-bit Adam does.
    ``estimate``: given link and codec speeds for ``policy="auto"``; ``group``: the process
    group (default: a new one of all ranks).

    Read :attr:`stats`, :attr:`timing`, :attr:`last_step_skipped` (skip ``optimizer.step()``
    when True); save and restore with :meth:`state_dict` / :meth:`load_state_dict`.
    """

    def __init__(
        self,
        quantizer: str | Quantizer = "terngrad",
        topology: str = "sharded",
        *,
        options: Options | None = None,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        estimate: Estimate | None = None,
        group: dist.ProcessGroup | None = None,
        **settings: Any,
    ) -> None:
        if options is not None and (settings or quantizer != "terngrad" or topology != "sharded"):
            raise ValueError("give either options=Options(...) or the settings, not both")
        self.options = options or hook_options(quantizer, topology, **settings)
        self._estimate, self._group = estimate, group
        self._params: list[tuple[str, torch.Tensor]] | None = None
        self._last_layer: set[str] = set()
        self._bound: weakref.ref[nn.Module] | None = None
        self._pending: dict[str, Any] | None = None  # a state_dict loaded before first use
        #: the exchange itself, made at first use (:meth:`build`)
        self.reducer: Reducer | None = None
        self._executor: ThreadPoolExecutor | None = None
        # the step in progress: buckets waiting for the step's end, full-precision tensors
        self._waiting: list[tuple[torch.Tensor, torch.futures.Future]] = []
        self._deferred: Deferred = []
        self._failed: BaseException | None = None
        self._broken: BaseException | None = None  # the first use failed: every later one too
        self._used = [False]
        self._rehearsing = False  # settle_buckets: the hook hands buckets back untouched
        weakref.finalize(self, warn_if_unused, self._used)
        #: the optimizer whose momentum is exchanged after its warm-up (``optimizer=``)
        self.momentum: MomentumSource | None = None
        #: this rank's own variance, for an optimizer that measures it on each rank
        self.variance: LocalVariance | None = None
        self._variance_source: VarianceSource | None = None
        if optimizer is not None:
            self.momentum = check_source(optimizer)
            self.momentum.bind_exchange()
            if isinstance(optimizer, VarianceSource):
                self._variance_source = optimizer
        if model is not None:
            self.bind(model)

    # --- binding and first use

    def bind(self, model: nn.Module) -> State:
        """Name the parameters this state exchanges: those of ``model`` (or of the module a
        DDP wrapper holds), with its last layer. No collective; may precede the process group."""
        module = model.module if isinstance(model, DDP) else model
        if self._bound is not None:
            if self._bound() is module:
                return self
            raise RuntimeError(
                "this terngrad State already serves another model: make one State per model"
            )
        self._params = list(module.named_parameters())
        self._last_layer = last_layer_names(module)
        self._bound = weakref.ref(module)
        if self._variance_source is not None:
            names = {id(p): name for name, p in self._params}
            self.variance = LocalVariance(self._variance_source, names)
        tied = tied_last_layer(module)
        if tied and not self.options.quantize_last:
            warnings.warn(tied_warning(tied, dict(self._params)), stacklevel=2)
        return self

    def build(self) -> Reducer:
        """Make the exchange now (a collective on every rank; :func:`register` calls it, the
        hook at its first bucket otherwise)."""
        self._used[0] = True  # wired in: from here on, a failure is loud, not silent
        if self._broken is not None:  # never build twice: the ranks would fall out of step
            raise self._broken
        if self.reducer is None:
            try:
                if self._params is None:
                    self.bind(registered_model(self))
                assert self._params is not None
                reducer = Reducer(
                    self.options, self._params, self._last_layer,
                    estimate=self._estimate, group=self._group,
                )  # fmt: skip
                if self._pending is not None:
                    reducer.load_state_dict(self._load_variance(self._pending))
            except BaseException as exc:
                self._broken = exc
                raise
            self.reducer, self._pending = reducer, None
            self.options = reducer.options  # the timeout made concrete (the default group's)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terngrad")
        return self.reducer

    def settle_buckets(self, ddp_model: DDP, *inputs: Any) -> None:
        """One forward and backward of ``ddp_model`` on ``inputs`` that exchanges nothing and
        changes nothing — eval mode (no dropout draw, no batch-norm statistics), gradients
        dropped, torch's generator restored — so that DDP rebuilds its buckets in the order the
        gradients become ready *before* the first real step. Without it DDP's first step uses
        its initial buckets and the later steps the rebuilt ones; a run resumed from a
        checkpoint would then frame (and count) its first step differently from the run it
        continues. Call it once, after registering the hook and before training."""
        module = ddp_model.module
        was_training, generator = module.training, torch.get_rng_state()
        self._rehearsing = True
        try:
            module.eval()
            outputs = ddp_model(*inputs)
            leaves = outputs if isinstance(outputs, tuple | list) else (outputs,)
            sum(t.float().sum() for t in leaves if isinstance(t, torch.Tensor)).backward()
        finally:
            self._rehearsing = False
            module.train(was_training)
            torch.set_rng_state(generator)
            for p in module.parameters():
                p.grad = None

    # --- what users read

    @property
    def stats(self) -> Stats:
        """Bytes sent and received, steps and skipped steps of this rank (zeros before use)."""
        return self.reducer.stats if self.reducer else Stats(0, 0, 0, 0, 0, 0)

    @property
    def timing(self) -> Timing:
        """Seconds spent in the exchanges, and how much of it in collectives."""
        return self.reducer.timing if self.reducer else Timing(0.0, 0.0)

    @property
    def last_step_skipped(self) -> bool:
        """Some rank's gradient of the last step was not finite: it was zeroed on every rank;
        skip ``optimizer.step()``."""
        return bool(self.reducer and self.reducer.last_step_skipped)

    @property
    def estimate(self) -> Estimate | None:
        """``policy="auto"``: the link and codec speeds every rank agreed on."""
        return self.reducer.auto.estimate if self.reducer and self.reducer.auto else None

    @property
    def decisions(self) -> dict[tuple[str, ...], Decision]:
        """``policy="auto"``: the choice for each bucket (by its quantizable parameters)."""
        return self.reducer.auto.decisions if self.reducer and self.reducer.auto else {}

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: RNG, error-feedback residuals, counters (save one per rank)."""
        if self.reducer is None:
            if self._pending is not None:
                return self._pending
            raise RuntimeError(
                "this terngrad State has not been used yet: nothing to save before its first "
                "backward pass (or terngrad.ddp.register)"
            )
        state = self.reducer.state_dict()
        if self.variance is not None:
            state["local_variance"] = self.variance.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of the same rank and configuration (before first use:
        at first use)."""
        if self.reducer is None:  # what can be checked now is, the rest at first use
            sizes = None if self._params is None else {n: p.numel() for n, p in self._params}
            saved_state.rank_state(state, Reducer.kind, Reducer.state_format, sizes)
            device = self._params[0][1].device if self._params else torch.device("cpu")
            check_own(state, Reducer.kind, torch.Generator(device=device).get_state())
            self._check_variance(state, sizes)
            self._pending = state
        else:
            self.reducer.load_state_dict(self._load_variance(state))

    def _check_variance(self, state: dict[str, Any], sizes: dict[str, int] | None) -> None:
        check_local_variance_entry(state, self.variance is not None, sizes)

    def _load_variance(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` less the rank's local variance, which goes to :attr:`variance`."""
        if self.reducer is not None:
            self.reducer.check_state(state)  # all of it, before the variance is taken
        sizes = None if self._params is None else {n: p.numel() for n, p in self._params}
        self._check_variance(state, sizes)
        state = dict(state)
        saved = state.pop("local_variance", None)
        if self.variance is not None:
            self.variance.load_state_dict(saved)
        return state

    # --- the DDP path

    def _run_bucket(self, buffer, params, last: bool, future: torch.futures.Future) -> None:
        """The bucket's quantized parameters now, its full-precision ones with the step's last
        bucket; the futures complete when the step is done. Once a bucket fails, the step's
        later buckets fail at once, without collectives (a dead peer would make each wait the
        full timeout), and the next step starts clean."""
        reducer = self.reducer
        assert reducer is not None
        self._waiting.append((buffer, future))
        done: list[tuple[torch.Tensor, torch.futures.Future]] = []
        try:
            if self._failed is not None:
                raise self._failed
            if self.variance is not None:
                self.variance.observe(params, buffer, reducer.link)
            if self.momentum is not None:
                to_local_momentum(self.momentum, params, buffer)
            reducer.reduce_bucket(buffer, params, self._deferred, last)
            if not last:
                return
            done, self._waiting, self._deferred = self._waiting, [], []
            if reducer.step_skipped:
                for buf, _ in done:
                    buf.zero_()
            try:
                reducer.finish_step()  # may warn, and a warning may be an error (-W error)
            finally:
                for buf, fut in done:
                    fut.set_result(buf)
        except BaseException as exc:  # handed to DDP, which raises it in backward()
            self._failed = self._failed or explain(exc, reducer.link.rank, reducer.timeout)
            waiting, self._waiting = self._waiting, []
            for _, fut in waiting + done:
                if not fut.done():
                    fut.set_exception(self._failed)
            if last:  # the step is over: the next one starts clean
                self._failed, self._deferred = None, []
                reducer.abandon_step()


def hook(state, bucket):  # no annotations: DDP checks them, and here they would be strings
    """The communication hook: ``ddp.register_comm_hook(state, terngrad.ddp.hook)``.

    ``state``: a :class:`State`; ``bucket``: DDP's ``GradBucket``. Queues the bucket on the
    state's worker thread and returns a ``Future[Tensor]`` that completes when the step's
    exchange is done. DDP reads the future's value in C++, where an exception stored by
    Python's ``set_exception`` arrives as an object it cannot cast ("Unable to cast ... to
    Tensor"); ``then(wait)`` re-raises it in a callback, which marks the returned future failed
    with the exception's own message."""
    if isinstance(bucket, tuple):  # compiled DDP: one (grad, param) at a time, no buckets
        raise RuntimeError(PYTHON_REDUCER)
    if not isinstance(state, State):
        raise TypeError(
            f"terngrad.ddp.hook takes a terngrad.ddp.State, got {type(state).__name__}: "
            "ddp.register_comm_hook(terngrad.ddp.State(...), terngrad.ddp.hook)"
        )
    future = torch.futures.Future()
    if state._rehearsing:  # settle_buckets: no exchange, nothing counted
        future.set_result(bucket.buffer())
        return future
    state.build()
    assert state._executor is not None
    state._executor.submit(
        state._run_bucket, bucket.buffer(), bucket.parameters(), bucket.is_last(), future
    )
    return future.then(_unwrap)


def _unwrap(future: torch.futures.Future) -> torch.Tensor:
    return future.wait()


def register(
    ddp_model: nn.parallel.DistributedDataParallel,
    quantizer: str | Quantizer = "terngrad",
    topology: str = "sharded",
    **settings: Any,
) -> State:
    """Install the terngrad communication hook on ``ddp_model``; returns its state, built
    (its collectives run now, on every rank).

    ``quantizer``: a name from ``quantize.names()`` (options such as ``clip`` or ``levels``
    pass through) or a quantizer; ``topology``: ``sharded`` (default), ``ps`` or ``allgather``;
    other settings: see :class:`State`. Call on every rank with the same settings; a rank that
    differs makes every rank fail here with a message naming the difference. A model that
    already has a hook is refused before anything is built.
    """
    check_registrable(ddp_model)
    state = State(quantizer, topology, model=ddp_model, **settings)
    state.build()
    ddp_model.register_comm_hook(state, hook)
    return state
