"""Local steps with ternary outer gradients: DiLoCo (Douillard et al. 2023, arXiv 2311.08105)
whose outer gradients go through terngrad's exchanges.

The rooms: :mod:`~terngrad.diloco.outer` (the class and its outer step),
:mod:`~terngrad.diloco.overlap` (the outer exchange in flight), :mod:`~terngrad.diloco.auto`
(``H`` measured and chosen), :mod:`~terngrad.diloco.state` (a saved state and its one check),
:mod:`~terngrad.diloco.model` (the model and inner optimizer it serves),
:mod:`~terngrad.diloco.stats` (what it did: steps and bytes);
the settings and their defaults: :mod:`terngrad.local_steps`.

>>> outer = terngrad.diloco.DiLoCo(model, inner_optimizer, local_steps=16)
>>> for x, y in batches:
...     loss_fn(model(x), y).backward(); inner_optimizer.step(); inner_optimizer.zero_grad()
...     outer.step()                   # every 16th call: the outer step
>>> outer.stats.bytes_sent_per_step  # per inner step, comparable to the DDP hook's

Each rank trains its own replica with its own (inner) optimizer, untouched: AdamW with its
clipping, any schedule. Every ``H = local_steps`` inner steps, the outer step (Algorithm 1 of
the paper):

1. each rank's pseudo-gradient ``Δ_r = θ_anchor − θ_r`` (what its ``H`` steps moved);
2. ``Δ = mean_r Δ_r``, through terngrad's exchange (:class:`~terngrad.comm.Synchronizer`, the
   DDP hook's reducer): TernGrad by default — scalar sharing, the sum of N ranks' codes exact
   and unbiased, the last layer and tensors under ``min_numel`` elements in fp32, as the hook;
   ``quantizer="fp32"`` is the uncompressed DiLoCo baseline. Worker-side error feedback is
   off by default (``error_feedback=True`` turns it on): on AdamW's pseudo-gradients, whose
   values are evenly spread, plain error feedback's residual grows from one outer step to the
   next, and a contracting one (``fit_scale``) delays what it holds back, which the outer
   momentum pays for — measured on the GPT (docs/local-steps.md);
3. the outer optimizer — SGD with Nesterov momentum (``outer_lr``, ``outer_momentum``,
   DiLoCo's 0.7 and 0.9) — steps the anchor along ``Δ``, the same bits on every rank;
4. every replica restarts from the anchor (bitwise equal on every rank), and buffers
   (batch-norm statistics) are replaced by their mean over the ranks.

Two ways past the plain form:

* ``overlap=True``: the outer exchange runs in a background thread while the next ``H`` inner
  steps compute, and its update lands one outer step late (the overlap of Streaming DiLoCo,
  Douillard et al. 2025, arXiv 2501.18512, with a delay of one outer step): at outer step
  ``k`` the averaged ``Δ_{k-1}`` steps the anchor, ``Δ_k`` leaves, and each replica restarts
  from the anchor moved by its own ``Δ_k`` (``θ_r = anchor − Δ_{k,r}``: its last ``H`` steps
  are kept until their average lands, not redone — restarting from the bare anchor makes
  every rank redo them and the outer step count them twice, and diverged in our runs). The
  replicas then differ by their own last window: :meth:`consensus` puts the anchor in for an
  evaluation, :meth:`finish` lands the last update (every replica the anchor again).
* ``local_steps="auto"``: ``H`` chosen once, at the :data:`AUTO_PROBE_STEPS`-th inner step,
  from two measurements agreed over the ranks (their maximum): the seconds of one outer
  exchange on this link (two probe exchanges of zeros when DiLoCo is made, the second timed;
  the exchange's state is put back after them) and the seconds of an inner step (between
  :meth:`step` calls). ``H`` is the smallest allowed value with
  ``exchange / (H · step + exchange) ≤ max_comm_share`` (:func:`choose_local_steps`).

**Across nodes.** Given a DDP model over the ranks of one node (``DDP(model,
process_group=node_group())``: torchrun's ``LOCAL_WORLD_SIZE`` consecutive ranks; or
``mesh.get_group("node")`` of a ``DeviceMesh`` of ``("replicate", "node")``), DDP keeps
averaging the gradients inside the node at every step (the fast link), and the outer exchange
runs across nodes only (:class:`~terngrad.comm.front.nodes.NodeExchange`): each rank of a node
exchanges a share of the parameters with the ranks at its place in the other nodes, then the
node's ranks share what they got. Each parameter crosses the slow link once per node;
``stats.bytes_sent`` counts it, ``stats.node_bytes_sent`` what stayed inside the node.

A rank whose pseudo-gradient is not finite makes every rank skip the outer step (counted in
``stats.skipped_outer_steps``): the anchor stays, every replica restarts from it. The bytes:
TernGrad's sharded exchange moves ~3.6 bits an element at 4 ranks once every ``H`` steps,
against DDP's 48 bits every step: at ``H = 16``, ~200x fewer bytes per inner step.
"""

from terngrad.comm.front.nodes import node_group
from terngrad.comm.spec.local import LocalSteps
from terngrad.diloco.outer import DiLoCo
from terngrad.diloco.stats import DiLoCoStats
from terngrad.local_steps import AUTO_PROBE_STEPS, choose_local_steps

# the public classes' home is this package (their reprs and pickles name it)
DiLoCo.__module__ = __name__
DiLoCoStats.__module__ = __name__

__all__ = [
    "AUTO_PROBE_STEPS",
    "DiLoCo",
    "DiLoCoStats",
    "LocalSteps",
    "choose_local_steps",
    "node_group",
]
