"""Stage 1 of PhyB: the probabilistic dynamics ensemble, as in the official code of "Regularized Offline Policy
Optimization with Posterior Hybrid Bayesian Belief" (Lin, Wang, Zheng; ICML 2026, arXiv 2606.00680; the code's
``EnsembleTransition`` / ``DynamicsEnsemble``, which follow PMDB's).

* `EnsembleMLP`: E members evaluated as one batched network (weights [E, in, out], ``einsum``; no loop over members),
  SiLU, truncated-normal init with std 1 / (2 sqrt(in)). `GaussianEnsemble` adds the code's statistics: inputs
  standardised with the training split's mean/std, outputs = (state change, normalised reward) scaled by their std,
  log-std soft-clamped between learned bounds (``max_logstd`` init 1, ``min_logstd`` init -5).
* Loss (the code's ``update_transition``): beta-weighted Gaussian NLL, ``-log N(y; mu, sigma) * sigma^(2 beta)``
  (sigma detached, normalised over the batch, beta = 0.5), summed over members, plus
  ``0.01 (sum max_logstd - sum min_logstd)``; each member sees its own bootstrap resample of every batch;
  gradient norm clipped at 10 (``trainer.gradient_clip_val``).
* Reward normalisation: ``(r - shift) / scale`` with ``shift = r_min - 0.05 (r_max - r_min)``,
  ``scale = 1.1 (r_max - r_min)`` (REWARD_GENERALIZATION_LIMIT 1.1).
* Soft termination (`soft_continue`): per state dimension the code keeps predictions inside
  [pred_min, pred_max] = the label range widened 11 times around its centre and lets them die out by
  [pred_min_2, pred_max_2] (21 times). The exact sigmoid shape is reconstructed: ``continue_d =
  min(1, min(sig((s' - c_lo) a), sig((c_hi - s') a)) / 0.99)`` with the centres c halfway between the two bounds
  and ``a = 2 logit(0.99) / (pred_max_2 - pred_max)``, so continue = 1 inside the first range and -> 0 beyond the
  second; ``done_prob = max(termination_fn(s, a, s'), 1 - prod_d continue_d)``.
* Known termination functions (`TERMINATION_FNS`): ``currency_exchange`` (t' >= 20 or money' < 0.1, the code's
  environment), ``hopper`` and ``walker2d`` (the standard MuJoCo health checks), ``none`` (Pendulum, HalfCheetah).
  An environment's rule is refused on other data (`check_termination`): ``currency_exchange`` only on the embedded
  CurrencyExchange data, ``hopper`` / ``walker2d`` only on observations of their size; a user's dataset uses ``none``
  (termination then comes from the soft-termination model alone) or its environment's rule.
* Validation: the held-out MSE of each member's mean prediction (normalised outputs); the ``num_elites`` best
  members are marked in the ``elite_mask`` buffer (the policy stage samples among them). Deviation: the code samples
  among all members and validates every 5 epochs only when a validation ratio is set.
* The checkpoint records which dataset the ensemble was fitted on (``checkpoint["offline_rl_dataset"]``: source,
  behaviour policy or file name, sizes; `OfflineRLDataModule.dataset_identity`); the policy stage refuses to start
  from it on another dataset (`check_dataset_identity`), even one with the same sizes.
* Every batch is checked to hold ``rew`` and ``done`` of shape [B] (`check_batch`): a [B, 1] column would broadcast
  ``r + gamma (1 - d) V`` to [B, B] without an error.
"""
from __future__ import annotations

import math

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import OfflineRLData
from lightning_modules.shared.errors import UserInputError

LOGIT_99 = math.log(0.99 / 0.01)
DATASET_IDENTITY_KEY = "offline_rl_dataset"


def termination_currency_exchange(obs: Tensor, act: Tensor, next_obs: Tensor) -> Tensor:
    return ((next_obs[..., 0] >= 20.0 - 1e-6) | (next_obs[..., 1] < 0.1)).float()


def termination_hopper(obs: Tensor, act: Tensor, next_obs: Tensor) -> Tensor:
    height, angle = next_obs[..., 0], next_obs[..., 1]
    healthy = (next_obs[..., 1:].abs() < 100).all(-1) & (height > 0.7) & (angle.abs() < 0.2)
    return (~healthy).float()


