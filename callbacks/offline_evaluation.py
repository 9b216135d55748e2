"""Evaluate an offline RL policy in the real environment at the end of each validation (PhyB and its anchors).

Runs ``episodes`` episodes in parallel in the datamodule's environment (`OfflineRLDataModule.make_env`) with the
module's acting rule (``pl_module.act``) and logs ``eval/return`` (mean undiscounted return), the D4RL normalised
score ``eval/normalized_score = 100 (R - R_random) / (R_expert - R_random)`` when the datamodule has reference returns,
and ``eval/q_overestimation``: the critic's Q(s0, a0) / reward_scale minus the discounted Monte-Carlo return of the same
episodes (positive = the critic overestimates). `evaluate` is usable on its own (the experiment calls it).

The environment is built in ``setup``: a missing gymnasium or a bad ``env_id`` stops the run before training. A file
dataset without ``env_id`` has no environment: the callback then logs one info line and evaluates nothing, and it
refuses at the start a ``ModelCheckpoint`` that monitors an ``eval/`` metric (one that would never be logged).
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_modules.shared.data_contract import OfflineRLData, data_view
from lightning_modules.shared.errors import UserInputError

log = logging.getLogger(__name__)


def evaluate(module, env, episodes: int, seed: int, deterministic: bool = False) -> dict[str, float]:
    """Roll out ``episodes`` episodes at once; returns mean return, its std, Q(s0, a0), the discounted return, their
    mean difference (``q_overestimation``, signed) and the mean per-episode absolute difference (``q_abs_error``)."""
    rng = np.random.default_rng(seed)
    gamma, scale = module.hparams.gamma, module.hparams.reward_scale
    obs = env.reset(episodes, rng)
    alive = np.ones(episodes, dtype=bool)
    returns, discounted = np.zeros(episodes), np.zeros(episodes)
    q0 = None
    was_training = module.training
    module.eval()
    generator_state = torch.get_rng_state()
    torch.manual_seed(seed)
    for t in range(env.horizon):
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=module.device)
        action = module.act(obs_t, deterministic=deterministic)
        if q0 is None:
            with torch.no_grad():
                q0 = (module.q_min(module.critic, obs_t, action) / scale).cpu().numpy()
        obs, reward, terminal, timeout = env.step(action.cpu().numpy().astype(np.float64))
        returns += np.where(alive, reward, 0.0)
        discounted += np.where(alive, gamma ** t * reward, 0.0)
        alive &= ~np.asarray(terminal, dtype=bool) & ~np.asarray(timeout, dtype=bool)
        if not alive.any():
            break
    torch.set_rng_state(generator_state)
    module.train(was_training)
    return {"return": float(returns.mean()), "return_std": float(returns.std()), "q0": float(q0.mean()),
            "mc_return": float(discounted.mean()), "q_overestimation": float((q0 - discounted).mean()),
            "q_abs_error": float(np.abs(q0 - discounted).mean())}


class OfflineEvaluation(Callback):
    """Log the real-environment return of the current policy after every validation.

    Args:
        episodes: parallel evaluation episodes. seed: their seed (the same episodes every time).
        deterministic: act with tanh(mean) instead of the code's candidate sampling.
    """

    def __init__(self, episodes: int = 10, seed: int = 12345, deterministic: bool = False) -> None:
        if episodes < 1:
            raise UserInputError(f"episodes={episodes} must be at least 1.")
        self.episodes, self.seed, self.deterministic = episodes, seed, deterministic
        self.env = None
        self.active = True  # False on a file dataset without an environment (see `setup`)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        datamodule = trainer.datamodule
        if not isinstance(datamodule, OfflineRLData) or not hasattr(pl_module, "act"):
            raise UserInputError("OfflineEvaluation needs an OfflineRLDataModule and an OfflineModelBasedRL module.")
        if stage not in ("fit", "validate"):
            return
        self.active = datamodule.evaluation_environment is not None
        if not self.active:
            monitored = sorted({str(c.monitor) for c in trainer.checkpoint_callbacks
                                if str(getattr(c, "monitor", None)).startswith("eval/")})
            if monitored:
                raise UserInputError(f"a ModelCheckpoint monitors {', '.join(monitored)}, which only the evaluation "
                                     "environment logs, and this file dataset has none: set data.init_args.env_id "
                                     "(e.g. Hopper-v4) or monitor val/td_error (as configs/phyb/quick.yaml does).")
            log.info("OfflineEvaluation: no evaluation environment (a file dataset without data.init_args.env_id): "
                     "eval/* is not logged; val/td_error measures the critic.")
        elif self.env is None:  # built at the start: a missing env_id or gymnasium is an error now, not after an epoch
            self.env = datamodule.make_env()

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not self.active:
            return
        result = evaluate(pl_module, self.env, self.episodes, self.seed, self.deterministic)
        pl_module.log("eval/return", result["return"])
        pl_module.log("eval/q_overestimation", result["q_overestimation"])
        data = data_view(OfflineRLData, trainer.datamodule)
        low, high = data.ref_min_return, data.ref_max_return
        if low is not None and high is not None:
            pl_module.log("eval/normalized_score", 100 * (result["return"] - low) / (high - low))
