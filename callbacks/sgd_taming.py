"""Tamed SGD as a callback: bounded steps for objectives whose gradients grow faster than linearly.

Paper: "Taming Stochastic Gradient Descent: Almost Sure Convergence and Saddle-Point Avoidance under
(L0, L1)-Smoothness", Vassilis Apidopoulos, Iosif Lytras, Panayotis Mertikopoulos, ICML 2026 (PMLR v306).
No arXiv id and no official code were found; only the abstract was readable.

Method. Under (L0, L1)-smoothness (``||Hess f(x)|| <= L0 + L1 ||grad f(x)||``) gradients may grow
exponentially, and plain SGD with Robbins-Monro steps (``sum lr = inf``, ``sum lr^2 < inf``) can overflow on
its first step. The paper proposes (i) a *taming* of the stochastic gradient that converges almost surely
under a generalised ABC noise condition and (ii) a *dissipative* taming that keeps a linear restoring term and
only needs moment bounds on the noise; both avoid strict saddles with probability one.

What is the paper's word and what is reconstructed. The abstract names the two schemes but not their
formulas. The update forms below are RECONSTRUCTIONS (the standard "tamed Euler" forms of the authors' line of
work), exposed as configurable options rather than claimed as the paper's exact rules:

* ``scheme="tamed"``:        ``x <- x - lr * g / (1 + lr**q * ||g||)``, ``q = lr_power`` (1 by default; 0.5 is
  the variant). The step length is at most ``lr**(1-q)`` and the rule tends to plain SGD as ``lr -> 0``.
* ``scheme="dissipative"``:  ``x <- x - lr * [a x + (g - a x) / (1 + sqrt(lr) * ||x||**(2 r))]`` with
  ``a = restoring_coef`` and ``r = iterate_power``. Taming by the *iterate* norm keeps the linear restoring
  term ``a x``. The default ``r = 2`` comes from a simulation check: with ``r = 1`` the taming is too weak
  against ``e^x`` growth (36/100 runs overflowed on the benchmark of ``experiments/tamed_sgd.py``), with
  ``r = 2`` none did. Note that ``a x`` moves the fixed points by ``O(sqrt(lr))``; the bias vanishes as lr -> 0.

Norms are *global* (one scalar over all parameters of one run, never per tensor) and use the *current*
learning rate, because the rule is defined for the whole iterate. Taming uses the same stochastic gradient in
numerator and denominator, so the tamed direction is a slightly biased estimate of ``grad f``; the bias
vanishes as ``lr -> 0`` (as for tamed Langevin schemes).

How it attaches. `SGDTaming` rewrites ``p.grad`` in ``on_before_optimizer_step`` so that a plain
``torch.optim.SGD`` step (no momentum, no weight decay) applies the tamed update; the learning-rate scheduler
`lightning_modules.tamed_sgd.schedulers.RobbinsMonroLR` gives the ``lr_n = lr_0 (n + n0)^(-power)`` schedule. The pure
functions `tamed_direction`, `dissipative_direction` and `clipped_direction` act on a flat vector or on a batch
of independent runs (leading dims are runs, the last dim is the parameter vector, norms are per run); the
callback and ``experiments/tamed_sgd.py`` share them.

Deviations and limits: per-group learning rates are supported (one global norm, each group's own lr);
sharded strategies (FSDP, DeepSpeed, ModelParallel) are refused because a local norm is not the global one.
"""
from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from lightning_modules.shared.errors import UserInputError

SCHEMES = ("tamed", "dissipative")
_SHARDED_STRATEGIES = {"FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy"}


# ----------------------------------------------------------------------------- pure, vectorised math
def tamed_scale(grad_norm: Tensor, lr: float | Tensor, lr_power: float = 1.0) -> Tensor:
    """The factor ``1 / (1 + lr**lr_power * ||g||)`` that multiplies the gradient in the tamed scheme."""
    return 1.0 / (1.0 + lr ** lr_power * grad_norm)