def termination_walker2d(obs: Tensor, act: Tensor, next_obs: Tensor) -> Tensor:
    height, angle = next_obs[..., 0], next_obs[..., 1]
    healthy = (height > 0.8) & (height < 2.0) & (angle > -1.0) & (angle < 1.0)
    return (~healthy).float()


def termination_none(obs: Tensor, act: Tensor, next_obs: Tensor) -> Tensor:
    return torch.zeros(next_obs.shape[:-1], dtype=next_obs.dtype, device=next_obs.device)


TERMINATION_FNS = {"none": termination_none, "currency_exchange": termination_currency_exchange,
                   "hopper": termination_hopper, "walker2d": termination_walker2d, "halfcheetah": termination_none}


def soft_clamp(x: Tensor, low: Tensor, high: Tensor) -> Tensor:
    x = high - nn.functional.softplus(high - x)
    return low + nn.functional.softplus(x - low)


def soft_continue(next_obs: Tensor, pred_min: Tensor, pred_max: Tensor, pred_min_2: Tensor,
                  pred_max_2: Tensor) -> Tensor:
    """Probability that a predicted state stays inside the plausible range (product over dimensions)."""
    slope = 2 * LOGIT_99 / (pred_max_2 - pred_max).clamp_min(1e-6)
    low = torch.sigmoid((next_obs - (pred_min + pred_min_2) / 2) * slope)
    high = torch.sigmoid(((pred_max + pred_max_2) / 2 - next_obs) * slope)
    return (torch.minimum(low, high) / 0.99).clamp(max=1.0).prod(-1)


class EnsembleMLP(nn.Module):
    """E independent MLPs as one batched network: x [E, B, in] (or [B, in], shared) -> [E, B, out]."""

    def __init__(self, members: int, in_dim: int, out_dim: int, hidden_dim: int, hidden_layers: int) -> None:
        super().__init__()
        sizes = [in_dim] + [hidden_dim] * hidden_layers + [out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            weight = torch.empty(members, fan_in, fan_out)
            nn.init.trunc_normal_(weight, std=1 / (2 * fan_in ** 0.5))
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.zeros(members, 1, fan_out)))

    def forward(self, x: Tensor) -> Tensor:
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = (torch.einsum("bi,eio->ebo", x, weight) if x.dim() == 2 else torch.einsum("ebi,eio->ebo", x, weight))
            x = x + bias
            if i < len(self.weights) - 1:
                x = nn.functional.silu(x)
        return x


