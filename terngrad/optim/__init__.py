"""AdamW for the terngrad hook to exchange the *momentum* of, compressed, instead of the gradient:
1-bit Adam's recipe (Tang et al., ICML 2021) with TernGrad in place of the sign, in two forms.

Why not plain AdamW over a compressed gradient: Adam divides by ``sqrt(v)``, ``v`` the running
mean of ``g^2``; a quantized gradient ``g + n`` (unbiased noise ``n``) makes it the mean of
``g^2 + n^2`` — the noise inflates the variance, and every step shrinks, most where the noise is
largest (Tang et al., Sec. 3: error feedback cannot undo that, as ``v`` is not linear in ``g``).
TernGrad's noise on an element is ``s |g| - g^2`` (``s`` the bucket's scale), so an element
whose gradient is small beside its bucket's largest sees ``v`` inflated by ``s / |g|``.
Measured here: TernGrad with AdamW ends +5.1% in loss on the GPT (docs/results/transformer.md).

Both forms step alike once the momentum is exchanged. With a denominator ``d`` that is the same
on every rank and fixed within the step, ``u = m / d`` (the *preconditioned* momentum) is linear
in the gradient: each rank computes its own ``u_i = (beta1 m + (1 - beta1) g_i) / d``, and the
hook averages those, compressed with error feedback (:mod:`terngrad.comm.rank.momentum`):
``u <- mean_i C(u_i + e_i)`` — the same ``u`` on every rank, which the optimizer receives as
``p.grad``; it keeps ``m = u d`` and steps ``p <- p (1 - lr wd) - lr u / (1 - beta1^t)``.

Why ``u`` and not ``m`` (1-bit Adam sends ``m``): TernGrad's noise on an element is about
``sqrt(s |x|)`` for a scale ``s`` (the bucket's largest ``|x|``), and Adam divides the momentum by
``d``, which is tiny where the variance is tiny: noise on ``m`` becomes steps of hundreds of
learning rates there (measured: a 5-step warm-up then diverged at once). On ``u`` the scale is
that of Adam's own steps, and the noise stays of their size.

The two forms differ in where ``d`` comes from:

* :class:`FrozenVarianceAdamW` (1-bit Adam): AdamW over whatever the hook exchanges for
  ``warmup_steps``, then ``v`` frozen. Measured on the GPT (1,000 steps, 3 seeds): +42% in loss,
  its frozen ``v`` about ten times AdamW's own — early gradients, and the warm-up's compression
  noise, frozen in.
* :class:`LocalVarianceAdamW`: each rank keeps ``v_i`` and ``m_i``, the running means of its
  *own* gradient's squares and of the gradient itself, which are exact and cost no bytes (the
  hook keeps them, as it sees each rank's gradient before it turns it into a momentum); every
  so often the ranks average them (one all-reduce) and ``d`` is made anew. No compression noise
  enters ``v``, and ``v`` follows training instead of freezing.

  ``v_i`` alone would not do: it is the second moment of one rank's batch, ``mu^2 + N sigma^2``
  for a gradient of mean ``mu`` whose global batch has noise variance ``sigma^2``, where AdamW
  divides by ``mu^2 + sigma^2``: in the noise-dominated elements its steps would be ``sqrt(N)``
  times shorter (measured on gpt-small, 4 ranks, no compression: +3.2% in loss at step 200).
  The mean of the ranks' momenta ``M`` estimates ``mu`` with ``1 / N`` of a rank's noise (and
  ``(1 - beta1) / (1 + beta1)`` of that again), so the global batch's second moment is
  estimated by ``v = mean(v_i) / N + (1 - 1 / N) M^2`` (bias-corrected each): ``mu^2 + sigma^2``
  up to terms of ``sigma^2 / (19 N)``. Measured the same way: -0.8% against AdamW at step 200.

Bound to a terngrad hook (``terngrad.ddp.register(ddp, optimizer=opt, ...)``), the optimizer
takes ``p.grad`` as the exchanged momentum; unbound (one process, or PyTorch's own all-reduce),
it computes the momentum and the variance from the gradient itself. Its ``state_dict`` holds
everything the ranks share (the step, the momentum, the variance or denominator); each rank's
own (error-feedback residuals, the local variance, the generator) is in the hook's state, so a
resumed run is exact.
"""

from terngrad.optim.frozen_variance import FrozenVarianceAdamW
from terngrad.optim.local_variance import LocalVarianceAdamW

__all__ = ["FrozenVarianceAdamW", "LocalVarianceAdamW"]