def dissipative_scale(param_norm: Tensor, lr: float | Tensor, iterate_power: float = 2.0) -> Tensor:
    """The factor ``1 / (1 + sqrt(lr) * ||x||**(2 r))`` that multiplies ``g - a x`` in the dissipative scheme."""
    return 1.0 / (1.0 + lr ** 0.5 * param_norm ** (2.0 * iterate_power))


def tamed_direction(grad: Tensor, lr: float | Tensor, lr_power: float = 1.0) -> Tensor:
    """``g / (1 + lr**q ||g||)`` per run: `grad` is ``(d,)`` or ``(..., d)`` with one run per leading index.

    `lr` is a float or a tensor broadcastable to ``(..., 1)`` (one step size per run).
    """
    grad_norm = torch.linalg.vector_norm(grad, dim=-1, keepdim=True)
    return grad * tamed_scale(grad_norm, lr, lr_power)


def dissipative_direction(grad: Tensor, params: Tensor, lr: float | Tensor, restoring_coef: float = 1.0,
                          iterate_power: float = 2.0) -> Tensor:
    """``a x + (g - a x) / (1 + sqrt(lr) ||x||^(2r))`` per run (``a = restoring_coef``, ``r = iterate_power``).

    `grad` and `params` have the same shape ``(d,)`` or ``(..., d)``; the norm of ``x`` is taken per run.
    """
    param_norm = torch.linalg.vector_norm(params, dim=-1, keepdim=True)
    restoring = restoring_coef * params
    return restoring + (grad - restoring) * dissipative_scale(param_norm, lr, iterate_power)


def clipped_direction(grad: Tensor, max_norm: float = 1.0) -> Tensor:
    """Baseline: ``g * min(1, max_norm / ||g||)`` per run (norm clipping, without Lightning's 1e-6 epsilon)."""
    grad_norm = torch.linalg.vector_norm(grad, dim=-1, keepdim=True)
    return grad * torch.clamp(max_norm / grad_norm, max=1.0)


