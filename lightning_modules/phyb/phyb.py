"""PhyB: "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief" (Hongqiang Lin, Pengfei Wang,
Nenggan Zheng; ICML 2026, arXiv 2606.00680), stage 2: offline model-based actor-critic on a pretrained dynamics
ensemble (`lightning_modules.phyb.dynamics_ensemble`, loaded with ``init_from``). The source is the official code (built
on PMDB's); every detail below that the code does not fix is a config option, named in brackets.

Per training step (everything batched over states, sampled models, next-state samples and candidate actions):

1. **Model rollout** [``rollout_batch`` states R, reset from dataset states on done or after ``max_rollout_length``]:
   a ~ pi(s); N models sampled per state among the elites (``num_models``; without replacement, with replacement for
   PMDB); per model S next-state samples (``next_state_samples``) s' ~ N(mu_i, sigma_i) with reward and done probability
   (soft termination); the value of s' under the target critic by importance sampling over M candidates from pi_ref and
   M from pi (``proposal_actions``): ``V(s') = alpha (logsumexp(Q/alpha + log w) - logsumexp(log w))``,
   w = pi_ref / proposal; ``Q_i = mean_S [r + gamma (1 - d) V(s')]``.
2. **Belief target** (``belief_target``): weights w over the N models, target ``y = sum_i w_i Q_i``, and the rollout
   continues from ``sum_i w_i s'_i`` (s'_i = the mean of model i's samples):
   ``mean`` uniform; ``mopo`` uniform with the reward penalty ``r - mopo_lambda max_i ||sigma_i / output_std||``
   (in reward units: ``reward_scale`` multiplies the penalised reward, `model_reward`);
   ``pmdb`` one-hot at the k-th smallest Q_i (``pmdb_k``); ``phyb`` `hybrid_belief_weights`: the ``k_smallest`` models
   of smallest Q (the released code's truncated ``torch.topk`` line, read as ``largest=False``), their Q min-max
   normalised within the subset, ``softmax(hybrid_lambda * q)`` (lambda = -3: lower value, larger weight), scattered
   into the N slots and smoothed ``(1 - eps) w + eps / N`` (``uniform_smoothing`` 0.01); per state with probability
   ``pmdb_fallback_prob`` the PMDB order statistic instead and with ``random_model_prob`` one random sampled model
   (deviation: both fallbacks reuse the same sampled models; the code resamples with replacement for the first).
   (s, a, y) go into a replay buffer kept in the module state (checkpointed, so ``--ckpt_path`` resumes exactly).
3. **Critic**: twin Q (min of two), MSE to ``r + gamma (1 - d) V(s')`` on a batch of real transitions and to y on an
   equal batch from the model buffer, weights ``real_weight`` / 1 - ``real_weight``; Polyak target (``tau``).
4. **Actor** (KL-regularised policy iteration): the target ``pi*(a|s) ∝ pi_ref(a|s) exp(Q(s,a)/alpha)`` over
   candidates (real states: pi_ref samples and dataset actions perturbed by N(0, ``action_noise``) in atanh space;
   model states: pi_ref and pi samples), with `kl_temperature`
   ``alpha = max((sum softmax(Q/1e-3 + log w) Q - sum softmax(log w) Q) / target_kl, 1e-3)`` per state; loss
   ``-sum_a softmax(Q/alpha + log w)(a) log pi(a|s)`` with per-dimension log-likelihoods weighted by
   ``std^(2 std_weight_beta)`` (normalised); the reference pi_ref is a slow EMA of pi (``reference_tau``).
   Acting samples among the 2M candidates with probabilities ``softmax(Q/alpha + log w)`` (``act``).

Deviations and reconstructions: rewards enter the critic multiplied by ``reward_scale`` (the code shifts and scales them
to about [0, 1] and clips Q to [0, 1/(1 - gamma)]; a pure scale keeps Q convertible to returns); the critic and actor
losses share one backward pass (their graphs are disjoint: the actor's weights are computed without gradient), so the
actor step uses the critic before its update; the optional Bregman regulariser of the code is not implemented;
the ensemble forward evaluates all members and gathers the sampled ones (simple; E is small off the paper scale).

Checks: the ``init_from`` ensemble must have been fitted on the attached dataset (the source, the behaviour policy or
file name and the sizes recorded in its checkpoint, `check_dataset_identity`; ``allow_other_dataset`` overrides it for
the same data under another name), one environment's termination rule is not applied to other data
(`check_termination`), and every batch must hold ``rew`` and ``done`` of shape [B] (`check_batch`). Training needs no
environment: on a file dataset without ``env_id`` the `OfflineEvaluation` callback skips itself (one info line) and
``val/td_error`` (the critic's held-out TD error) is the metric that exists.
"""
from __future__ import annotations