class GaussianEnsemble(nn.Module):
    """The code's ``EnsembleTransition`` ("local" mode): predicts (s' - s, normalised r) as Gaussians per member."""

    def __init__(self, obs_dim: int, action_dim: int, members: int, hidden_dim: int, hidden_layers: int) -> None:
        super().__init__()
        self.obs_dim, self.members = obs_dim, members
        out = obs_dim + 1
        self.net = EnsembleMLP(members, obs_dim + action_dim, 2 * out, hidden_dim, hidden_layers)
        self.max_logstd = nn.Parameter(torch.ones(out))
        self.min_logstd = nn.Parameter(torch.full((out,), -5.0))
        for name, size in (("input_mean", obs_dim + action_dim), ("output_std", out), ("pred_min", obs_dim),
                           ("pred_max", obs_dim), ("pred_min_2", obs_dim), ("pred_max_2", obs_dim)):
            self.register_buffer(name, torch.zeros(size))
        self.register_buffer("input_std", torch.ones(obs_dim + action_dim))
        self.output_std.fill_(1.0)
        self.register_buffer("reward_shift", torch.zeros(()))
        self.register_buffer("reward_scale", torch.ones(()))
        self.register_buffer("elite_mask", torch.ones(members, dtype=torch.bool))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def set_statistics(self, data: dict[str, Tensor]) -> None:
        """Normalisation and plausible-range statistics from the training split (the code's ``reset_statistics``)."""
        inputs = torch.cat([data["obs"], data["act"]], -1)
        delta, reward, nxt = data["next_obs"] - data["obs"], data["rew"], data["next_obs"]
        self.input_mean.copy_(inputs.mean(0))
        self.input_std.copy_(torch.where(inputs.std(0) < 1e-12, 1.0, inputs.std(0)))
        r_min, r_max = reward.min(), reward.max()
        self.reward_shift.copy_(r_min - (r_max - r_min) * 0.05)
        self.reward_scale.copy_(((r_max - r_min) * 1.1).clamp_min(1e-6))
        out_std = torch.cat([delta.std(0), ((reward - self.reward_shift) / self.reward_scale).std().view(1)])
        self.output_std.copy_(torch.where(out_std < 1e-12, 1.0, out_std))
        lo, hi = nxt.min(0).values, nxt.max(0).values
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        self.pred_min.copy_(mid - half * 11.0)
        self.pred_max.copy_(mid + half * 11.0)
        self.pred_min_2.copy_(mid - 2 * half * 10.5)
        self.pred_max_2.copy_(mid + 2 * half * 10.5)

    def forward(self, obs: Tensor, act: Tensor) -> tuple[Tensor, Tensor]:
        """obs/act [B, .] (shared) or [E, B, .] -> mean, std [E, B, obs_dim + 1] of (s', normalised r)."""
        x = (torch.cat([obs, act], -1) - self.input_mean) / self.input_std
        mu, logstd = self.net(x).chunk(2, dim=-1)
        logstd = soft_clamp(logstd, self.min_logstd, self.max_logstd) + self.output_std.log()
        mu = mu * self.output_std
        mu = torch.cat([mu[..., :self.obs_dim] + obs, mu[..., self.obs_dim:]], -1)
        return mu, logstd.exp()

    def raw_reward(self, normalised: Tensor) -> Tensor:
        return normalised * self.reward_scale + self.reward_shift

    def normalised_targets(self, data: dict[str, Tensor]) -> Tensor:
        return torch.cat([data["next_obs"], ((data["rew"] - self.reward_shift) / self.reward_scale)[:, None]], -1)


def nll_loss(mu: Tensor, std: Tensor, target: Tensor, beta: float) -> Tensor:
    """The code's weighted Gaussian NLL: ``-log N(y; mu, std) * std^(2 beta)`` (weights normalised over the batch),
    summed over members, averaged over the batch and output dimensions."""
    nll = -torch.distributions.Normal(mu, std).log_prob(target)
    weight = std.detach() ** (2 * beta)
    weight = weight / weight.mean(-2, keepdim=True)
    return (nll * weight).sum(0).mean()


def check_batch(batch: dict[str, Tensor]) -> None:
    """A batch of transitions has obs/next_obs [B, O], act [B, A] and rew/done [B]: anything else would broadcast
    silently in the losses and targets (a [B, 1] reward makes ``r + gamma (1 - d) V(s')`` a [B, B] matrix)."""
    size = len(batch["obs"])
    for key, dims in (("obs", 2), ("act", 2), ("next_obs", 2), ("rew", 1), ("done", 1)):
        value = batch[key]
        if value.dim() != dims or len(value) != size:
            shape = "[B]" if dims == 1 else "[B, size]"
            raise UserInputError(f"the batch's '{key}' has shape {list(value.shape)}, expected {shape} with "
                                 f"B = {size}: the datamodule must give one row per transition (rewards and done "
                                 "flags flattened, as datamodules.offline_rl does).")


def describe_identity(identity: dict) -> str:
    """``source:dataset [keys] (obs_dim=.., action_dim=..)`` for error messages."""
    keys = identity.get("observation_keys")
    name = f"{identity.get('source')}:{identity.get('dataset')}" + (f" {keys}" if keys else "")
    return f"{name} (obs_dim={identity.get('obs_dim')}, action_dim={identity.get('action_dim')})"


def check_dataset_identity(recorded: dict | None, current: dict | None, checkpoint: str) -> None:
    """Refuse a checkpoint whose recorded dataset (`DATASET_IDENTITY_KEY`) is not the attached data: the source,
    the dataset name and the observation keys must be equal, and the sizes where both sides know them. A
    checkpoint without a record (written before datasets were recorded) is not checked."""
    if not recorded or not current:
        return
    same_name = all(recorded.get(key) == current.get(key) for key in ("source", "dataset", "observation_keys"))
    same_sizes = all(recorded.get(key) is None or current.get(key) is None or recorded[key] == current[key]
                     for key in ("obs_dim", "action_dim"))
    if not (same_name and same_sizes):
        raise UserInputError(f"init_from '{checkpoint}' holds a dynamics ensemble fitted on "
                             f"{describe_identity(recorded)} but the data is {describe_identity(current)}: train the "
                             "ensemble on this dataset first (stage 1 with the same data.init_args), or set "
                             "model.init_args.allow_other_dataset=true if it is the same data under another name.")


