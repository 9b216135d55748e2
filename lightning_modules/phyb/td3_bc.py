"""TD3+BC: "A Minimalist Approach to Offline Reinforcement Learning" (Scott Fujimoto, Shixiang Shane Gu; NeurIPS
2021, arXiv 2106.06860; official code github.com/sfujim/TD3_BC), the model-free baseline an offline RL user runs
first, beside PhyB's model-based Bellman targets on the same data, critic (`TwinQ`) and evaluation.

TD3 (twin critics with the minimum in the target, target-policy smoothing, delayed actor and target updates) with one
change to the actor (Section 5 of the paper): ``pi = argmax E_(s, a)~D [lambda Q1(s, pi(s)) - (pi(s) - a)^2]`` with
``lambda = alpha / mean_batch |Q1(s, pi(s))|`` (detached; alpha = 2.5): the normalisation makes the trade-off
independent of the reward scale. States are standardised with the training split's mean and std (+ 1e-3), as the
official code does. The deterministic actor is tanh-squashed to the data's [-1, 1] actions.

Deviation (as in `OfflineModelBasedRL`): critic and actor losses share one backward pass (the actor's Q1 goes through
a detached copy of the critic's weights), so an actor step uses the critic before that batch's critic step, and
the actor steps on batches 1, 3, 5, ... (the official code: 2, 4, 6, ...); the frequency is the same.

Rewards enter the critic multiplied by ``reward_scale`` exactly as in `OfflineModelBasedRL`, so ``Q / reward_scale``
is a return and `callbacks.offline_evaluation.evaluate` measures both the same way.
"""
from __future__ import annotations

import copy

import torch
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.func import functional_call

from lightning_modules.phyb.dynamics_ensemble import RecordsDatasetIdentity, check_batch, check_dims
from lightning_modules.phyb.phyb import TwinQ, relu_mlp
from lightning_modules.shared.base import PaperModule, _build_from_config
from lightning_modules.shared.data_contract import OfflineRLData
from lightning_modules.shared.errors import UserInputError, check_range