import copy
import logging
import math

import torch
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule, _build_from_config
from lightning_modules.shared.data_contract import OfflineRLData
from lightning_modules.phyb.dynamics_ensemble import (DATASET_IDENTITY_KEY, TERMINATION_FNS, EnsembleMLP,
                                                      GaussianEnsemble, RecordsDatasetIdentity, check_batch,
                                                      check_dataset_identity, check_dims, check_termination,
                                                      done_probability)
from lightning_modules.shared.errors import UserInputError, check_range

log = logging.getLogger(__name__)

BELIEF_TARGETS = ("mean", "mopo", "pmdb", "phyb")
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


# ============================================================================================ the paper's math
def hybrid_belief_weights(q: Tensor, k: int, lam: float = -3.0, smoothing: float = 0.01) -> Tensor:
    """PhyB's posterior hybrid belief over N models, q [B, N] -> w [B, N] (rows sum to 1)."""
    low, index = torch.topk(q, k, dim=-1, largest=False)
    span = (low.max(-1, keepdim=True).values - low.min(-1, keepdim=True).values).clamp_min(1e-8)
    normalised = (low - low.min(-1, keepdim=True).values) / span
    weights = torch.zeros_like(q).scatter(-1, index, torch.softmax(lam * normalised, dim=-1))
    return (1 - smoothing) * weights + smoothing / q.shape[-1]


def order_statistic_weights(q: Tensor, k: int) -> Tensor:
    """PMDB: one-hot at the k-th smallest of the N values (k = 1 is the minimum)."""
    index = q.argsort(-1)[..., k - 1:k]
    return torch.zeros_like(q).scatter(-1, index, 1.0)


def kl_temperature(q: Tensor, log_w: Tensor, target_kl: float, sharp: float = 1e-3, minimum: float = 1e-3) -> Tensor:
    """The code's closed-form temperature over candidate actions: q, log_w [..., M] -> alpha [..., 1]."""
    greedy = (torch.softmax(q / sharp + log_w, -1) * q).sum(-1, keepdim=True)
    average = (torch.softmax(log_w, -1) * q).sum(-1, keepdim=True)
    return ((greedy - average) / target_kl).clamp_min(minimum)


def soft_value(q: Tensor, log_w: Tensor, alpha: Tensor) -> Tensor:
    """``alpha (logsumexp(q/alpha + log w) - logsumexp(log w))`` over the last dimension."""
    return alpha[..., 0] * (torch.logsumexp(q / alpha + log_w, -1) - torch.logsumexp(log_w, -1))