def check_dims(module, obs_dim: int, action_dim: int) -> None:
    """The attached data must have the configured (and checkpointed) observation and action sizes."""
    module.check_data_matches(OfflineRLData, {"obs_dim": obs_dim, "action_dim": action_dim},
                              "the dataset's {name} is {data} but the model (and its ensemble checkpoint) was built "
                              "for {model}; set model.init_args.{name}={data} and retrain the ensemble on this data.")


# termination rules that belong to one environment: the embedded source they model, the observation size they read
TERMINATION_SOURCES = {"currency_exchange": "currency_exchange"}
TERMINATION_OBS_DIMS = {"currency_exchange": 3, "hopper": 11, "walker2d": 17}


def check_termination(module, termination: str) -> None:
    """A termination rule of one environment must not be applied to other data: ``currency_exchange`` (the embedded
    CurrencyExchange's ``t' >= 20 or money' < 0.1``) only to ``source=currency_exchange``, ``hopper`` and ``walker2d``
    (MuJoCo health checks on the height and angle) only to observations of their size (11, 17)."""
    identity = module.data(OfflineRLData).dataset_identity or {}
    source, obs_dim = identity.get("source"), module.data(OfflineRLData).obs_dim
    belongs_to = TERMINATION_SOURCES.get(termination)
    size = TERMINATION_OBS_DIMS.get(termination)
    if (belongs_to is not None and source is not None and source != belongs_to) or (
            size is not None and obs_dim is not None and obs_dim != size):
        raise UserInputError(f"termination={termination} is the {termination} environment's rule (it reads "
                             f"{size}-dimensional observations{f' of source={belongs_to}' if belongs_to else ''}), "
                             f"not one for this data (source={source}, obs_dim={obs_dim}): set "
                             "model.init_args.termination in both stages to your environment's rule (none when "
                             "episodes never terminate early, or one of "
                             f"{sorted(set(TERMINATION_FNS) - {termination})}).")


NO_TEST_STAGE = ("DynamicsEnsemble has no test stage: its held-out error (val/mse, which also picks the elites) "
                 "is measured on the validation transitions; use `validate` (or `predict` for next-state "
                 "predictions).")


class RecordsDatasetIdentity:
    """Mixin of both PhyB stages: ``self.dataset_identity`` (the data a stage was fitted on) is written into every
    checkpoint and read back, so that stage 2 can refuse an ensemble fitted on other data."""

    dataset_identity: dict | None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[DATASET_IDENTITY_KEY] = self.dataset_identity

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.dataset_identity = checkpoint.get(DATASET_IDENTITY_KEY, self.dataset_identity)


