"""Exponential moving average of a module's weights, for any LightningModule (diffusion and flow models).

``EMAWeights`` keeps ``ema <- decay * ema + (1 - decay) * theta`` over the trainable parameters after every
optimiser step (from ``start_step`` on; before that the average is a copy), in fp32 whatever the training
precision. Validation, test and predict run with the averaged weights swapped in, and the training weights are
swapped back before anything else sees the module (checkpoint callbacks run after this one, so a checkpoint's
``state_dict`` always holds the *training* weights and exact resume stays exact). The average itself is this
callback's state in the checkpoint; `load_ema_weights` copies it into a module for inference.

With ``warmup=True`` the decay ramps as ``min(decay, (1 + n) / (10 + n))`` (n = updates so far), the common
choice for short runs where a 0.999 average would still be dominated by the initial weights.

Buffers (BatchNorm statistics) are not averaged: the denoisers in this collection use GroupNorm/LayerNorm.
Under FSDP the average is kept per local shard, which is correct because every rank updates its own shard.

Lightning's ``EMAWeightAveraging`` computes the same fixed-decay average (``EMAWeights(start_step=1)``), but it
has no decay warm-up, keeps its average as a copy of the whole module in the training dtype (under
``bf16-true`` updates below bf16 resolution are lost, so a 0.999 average stalls), and stores the average as the
checkpoint's ``state_dict``, where this collection keeps the training weights for ``init_from`` and exact
resume; ``tests/test_library_equivalence.py`` shows each.
"""
from __future__ import annotations

import torch
from lightning.pytorch import Callback

from lightning_modules.shared.base import read_checkpoint
from lightning_modules.shared.errors import UserInputError, check_range


class EMAWeights(Callback):
    def __init__(self, decay: float = 0.999, start_step: int = 0, warmup: bool = False,
                 evaluate_with_ema: bool = True):
        check_range("decay", decay, low=0.0, high=1.0)
        check_range("start_step", start_step, low=0)
        self.decay, self.start_step, self.warmup = decay, start_step, warmup
        self.evaluate_with_ema = evaluate_with_ema
        self.averages: dict[str, torch.Tensor] = {}
        self.updates = 0
        self._stashed: dict[str, torch.Tensor] | None = None
        self._last_step = -1  # global step of the last update (gradient accumulation: one update per step)

    @staticmethod
    def _tracked(pl_module) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in pl_module.named_parameters() if p.requires_grad}

    def _ensure_started(self, pl_module) -> None:
        tracked = self._tracked(pl_module)
        if not self.averages:
            self.averages = {name: p.detach().float().clone() for name, p in tracked.items()}
            return
        if set(self.averages) != set(tracked):
            raise UserInputError("EMAWeights state does not match the module's trainable parameters (a checkpoint "
                                 "from another model?). Resume with the same model, or drop the EMA state.")
        for name, p in tracked.items():  # after a resume the state was loaded on the CPU
            self.averages[name] = self.averages[name].to(p.device)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._ensure_started(pl_module)

    def current_decay(self) -> float:
        if self.warmup:
            return min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))
        return self.decay

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self._last_step:
            return
        self._last_step = trainer.global_step
        tracked = self._tracked(pl_module)
        if trainer.global_step <= self.start_step:
            for name, p in tracked.items():
                self.averages[name].copy_(p.detach())
            return
        decay = self.current_decay()
        names = list(tracked)
        averages = [self.averages[n] for n in names]
        torch._foreach_lerp_(averages, [tracked[n].detach().float() for n in names], 1.0 - decay)
        self.updates += 1

    # --- swapping the average in for evaluation -------------------------------------------------------
    @torch.no_grad()
    def _swap_in(self, pl_module) -> None:
        if not self.evaluate_with_ema or not self.averages or self._stashed is not None:
            return
        tracked = self._tracked(pl_module)
        self._stashed = {name: p.detach().clone() for name, p in tracked.items()}
        for name, p in tracked.items():
            p.copy_(self.averages[name].to(p.dtype))

    @torch.no_grad()
    def _swap_out(self, pl_module) -> None:
        if self._stashed is None:
            return
        for name, p in self._tracked(pl_module).items():
            p.copy_(self._stashed[name])
        self._stashed = None

    def on_validation_start(self, trainer, pl_module) -> None:
        self._swap_in(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._swap_out(pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._swap_in(pl_module)

    def on_test_end(self, trainer, pl_module) -> None:
        self._swap_out(pl_module)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._swap_in(pl_module)

    def on_predict_end(self, trainer, pl_module) -> None:
        self._swap_out(pl_module)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._swap_out(pl_module)

    # --- checkpoint state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"averages": {k: v.detach().cpu() for k, v in self.averages.items()}, "updates": self.updates}

    def load_state_dict(self, state_dict: dict) -> None:
        self.averages = dict(state_dict["averages"])
        self.updates = int(state_dict["updates"])


def load_ema_weights(module: torch.nn.Module, checkpoint_path: str) -> int:
    """Copy the EMA average stored in a checkpoint (by `EMAWeights`) into `module`; returns the update count.

    Raises a `UserInputError` when the checkpoint holds no EMA state or its names do not match the module.
    """
    payload = read_checkpoint(checkpoint_path, what="EMA checkpoint")
    states = [state for key, state in payload.get("callbacks", {}).items() if str(key).startswith("EMAWeights")]
    if len(states) != 1:
        raise UserInputError(f"'{checkpoint_path}' holds {len(states)} EMAWeights states (expected 1): was it "
                             "trained with the callbacks.ema.EMAWeights callback?")
    averages = states[0]["averages"]
    own = dict(module.named_parameters())
    unknown = sorted(set(averages) - set(own))
    if unknown:
        raise UserInputError(f"EMA weights in '{checkpoint_path}' do not fit this model: unknown {unknown[:5]}")
    with torch.no_grad():
        for name, value in averages.items():
            own[name].copy_(value.to(own[name].dtype))
    return int(states[0]["updates"])