def recorded_dataset(path: str, trusted: bool = False) -> dict | None:
    """The dataset recorded in a checkpoint (`DATASET_IDENTITY_KEY`), or None. Called after the weights were read
    from the same file (which validated it); memory-mapped, so the tensors are not read a second time."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=not trusted, mmap=True)
    except RuntimeError:  # a file saved without torch's zip format cannot be memory-mapped
        payload = torch.load(path, map_location="cpu", weights_only=not trusted)
    return payload.get(DATASET_IDENTITY_KEY) if isinstance(payload, dict) else None


def tanh_normal_log_prob(u: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """Per-dimension log-density of a = tanh(u), u ~ N(mean, std)."""
    return torch.distributions.Normal(mean, log_std.exp()).log_prob(u) - torch.log1p(-torch.tanh(u) ** 2 + 1e-6)


# ============================================================================================ networks
def relu_mlp(in_dim: int, out_dim: int, hidden_dim: int, hidden_layers: int) -> list[nn.Module]:
    """The layers of an MLP with ``hidden_layers`` ReLU layers of ``hidden_dim`` and a linear output (the actors)."""
    layers, size = [], in_dim
    for _ in range(hidden_layers):
        layers += [nn.Linear(size, hidden_dim), nn.ReLU()]
        size = hidden_dim
    return [*layers, nn.Linear(size, out_dim)]


class TanhGaussianPolicy(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, hidden_dim: int, hidden_layers: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*relu_mlp(obs_dim, 2 * action_dim, hidden_dim, hidden_layers))

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mean, log_std = self.body(obs).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample_u(self, obs: Tensor, n: int) -> Tensor:
        """n pre-tanh samples per state: [B, n, A]."""
        mean, log_std = self(obs)
        return mean[:, None] + log_std.exp()[:, None] * torch.randn(mean.shape[0], n, mean.shape[1],
                                                                     device=obs.device)

    def log_prob_u(self, obs: Tensor, u: Tensor) -> Tensor:
        """Per-dimension log pi(tanh(u) | s) for u [B, n, A]."""
        mean, log_std = self(obs)
        return tanh_normal_log_prob(u, mean[:, None], log_std[:, None])


class TwinQ(nn.Module):
    """Two Q networks as one batched network; ``forward`` gives [2, ...]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_dim: int, hidden_layers: int) -> None:
        super().__init__()
        self.net = EnsembleMLP(2, obs_dim + action_dim, 1, hidden_dim, hidden_layers)

    def forward(self, obs: Tensor, act: Tensor) -> Tensor:
        shape = obs.shape[:-1]
        x = torch.cat([obs, act], -1).reshape(-1, obs.shape[-1] + act.shape[-1])
        return self.net(x)[..., 0].reshape(2, *shape)


# ============================================================================================ the module
NO_TEST_STAGE = ("OfflineModelBasedRL has no test stage: its evaluation is online (the OfflineEvaluation callback "
                 "during fit/validate); use `validate` (or `predict` for the policy's actions).")