class DynamicsEnsemble(RecordsDatasetIdentity, PaperModule):
    """Stage 1: fit the Gaussian dynamics ensemble on the offline data (see the module docstring).

    Args:
        obs_dim, action_dim: sizes of the data (checked against the datamodule).
        ensemble_size: members E (the paper: 100). num_elites: members kept by validation MSE.
        hidden_dim, hidden_layers: member MLP (the paper: 4 x 512; the code widens layers 2-3 by 2x, here uniform).
        nll_beta: the loss weight exponent (0.5). logstd_bound_weight: the log-std bound regulariser (0.01).
        termination: known termination function (`TERMINATION_FNS`); one environment's rule is refused on other data
            (`check_termination`: ``currency_exchange`` needs the embedded source, ``hopper``/``walker2d`` their sizes).
        bootstrap: give each member its own resample of every batch (the code) or the same batch.
    """

    no_test_stage = NO_TEST_STAGE

    def __init__(self, obs_dim: int = 3, action_dim: int = 1, ensemble_size: int = 7, num_elites: int = 5,
                 hidden_dim: int = 200, hidden_layers: int = 4, nll_beta: float = 0.5,
                 logstd_bound_weight: float = 0.01, termination: str = "none", bootstrap: bool = True,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        if termination not in TERMINATION_FNS:
            raise UserInputError(f"termination='{termination}' is unknown; choose one of {sorted(TERMINATION_FNS)}.")
        if not 1 <= num_elites <= ensemble_size:
            raise UserInputError(f"num_elites={num_elites} must lie in [1, ensemble_size={ensemble_size}].")
        self.save_hyperparameters()
        self.ensemble = GaussianEnsemble(obs_dim, action_dim, ensemble_size, hidden_dim, hidden_layers)
        self.register_buffer("val_sq_error", torch.zeros(ensemble_size), persistent=False)
        self.register_buffer("val_count", torch.zeros(()), persistent=False)
        self.dataset_identity: dict | None = None  # the data the ensemble is fitted on (written to checkpoints)

    def setup(self, stage: str) -> None:
        check_dims(self, self.hparams.obs_dim, self.hparams.action_dim)
        super().setup(stage)
        check_termination(self, self.hparams.termination)
        if stage == "fit":
            self.dataset_identity = self.data(OfflineRLData).dataset_identity or self.dataset_identity
        data = self.attached_data(OfflineRLData)
        if stage == "fit" and data is not None and not bool(self.ensemble.fitted):
            self.ensemble.set_statistics(data.training_transitions())
            self.ensemble.fitted.fill_(True)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        check_batch(batch)
        size, members = len(batch["obs"]), self.hparams.ensemble_size
        index = (torch.randint(size, (members, size), device=self.device) if self.hparams.bootstrap
                 else torch.arange(size, device=self.device).expand(members, size))
        obs, act = batch["obs"][index], batch["act"][index]
        target = self.ensemble.normalised_targets(batch)[index]
        mu, std = self.ensemble(obs, act)
        loss = nll_loss(mu, std, target, self.hparams.nll_beta)
        loss = loss + self.hparams.logstd_bound_weight * (self.ensemble.max_logstd.sum()
                                                          - self.ensemble.min_logstd.sum())
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_sq_error.zero_()
        self.val_count.zero_()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        check_batch(batch)
        mu, _ = self.ensemble(batch["obs"], batch["act"])
        error = ((mu - self.ensemble.normalised_targets(batch)) / self.ensemble.output_std).square().mean(-1)  # [E, B]
        self.val_sq_error += error.sum(-1)
        self.val_count += error.shape[1]

    def on_validation_epoch_end(self) -> None:
        # every process's shard: the same elites on every rank under DDP
        sq_error = self.trainer.strategy.reduce(self.val_sq_error, reduce_op="sum")
        count = self.trainer.strategy.reduce(self.val_count, reduce_op="sum")
        mse = sq_error / count.clamp_min(1)
        elites = mse.argsort()[:self.hparams.num_elites]
        if not self.trainer.sanity_checking:
            self.ensemble.elite_mask.zero_()
            self.ensemble.elite_mask[elites] = True
        self.log("val/mse", mse[elites].mean(), prog_bar=True)
        self.log("val/mse_all_members", mse.mean())


    def predict_step(self, batch: dict[str, Tensor], batch_idx: int = 0) -> dict[str, Tensor]:
        """Mean over the members of the predicted next state and raw reward, with the done probability."""
        mu, _ = self.ensemble(batch["obs"], batch["act"])
        mean = mu.mean(0)
        next_obs, reward = mean[:, :-1], self.ensemble.raw_reward(mean[:, -1])
        done = done_probability(self.ensemble, TERMINATION_FNS[self.hparams.termination], batch["obs"],
                                batch["act"], next_obs)
        return {"next_obs": next_obs, "reward": reward, "done_prob": done}


def done_probability(ensemble: GaussianEnsemble, termination_fn, obs: Tensor, act: Tensor, next_obs: Tensor) -> Tensor:
    """``max(termination_fn(s, a, s'), 1 - soft_continue(s'))`` (the code's soft termination)."""
    keep = soft_continue(next_obs, ensemble.pred_min, ensemble.pred_max, ensemble.pred_min_2, ensemble.pred_max_2)
    return torch.maximum(termination_fn(obs, act, next_obs), 1 - keep)