# ----------------------------------------------------------------------------- the callback
class SGDTaming(Callback):
    """Rewrite the gradients before every optimizer step so that plain SGD performs a tamed update.

    Args:
        scheme: ``"tamed"`` (gradient-norm taming) or ``"dissipative"`` (iterate-norm taming with a restoring term).
        lr_power: ``q`` of the tamed scheme, ``g / (1 + lr^q ||g||)``; 1 (default) or 0.5 (variant), in (0, 1].
        restoring_coef: ``a >= 0`` of the dissipative scheme (the linear restoring term ``a x``).
        iterate_power: ``r > 0`` of the dissipative scheme (taming by ``||x||^(2r)``); 2 by default, see module doc.
        allow_any_optimizer: skip the check that the optimizer is ``torch.optim.SGD`` without momentum or weight
            decay. The schemes are defined for plain SGD; with other optimizers the result is something else.

    Logged every step: ``taming/scale`` (the factor applied, first param group) and ``taming/grad_norm``
    (tamed) or ``taming/param_norm`` (dissipative).
    """

    def __init__(self, scheme: Literal["tamed", "dissipative"] = "tamed", lr_power: float = 1.0,
                 restoring_coef: float = 1.0, iterate_power: float = 2.0,
                 allow_any_optimizer: bool = False) -> None:
        super().__init__()
        if scheme not in SCHEMES:
            raise UserInputError(f"SGDTaming scheme={scheme!r} is unknown: choose one of {list(SCHEMES)}.")
        if not 0.0 < lr_power <= 1.0:
            raise UserInputError(f"SGDTaming lr_power={lr_power!r} must lie in (0, 1]: the tamed step length is "
                                 "at most lr^(1 - lr_power). Use 1 (default) or 0.5.")
        if not restoring_coef >= 0.0:
            raise UserInputError(f"SGDTaming restoring_coef={restoring_coef!r} must be >= 0 (it is the "
                                 "coefficient a of the restoring term a*x; 0 disables it).")
        if not iterate_power > 0.0:
            raise UserInputError(f"SGDTaming iterate_power={iterate_power!r} must be > 0 (taming by "
                                 "||x||^(2 r)); 2 is the tested default.")
        self.scheme = scheme
        self.lr_power = float(lr_power)
        self.restoring_coef = float(restoring_coef)
        self.iterate_power = float(iterate_power)
        self.allow_any_optimizer = allow_any_optimizer

    @property
    def state_key(self) -> str:
        return self._generate_state_key(scheme=self.scheme, lr_power=self.lr_power,
                                        restoring_coef=self.restoring_coef, iterate_power=self.iterate_power)

    # ------------------------------------------------------------------ validation
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.gradient_clip_val:
            raise UserInputError(
                f"SGDTaming and trainer.gradient_clip_val={trainer.gradient_clip_val} both control the step "
                "length (double control). Remove gradient_clip_val (set it to null) or remove the SGDTaming "
                "callback.")
        tamers = [cb for cb in trainer.callbacks if isinstance(cb, SGDTaming)]
        if len(tamers) > 1:
            raise UserInputError(f"{len(tamers)} SGDTaming callbacks are attached; the gradients would be tamed "
                                 "several times. Keep exactly one in trainer.callbacks.")
        strategy = type(trainer.strategy).__name__
        if strategy in _SHARDED_STRATEGIES:
            raise UserInputError(f"SGDTaming needs the global norm over all parameters, but {strategy} shards "
                                 "them. Use a single-device or DDP strategy.")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.allow_any_optimizer:
            for optimizer in trainer.optimizers:
                self.check_plain_sgd(optimizer)

    @staticmethod
    def check_plain_sgd(optimizer: torch.optim.Optimizer) -> None:
        """Raise `UserInputError` unless `optimizer` is ``torch.optim.SGD`` without momentum or weight decay."""
        fix = ("Taming is defined for plain SGD: use torch.optim.SGD with momentum 0 and weight_decay 0, or set "
               "SGDTaming's allow_any_optimizer: true if you really mean to tame another optimizer's input.")
        if not isinstance(optimizer, torch.optim.SGD):
            raise UserInputError(f"SGDTaming got optimizer {type(optimizer).__name__}. {fix}")
        for index, group in enumerate(optimizer.param_groups):
            for key in ("momentum", "weight_decay"):
                if group.get(key, 0.0):
                    raise UserInputError(f"SGDTaming got SGD with {key}={group[key]} in param group {index}. {fix}")
            if group.get("nesterov", False):
                raise UserInputError(f"SGDTaming got SGD with nesterov=True in param group {index}. {fix}")

    # ------------------------------------------------------------------ the rewrite
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        groups = [(group["lr"], [p for p in group["params"] if p.grad is not None])
                  for group in optimizer.param_groups]
        groups = [(lr, params) for lr, params in groups if params]
        if not groups:
            return
        if self.scheme == "tamed":
            grad_norm = torch.nn.utils.get_total_norm([p.grad for _, params in groups for p in params])
            scales = [tamed_scale(grad_norm, lr, self.lr_power) for lr, _ in groups]
            for scale, (_, params) in zip(scales, groups, strict=True):
                for p in params:
                    p.grad.mul_(scale)
            norm_name, norm = "taming/grad_norm", grad_norm
        else:
            param_norm = torch.nn.utils.get_total_norm([p.detach() for _, params in groups for p in params])
            scales = [dissipative_scale(param_norm, lr, self.iterate_power) for lr, _ in groups]
            for scale, (_, params) in zip(scales, groups, strict=True):
                for p in params:  # a x + (g - a x) * scale, computed in place in p.grad
                    restoring = self.restoring_coef * p.detach()
                    p.grad.sub_(restoring).mul_(scale).add_(restoring)
            norm_name, norm = "taming/param_norm", param_norm
        pl_module.log("taming/scale", scales[0].detach().float(), on_step=True, on_epoch=False)
        pl_module.log(norm_name, norm.detach().float(), on_step=True, on_epoch=False)