def td3_bc_actor_loss(q: Tensor, policy_action: Tensor, data_action: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    """The TD3+BC actor loss ``-lambda mean Q + mean (pi(s) - a)^2`` with ``lambda = alpha / mean |Q|`` (detached);
    q [B] is Q1 at the policy's actions. Returns (loss, lambda)."""
    lam = alpha / q.abs().mean().detach().clamp_min(1e-8)
    return -lam * q.mean() + (policy_action - data_action).square().mean(), lam


class DeterministicPolicy(nn.Module):
    """``a = tanh(MLP(s))`` (the official code's actor, ``max_action`` = 1)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_dim: int, hidden_layers: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*relu_mlp(obs_dim, action_dim, hidden_dim, hidden_layers), nn.Tanh())

    def forward(self, obs: Tensor) -> Tensor:
        return self.body(obs)


NO_TEST_STAGE = ("TD3BC has no test stage: its evaluation is online (the OfflineEvaluation callback during "
                 "fit/validate); use `validate` (or `predict` for the policy's actions).")


class TD3BC(RecordsDatasetIdentity, PaperModule):
    """TD3+BC on an offline dataset (see the module docstring); needs no dynamics model.

    Args:
        obs_dim, action_dim: sizes of the data (checked against the datamodule).
        alpha: the BC trade-off (2.5 in the paper). policy_noise, noise_clip: target-policy smoothing (0.2, 0.5).
        policy_delay: critic steps per actor (and target) step (2). gamma, tau: discount and Polyak rate.
        hidden_dim, hidden_layers: actor and twin-critic MLPs. reward_scale: rewards are multiplied by it in the
            critic (Q / reward_scale is a return). normalize_states: the official code's state standardisation.
        optimizer: the critic's (Adam 3e-4 in the paper); actor_optimizer: the actor's (Adam 3e-4).
    """

    no_test_stage = NO_TEST_STAGE

    def __init__(self, obs_dim: int = 3, action_dim: int = 1, alpha: float = 2.5, policy_noise: float = 0.2,
                 noise_clip: float = 0.5, policy_delay: int = 2, gamma: float = 0.99, tau: float = 5e-3,
                 hidden_dim: int = 256, hidden_layers: int = 2, reward_scale: float = 1.0,
                 normalize_states: bool = True, optimizer: OptimizerCallable = torch.optim.Adam,
                 actor_optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None, init_from: str | None = None,
                 init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        check_range("alpha", alpha, 0.0, low_inclusive=False)
        check_range("policy_noise", policy_noise, 0.0)
        check_range("noise_clip", noise_clip, 0.0)
        for name, value in (("gamma", gamma), ("tau", tau)):
            check_range(name, value, 0.0, 1.0)
        if policy_delay < 1:
            raise UserInputError(f"policy_delay={policy_delay} must be at least 1 (critic steps per actor step).")
        self.save_hyperparameters()
        self.actor_optimizer_factory = actor_optimizer
        self.automatic_optimization = False
        self.actor = DeterministicPolicy(obs_dim, action_dim, hidden_dim, hidden_layers)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = TwinQ(obs_dim, action_dim, hidden_dim, hidden_layers)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))
        self.val_td_error = torchmetrics.MeanMetric()
        self.dataset_identity: dict | None = None

    def setup(self, stage: str) -> None:
        check_dims(self, self.hparams.obs_dim, self.hparams.action_dim)
        super().setup(stage)
        if stage != "fit" or self.checkpoint_being_restored():
            return
        self.dataset_identity = self.data(OfflineRLData).dataset_identity or self.dataset_identity
        data = self.attached_data(OfflineRLData)
        if data is not None and self.hparams.normalize_states:
            obs = data.training_transitions()["obs"]
            self.obs_mean.copy_(obs.mean(0))
            self.obs_std.copy_(obs.std(0) + 1e-3)

    def configure_optimizers(self):
        critic = self.build_optimizer(self.critic.parameters())
        actor = _build_from_config(self.actor_optimizer_factory, self.actor.parameters(), "actor_optimizer")
        return [critic, actor]

    def normalise(self, obs: Tensor) -> Tensor:
        return (obs - self.obs_mean) / self.obs_std

    def q_min(self, critic: TwinQ, obs: Tensor, act: Tensor) -> Tensor:
        """min of the twin Q at raw states (standardised here), as `OfflineModelBasedRL.q_min`."""
        return critic(self.normalise(obs), act).min(0).values

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """The deterministic policy (TD3+BC evaluates without exploration noise, so ``deterministic`` is ignored)."""
        return self.actor(self.normalise(obs))

    @torch.no_grad()
    def td_target(self, batch: dict[str, Tensor], smoothing: bool = True) -> Tensor:
        """``r + gamma (1 - d) min_j Q_j'(s', clip(pi'(s') + clip(eps, -c, c), -1, 1))``, eps ~ N(0, policy_noise);
        ``smoothing=False`` (validation) drops eps: TD3's target smoothing regularises training, and without it
        the validation TD error is a function of the weights alone (the same with any number of processes)."""
        h = self.hparams
        next_obs = self.normalise(batch["next_obs"])
        action = self.actor_target(next_obs)
        if smoothing:
            action = action + (torch.randn_like(action) * h.policy_noise).clamp(-h.noise_clip, h.noise_clip)
        next_q = self.critic_target(next_obs, action.clamp(-1.0, 1.0)).min(0).values
        return batch["rew"] * h.reward_scale + h.gamma * (1 - batch["done"]) * next_q

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        h = self.hparams
        check_batch(batch)
        critic_opt, actor_opt = self.optimizers()
        obs = self.normalise(batch["obs"])
        critic_loss = (self.critic(obs, batch["act"]) - self.td_target(batch)).square().mean(-1).sum()
        loss, logs = critic_loss, {"train/critic_loss": critic_loss}
        actor_step = int(self.updates) % h.policy_delay == 0
        if actor_step:  # Q1 through a detached copy of the critic's weights: the actor loss trains only the actor
            action = self.actor(obs)
            weights = {name: p.detach() for name, p in self.critic.named_parameters()}
            q1 = functional_call(self.critic, weights, (obs, action))[0]
            actor_loss, lam = td3_bc_actor_loss(q1, action, batch["act"], h.alpha)
            loss = loss + actor_loss
            logs.update({"train/actor_loss": actor_loss, "train/lambda": lam})
        critic_opt.zero_grad()
        actor_opt.zero_grad()
        self.manual_backward(loss)
        critic_opt.step()
        if actor_step:
            actor_opt.step()
            with torch.no_grad():
                for target, source in ((self.critic_target, self.critic), (self.actor_target, self.actor)):
                    for t, s in zip(target.parameters(), source.parameters()):
                        t.lerp_(s, h.tau)
        self.updates += 1
        self.log_dict(logs, prog_bar=False)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        check_batch(batch)
        error = self.q_min(self.critic, batch["obs"], batch["act"]) - self.td_target(batch, smoothing=False)
        self.val_td_error.update(error.square())
        self.log("val/td_error", self.val_td_error, prog_bar=True)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int = 0) -> dict[str, Tensor]:
        """The policy's action and its Q as a return (Q / reward_scale)."""
        action = self.act(batch["obs"])
        return {"action": action, "q": self.q_min(self.critic, batch["obs"], action) / self.hparams.reward_scale}