class OfflineModelBasedRL(RecordsDatasetIdentity, PaperModule):
    """Stage 2 of PhyB (and the MOPO / PMDB / mean-ensemble targets with the same actor-critic); see the module
    docstring. ``optimizer`` is the critic's (Adam 3e-4 in the code), ``actor_optimizer`` the actor's (Adam 3e-5).

    Args:
        obs_dim, action_dim, ensemble_size, ensemble_hidden_dim, ensemble_hidden_layers, termination: must match the
            DynamicsEnsemble checkpoint given as ``init_from`` (a mismatch is an error).
            One environment's termination rule is refused on other data (`check_termination`).
        belief_target: ``mean`` | ``mopo`` | ``pmdb`` | ``phyb``.
        num_models: N models per state (10); k_smallest: PhyB's subset (5); pmdb_k: PMDB's order statistic (2).
        reward_scale: rewards are multiplied by it in the critic (Q / reward_scale is a return).
        mopo_lambda: MOPO's penalty weight, in reward units (the penalty is scaled with the reward).
        allow_other_dataset: start from an ensemble checkpoint that recorded another dataset (source, behaviour or
            file name) than the attached one; only for the same data under another name (default False: an error).
    """

    no_test_stage = NO_TEST_STAGE

    def __init__(self, obs_dim: int = 3, action_dim: int = 1, ensemble_size: int = 7, ensemble_hidden_dim: int = 200,
                 ensemble_hidden_layers: int = 4, termination: str = "none", belief_target: str = "phyb",
                 num_models: int = 10, k_smallest: int = 5, pmdb_k: int = 2, hybrid_lambda: float = -3.0,
                 uniform_smoothing: float = 0.01, pmdb_fallback_prob: float = 0.1, random_model_prob: float = 0.1,
                 mopo_lambda: float = 1.0, next_state_samples: int = 10, proposal_actions: int = 10,
                 gamma: float = 0.99, tau: float = 5e-3, reference_tau: float = 1e-5, target_kl: float = 5.0,
                 action_noise: float = 0.1, std_weight_beta: float = 0.5, hidden_dim: int = 256,
                 hidden_layers: int = 3, rollout_batch: int = 256, max_rollout_length: int = 1000,
                 model_buffer_size: int = 25600, real_weight: float = 0.5, reward_scale: float = 1.0,
                 optimizer: OptimizerCallable = torch.optim.Adam,
                 actor_optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False,
                 allow_other_dataset: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        if belief_target not in BELIEF_TARGETS:
            raise UserInputError(f"belief_target='{belief_target}' is unknown; choose one of {BELIEF_TARGETS}.")
        if termination not in TERMINATION_FNS:
            raise UserInputError(f"termination='{termination}' is unknown; choose one of {sorted(TERMINATION_FNS)}.")
        if not 1 <= k_smallest <= num_models:
            raise UserInputError(f"k_smallest={k_smallest} must lie in [1, num_models={num_models}]: PhyB keeps the "
                                 "k smallest-Q models of the N sampled ones.")
        if not 1 <= pmdb_k <= num_models:
            raise UserInputError(f"pmdb_k={pmdb_k} must lie in [1, num_models={num_models}] (the k-th smallest of N).")
        if belief_target != "pmdb" and num_models > ensemble_size:
            raise UserInputError(f"num_models={num_models} > ensemble_size={ensemble_size}: models are sampled "
                                 "without replacement; lower num_models.")
        for name, value in (("pmdb_fallback_prob", pmdb_fallback_prob), ("random_model_prob", random_model_prob),
                            ("uniform_smoothing", uniform_smoothing), ("real_weight", real_weight),
                            ("gamma", gamma), ("tau", tau), ("reference_tau", reference_tau)):
            check_range(name, value, 0.0, 1.0)
        if pmdb_fallback_prob + random_model_prob > 1:
            raise UserInputError("pmdb_fallback_prob + random_model_prob must not exceed 1.")
        check_range("target_kl", target_kl, 0.0, low_inclusive=False)
        self.save_hyperparameters()
        self.actor_optimizer_factory = actor_optimizer
        self.automatic_optimization = False
        self.ensemble = GaussianEnsemble(obs_dim, action_dim, ensemble_size, ensemble_hidden_dim,
                                         ensemble_hidden_layers).requires_grad_(False)
        self.actor = TanhGaussianPolicy(obs_dim, action_dim, hidden_dim, hidden_layers)
        self.reference = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = TwinQ(obs_dim, action_dim, hidden_dim, hidden_layers)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.val_td_error = torchmetrics.MeanMetric()  # over every validation transition: exact under DDP
        # the model replay buffer and the rollout states: module state, so checkpoints carry them
        self.register_buffer("buffer_obs", torch.zeros(model_buffer_size, obs_dim))
        self.register_buffer("buffer_act", torch.zeros(model_buffer_size, action_dim))
        self.register_buffer("buffer_target", torch.zeros(model_buffer_size))
        self.register_buffer("buffer_count", torch.zeros((), dtype=torch.long))
        self.register_buffer("rollout_obs", torch.zeros(rollout_batch, obs_dim))
        self.register_buffer("rollout_steps", torch.zeros(rollout_batch, dtype=torch.long))
        self.init_from_dataset: dict | None = None  # the dataset recorded in the init_from checkpoint
        self.dataset_identity: dict | None = None   # the dataset this policy is trained on (written to checkpoints)

    # ----------------------------------------------------------------------------- set-up
    def setup(self, stage: str) -> None:
        h = self.hparams
        check_dims(self, h.obs_dim, h.action_dim)
        super().setup(stage)
        report = self.init_from_report or {}
        bad = [k for k in report.get("shape_mismatch", []) if k.startswith("ensemble.")]
        if bad:
            raise UserInputError(f"init_from '{self.init_from}' holds an ensemble of another size ({bad[0]}); set "
                                 "obs_dim/action_dim/ensemble_* to the checkpoint's or retrain the ensemble.")
        if stage == "fit":
            current = self.data(OfflineRLData).dataset_identity
            if self.init_from_report is not None and not h.allow_other_dataset:
                check_dataset_identity(self.init_from_dataset, current, self.init_from)
            self.dataset_identity = current or self.dataset_identity or self.init_from_dataset
        check_termination(self, h.termination)
        if self.checkpoint_being_restored():  # an exact resume restores the ensemble right after setup
            return
        if stage == "fit" and not bool(self.ensemble.fitted):
            raise UserInputError("the dynamics ensemble is untrained: set model.init_args.init_from to a "
                                 "DynamicsEnsemble checkpoint (python train.py fit --config "
                                 "configs/phyb/ensemble_quick.yaml writes one).")
        elites = int(self.ensemble.elite_mask.sum())
        if stage == "fit" and h.belief_target != "pmdb" and h.num_models > elites:
            raise UserInputError(f"num_models={h.num_models} exceeds the checkpoint's {elites}"
                                 " elite models; lower num_models or raise num_elites in the ensemble stage.")

    def load_initial_weights(self) -> dict[str, list[str]]:
        report = super().load_initial_weights()
        self.init_from_dataset = recorded_dataset(self.init_from, self.init_from_trusted)
        if self.init_from_dataset is None:
            log.warning("init_from %s records no dataset (written before datasets were recorded): make sure its "
                        "ensemble was fitted on the attached data.", self.init_from)
        return report

    def configure_optimizers(self):
        critic = self.build_optimizer(self.critic.parameters())
        actor = _build_from_config(self.actor_optimizer_factory, self.actor.parameters(), "actor_optimizer")
        return [critic, actor]

    # ----------------------------------------------------------------------------- values
    def candidates(self, obs: Tensor, centre: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """M pi_ref samples + M samples of a second proposal: pi, or (``centre`` = pre-tanh dataset actions [B, 1, A])
        the dataset action perturbed by N(0, action_noise) in atanh space. Returns pre-tanh candidates u [B, 2M, A]
        and log w = log pi_ref - log proposal [B, 2M] (proposal = the equal mixture of the two)."""
        m, noise = self.hparams.proposal_actions, self.hparams.action_noise
        u_ref = self.reference.sample_u(obs, m)
        if centre is None:
            u = torch.cat([u_ref, self.actor.sample_u(obs, m)], 1).detach()
            log_other = self.actor.log_prob_u(obs, u).sum(-1)
        else:
            u = torch.cat([u_ref, centre + noise * torch.randn(len(obs), m, centre.shape[-1], device=obs.device)], 1)
            log_other = tanh_normal_log_prob(u, centre, torch.full_like(centre, math.log(noise))).sum(-1)
        log_ref = self.reference.log_prob_u(obs, u).sum(-1)
        log_proposal = torch.logaddexp(log_ref, log_other) - math.log(2)
        return u.detach(), (log_ref - log_proposal).detach()

    def q_min(self, critic: TwinQ, obs: Tensor, act: Tensor) -> Tensor:
        return critic(obs, act).min(0).values

    @torch.no_grad()
    def state_value(self, obs: Tensor) -> Tensor:
        """V(s) under the target critic (importance-sampled soft value), obs [..., O] -> [...]."""
        flat = obs.reshape(-1, obs.shape[-1])
        u, log_w = self.candidates(flat)
        q = self.q_min(self.critic_target, flat[:, None].expand(-1, u.shape[1], -1), torch.tanh(u))
        alpha = kl_temperature(q, log_w, self.hparams.target_kl)
        return soft_value(q, log_w, alpha).reshape(obs.shape[:-1])

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """The code's acting rule (a candidate drawn with probability softmax(Q/alpha + log w)), or tanh(mean)."""
        if deterministic:
            return torch.tanh(self.actor(obs)[0])
        u, log_w = self.candidates(obs)
        q = self.q_min(self.critic, obs[:, None].expand(-1, u.shape[1], -1), torch.tanh(u))
        alpha = kl_temperature(q, log_w, self.hparams.target_kl)
        choice = torch.multinomial(torch.softmax(q / alpha + log_w, -1), 1)[:, 0]
        return torch.tanh(u[torch.arange(len(obs), device=obs.device), choice])

    # ----------------------------------------------------------------------------- model rollouts
    def sample_model_indices(self, batch: int) -> Tensor:
        elites = self.ensemble.elite_mask.nonzero()[:, 0]
        n = self.hparams.num_models
        if self.hparams.belief_target == "pmdb":
            return elites[torch.randint(len(elites), (batch, n), device=self.device)]
        return elites[torch.rand(batch, len(elites), device=self.device).argsort(-1)[:, :n]]

    def belief_weights(self, q: Tensor) -> Tensor:
        h = self.hparams
        if h.belief_target in ("mean", "mopo"):
            return torch.full_like(q, 1.0 / q.shape[-1])
        pmdb = order_statistic_weights(q, h.pmdb_k)
        if h.belief_target == "pmdb":
            return pmdb
        hybrid = hybrid_belief_weights(q, h.k_smallest, h.hybrid_lambda, h.uniform_smoothing)
        random = torch.zeros_like(q).scatter(-1, torch.randint(q.shape[-1], (len(q), 1), device=q.device), 1.0)
        draw = torch.rand(len(q), 1, device=q.device)
        return torch.where(draw < h.pmdb_fallback_prob, pmdb,
                           torch.where(draw < h.pmdb_fallback_prob + h.random_model_prob, random, hybrid))

    def model_reward(self, normalised_reward: Tensor, std: Tensor) -> Tensor:
        """The model reward as it enters the critic, ``reward_scale (r - mopo_lambda u)``, [R, N, S]. MOPO (Yu et al.
        2020, Algorithm 2) penalises in reward units, ``r~ = r - lambda u``, with u = max over the sampled
        models of ``||sigma_i / output_std||`` (std [R, N, O + 1]); the critic's ``reward_scale`` multiplies the
        penalised reward, so lambda means the same at every scale (the other targets get no penalty)."""
        h = self.hparams
        reward = self.ensemble.raw_reward(normalised_reward)
        if h.belief_target == "mopo":
            uncertainty = (std / self.ensemble.output_std).norm(dim=-1).max(-1).values  # [R]
            reward = reward - h.mopo_lambda * uncertainty[:, None, None]
        return reward * h.reward_scale

    @torch.no_grad()
    def rollout_step(self, dataset_obs: Tensor) -> dict[str, Tensor]:
        """One step of the R parallel model rollouts; appends (s, a, y) to the model buffer."""
        h = self.hparams
        restart = self.rollout_steps == 0
        starts = dataset_obs[torch.randint(len(dataset_obs), (len(restart),), device=self.device)]
        obs = torch.where(restart[:, None], starts, self.rollout_obs)
        act = torch.tanh(self.actor.sample_u(obs, 1)[:, 0])
        rows = torch.arange(len(obs), device=self.device)[:, None]
        index = self.sample_model_indices(len(obs))                       # [R, N]
        mu, std = self.ensemble(obs, act)                                 # [E, R, O + 1]
        mu, std = mu[index, rows], std[index, rows]                       # [R, N, O + 1]
        sample = mu[:, :, None] + std[:, :, None] * torch.randn(*mu.shape[:2], h.next_state_samples, mu.shape[-1],
                                                                device=self.device)
        next_obs = sample[..., :-1]                                       # [R, N, S, O]
        reward = self.model_reward(sample[..., -1], std)
        expand = (*next_obs.shape[:-1], -1)
        done = done_probability(self.ensemble, TERMINATION_FNS[h.termination], obs[:, None, None].expand(expand),
                                act[:, None, None].expand(expand), next_obs)
        q_models = (reward + h.gamma * (1 - done) * self.state_value(next_obs)).mean(-1)   # [R, N]
        weights = self.belief_weights(q_models)
        target = (weights * q_models).sum(-1)
        self.rollout_obs.copy_((weights[..., None] * next_obs.mean(2)).sum(1))
        done_prob = (weights * done.mean(-1)).sum(-1)
        ended = (torch.rand_like(done_prob) < done_prob) | (self.rollout_steps + 1 >= h.max_rollout_length)
        self.rollout_steps.copy_(torch.where(ended, 0, self.rollout_steps + 1))
        slots = (self.buffer_count + torch.arange(len(obs), device=self.device)) % h.model_buffer_size
        self.buffer_obs[slots], self.buffer_act[slots], self.buffer_target[slots] = obs, act, target
        self.buffer_count += len(obs)
        return {"target": target, "weights": weights, "q_models": q_models}

    # ----------------------------------------------------------------------------- training
    def real_target(self, batch: dict[str, Tensor]) -> Tensor:
        h = self.hparams
        return batch["rew"] * h.reward_scale + h.gamma * (1 - batch["done"]) * self.state_value(batch["next_obs"])

    def actor_loss(self, obs: Tensor, u: Tensor, log_w: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            q = self.q_min(self.critic, obs[:, None].expand(-1, u.shape[1], -1), torch.tanh(u))
            alpha = kl_temperature(q, log_w, self.hparams.target_kl)
            target = torch.softmax(q / alpha + log_w, -1)
        mean, log_std = self.actor(obs)
        weight = log_std.detach().exp() ** (2 * self.hparams.std_weight_beta)
        weight = weight / weight.mean(-1, keepdim=True)
        log_prob = (tanh_normal_log_prob(u, mean[:, None], log_std[:, None]) * weight[:, None]).sum(-1)
        return -(target * log_prob).sum(-1).mean(), alpha.mean()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        h = self.hparams
        check_batch(batch)
        critic_opt, actor_opt = self.optimizers()
        rollout = self.rollout_step(batch["obs"])
        size = len(batch["obs"])
        picked = torch.randint(int(min(self.buffer_count, h.model_buffer_size)), (size,), device=self.device)
        model_obs, model_act, model_y = self.buffer_obs[picked], self.buffer_act[picked], self.buffer_target[picked]
        y_real = self.real_target(batch)
        critic_loss = (h.real_weight * (self.critic(batch["obs"], batch["act"]) - y_real).square().mean(-1).sum()
                       + (1 - h.real_weight) * (self.critic(model_obs, model_act) - model_y).square().mean(-1).sum())
        u_real, w_real = self.candidates(batch["obs"], centre=torch.atanh(batch["act"].clamp(-0.999, 0.999))[:, None])
        u_model, w_model = self.candidates(model_obs)
        loss_real, alpha_real = self.actor_loss(batch["obs"], u_real, w_real)
        loss_model, alpha_model = self.actor_loss(model_obs, u_model, w_model)
        actor_loss = h.real_weight * loss_real + (1 - h.real_weight) * loss_model
        critic_opt.zero_grad()
        actor_opt.zero_grad()
        self.manual_backward(critic_loss + actor_loss)
        critic_opt.step()
        actor_opt.step()
        with torch.no_grad():
            for target, source, rate in ((self.critic_target, self.critic, h.tau),
                                         (self.reference, self.actor, h.reference_tau)):
                for t, s in zip(target.parameters(), source.parameters()):
                    t.lerp_(s, rate)
        self.log_dict({"train/critic_loss": critic_loss, "train/actor_loss": actor_loss,
                       "train/alpha": (alpha_real + alpha_model) / 2, "train/model_target": rollout["target"].mean(),
                       "train/belief_max_weight": rollout["weights"].max(-1).values.mean()}, prog_bar=False)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        check_batch(batch)
        error = self.q_min(self.critic, batch["obs"], batch["act"]) - self.real_target(batch)
        self.val_td_error.update(error.square())
        self.log("val/td_error", self.val_td_error, prog_bar=True)


    def predict_step(self, batch: dict[str, Tensor], batch_idx: int = 0) -> dict[str, Tensor]:
        """The deterministic action tanh(mean) and its Q as a return (Q / reward_scale)."""
        action = self.act(batch["obs"], deterministic=True)
        return {"action": action, "q": self.q_min(self.critic, batch["obs"], action) / self.hparams.reward_scale}
