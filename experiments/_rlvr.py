"""What the two rollout-allocation experiments (``experiments.knapsack_rl``, ``experiments.dars``) share.

Task: reversed-digit addition ``a+b=`` -> digits of a+b least significant first, from
`datamodules.verifiable_tasks` (a fixed, tier-stratified RL pool with stable prompt ids and a disjoint held-out
test pool). Per seed: one supervised warm-up of the tiny GPT built from ``configs/grpo/sft_quick.yaml`` (a plain
loop over `lightning_modules.rlvr.sft.sft_loss`, AdamW; cached on disk under the temp dir keyed by seed, settings and
the warm-up's code, shared by both experiments), then GRPO built from the paper's config
(``configs/knapsack_rl/quick.yaml`` or ``configs/dars/quick.yaml``) through `experiments.kit.from_config`,
overriding only the experiment's scale and the arm's allocator, and trained with `experiments.kit.quiet_trainer`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback

import datamodules.verifiable_tasks as verifiable_tasks
import lightning_modules.rlvr.sft as sft_module
import lightning_modules.shared.tiny_gpt as tiny_gpt
from datamodules.verifiable_tasks import collate_sft
from experiments.kit import from_config, quiet_trainer
from lightning_modules.rlvr.grpo import pass_at_k
from lightning_modules.rlvr.rollout_allocation import KnapsackAllocator
from lightning_modules.rlvr.sft import sft_loss, success_rates

EVAL_SAMPLES = 32
SFT_CONFIG = "configs/grpo/sft_quick.yaml"


def add_rlvr_arguments(parser: argparse.ArgumentParser, steps: int, batch: int = 32) -> argparse.ArgumentParser:
    """The scale flags both experiments share (the kit's parser already has --seeds/--out/--smoke)."""
    parser.add_argument("--steps", type=int, default=steps, help="GRPO rollout steps per arm")
    parser.add_argument("--batch", type=int, default=batch, help="prompts per step (M)")
    parser.add_argument("--rollouts", type=int, default=8, help="uniform N per prompt")
    parser.add_argument("--pool", type=int, default=256, help="RL pool size (stratified over the tiers)")
    parser.add_argument("--test-pool", type=int, default=256)
    parser.add_argument("--tiers", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--tier-shares", type=int, nargs="+", default=None,
                        help="pool share of each tier, in sorted --tiers order (e.g. 6 1 1: three quarters of the "
                             "RL and test pools from the first tier); default: equal shares")
    parser.add_argument("--sft-steps", type=int, default=3000)
    parser.add_argument("--sft-batch", type=int, default=64)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--sft-extra-fraction", type=float, default=0.2,
                        help="share of SFT sums with one digit more than the bulk (max tier - 1 digits)")
    parser.add_argument("--lr", type=float, default=1e-4)
    return parser


def apply_smoke(args: argparse.Namespace) -> argparse.Namespace:
    """Seconds-long sizes for ``--smoke`` (the pipeline, not the claim)."""
    args.steps, args.batch, args.rollouts, args.pool, args.test_pool = 2, 8, 2, 16, 16
    args.tiers, args.sft_steps, args.sft_batch, args.tier_shares = [2, 3], 5, 8, None
    return args


def pool_tiers(args: argparse.Namespace) -> list[int]:
    """The datamodule's ``digit_tiers`` list: each tier repeated by its share (the pools are stratified over the
    list's entries, so a tier listed k times gets k shares of the RL and test pools)."""
    tiers = sorted(args.tiers)
    if args.tier_shares is None:
        return tiers
    if len(args.tier_shares) != len(tiers) or min(args.tier_shares) < 1:
        raise SystemExit(f"--tier-shares {args.tier_shares}: give one positive integer per tier {tiers}")
    return [t for t, share in zip(tiers, args.tier_shares) for _ in range(share)]


def settings(args: argparse.Namespace) -> dict:
    """The run's settings for the JSON's ``config`` (everything but the output folder)."""
    return {k: v for k, v in vars(args).items() if k != "out"}


def data_overrides(args, seed: int, batch: int | None = None) -> list[str]:
    """The VerifiableTaskDataModule arguments the experiment sets (the rest come from the config)."""
    tiers = sorted(args.tiers)
    return [f"--data.init_args.batch_size={batch or args.batch}", "--data.init_args.eval_batch_size=128",
            f"--data.init_args.sft_batch_size={args.sft_batch}", f"--data.init_args.train_pool_size={args.pool}",
            f"--data.init_args.test_pool_size={args.test_pool}", f"--data.init_args.digit_tiers={pool_tiers(args)}",
            f"--data.init_args.sft_num_examples={max(20_000, args.sft_steps * args.sft_batch)}",
            f"--data.init_args.sft_max_digits={max(1, tiers[-1] - 2)}",
            f"--data.init_args.sft_extra_digits={tiers[-1] - 1}",
            f"--data.init_args.sft_extra_fraction={args.sft_extra_fraction}", f"--data.init_args.seed={seed}"]


def rl_data(args, seed: int):
    """``(policy, datamodule)``: the config's TinyGPT (fresh) and the RL-split data of the run (pools, tokenizer)."""
    module, dm = from_config(SFT_CONFIG, f"--seed_everything={seed}", "--data.init_args.train_split=rl",
                             *data_overrides(args, seed))
    dm.setup("fit")
    return module.policy, dm


def max_new_tokens(args) -> int:
    return max(args.tiers) + 2  # the sum has at most max digits + 1, plus EOS


# --------------------------------------------------------------------------------------------- SFT (cached)
def warm_up(args, seed: int) -> dict:
    """The SFT policy's state_dict for this seed, from the disk cache or trained now (plain loop)."""
    key_settings = dict(seed=seed, steps=args.sft_steps, batch=args.sft_batch, lr=args.sft_lr, pool=args.pool,
                        test_pool=args.test_pool, tiers=sorted(args.tiers), model="TinyGPT-default",
                        extra_fraction=args.sft_extra_fraction)
    if args.tier_shares is not None:  # the SFT split excludes the pools, so their mix is part of the key
        key_settings["tier_shares"] = list(args.tier_shares)
    # the key also covers the code that determines the warm-up, so an edited recipe never reads a stale cache
    sources = b"".join(Path(module.__file__).read_bytes() for module in (sft_module, tiny_gpt, verifiable_tasks))
    key_settings["code"] = hashlib.sha1(sources + Path(__file__).read_bytes()).hexdigest()
    key = hashlib.sha1(json.dumps(key_settings, sort_keys=True).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / "icml26_rlvr_sft" / f"seed{seed}_{key}.pt"
    if cache.is_file():
        return torch.load(cache, weights_only=True)
    # the config's TinyGPT and data (the CLI seeds every generator with `seed` before building them)
    module, dm = from_config(SFT_CONFIG, f"--seed_everything={seed}", *data_overrides(args, seed),
                             f"--model.init_args.optimizer.init_args.lr={args.sft_lr}")
    dm.setup("fit")
    policy = module.policy
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.sft_lr, weight_decay=0.0)
    data, generator = dm.sft_dataset, torch.Generator().manual_seed(seed)
    for _ in range(args.sft_steps):
        rows = torch.randint(len(data), (args.sft_batch,), generator=generator).tolist()
        batch = collate_sft([data[i] for i in rows], dm.tokenizer)
        loss = sft_loss(policy, batch["input_tokens"], batch["loss_mask"])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, cache)
    return state


def success_table(policy, loader, tokenizer, samples: int, new_tokens: int, seed: int, temperature: float = 1.0):
    out = success_rates(policy.eval(), loader, tokenizer, samples, new_tokens, temperature,
                        generator=torch.Generator().manual_seed(seed))
    return out["prompt_ids"], out["tier"], out["p"]


def pool_difficulty(args, policy, dm, seed: int):
    """Success rate of every RL-pool prompt under the SFT policy (32 samples): the p-histogram and the hard set."""
    return success_table(policy, dm.train_pool_loader(128), dm.tokenizer, EVAL_SAMPLES, max_new_tokens(args),
                         seed + 3)


# --------------------------------------------------------------------------------------------- GRPO runs
class StepRecorder(Callback):
    """Per GRPO step: effective ratios, rollouts, positives on hard prompts, and (prompt, N, p̂) triples."""

    def __init__(self, hard_ids: set[int]) -> None:
        self.hard_ids = hard_ids
        self.steps: list[dict] = []
        self.allocations: list[tuple[int, int, float, float]] = []  # (step, N, plan-time p̂ or nan, valid)
        self._estimate = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        allocator = pl_module.rollout_allocator
        self._estimate = allocator.estimates(batch["prompt_ids"].cpu()) if isinstance(
            allocator, KnapsackAllocator) else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        last = pl_module.last_rollouts
        count, correct = last["counts"].long(), last["correct"].long()
        present = count > 0
        mixed = present & (correct > 0) & (correct < count)
        hard = torch.tensor([int(i) in self.hard_ids for i in last["prompt_ids"].tolist()])
        self.steps.append({
            "rollouts": int(count.sum()),
            "effective_ratio_response": float((count * mixed).sum() / count.sum().clamp(min=1)),
            "effective_ratio_prompt": float(mixed.float().sum() / present.float().sum().clamp(min=1)),
            "hard_visits": int(hard.sum()), "hard_rollouts": int(count[hard].sum()),
            "hard_positives": int(correct[hard].sum()),
            "hard_solved": int((correct[hard] > 0).sum()),
            "reward": float(correct.sum() / count.sum().clamp(min=1)),
        })
        step = len(self.steps) - 1
        if self._estimate is not None:
            p_hat, valid, _ = self._estimate
            for n, p, v in zip(count.tolist(), p_hat.tolist(), valid.tolist()):
                self.allocations.append((step, n, p if v else float("nan"), float(v)))


def train_grpo(args, seed: int, state: dict, config: str, overrides: list[str], hard_ids: set[int], *,
               batch: int | None = None, epochs: int | None = None):
    """GRPO from the paper's config and the SFT weights; returns the module, the per-step record and wall seconds.

    ``overrides`` are the arm's CLI strings (allocator, rollouts, PPO epochs, ...); the experiment's scale (data
    sizes, N, new tokens, lr, rollout seed) is set here for every arm alike.
    """
    module, dm = from_config(
        config, f"--seed_everything={seed}", "--model.init_args.init_from=null",
        f"--model.init_args.rollouts_per_prompt={args.rollouts}", f"--model.init_args.max_new_tokens="
        f"{max_new_tokens(args)}", f"--model.init_args.rollout_seed={seed}",
        f"--model.init_args.optimizer.init_args.lr={args.lr}", *data_overrides(args, seed, batch), *overrides)
    module.policy.load_state_dict(state)
    steps_per_epoch = -(-args.pool // dm.hparams.batch_size)
    recorder = StepRecorder(hard_ids)
    trainer = quiet_trainer([recorder], max_epochs=epochs or max(1, args.steps // steps_per_epoch),
                            limit_val_batches=0)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    return module, recorder, time.perf_counter() - start


def evaluate(args, policy, dm, seed: int) -> dict[str, float]:
    """Test pool: pass@1 per tier (mean over 32 samples at T 1), pass@16/32 on the two hardest tiers, greedy."""
    loader = dm.val_dataloader()
    _, tier, p = success_table(policy, loader, dm.tokenizer, EVAL_SAMPLES, max_new_tokens(args), seed + 7)
    _, _, greedy = success_table(policy, loader, dm.tokenizer, 1, max_new_tokens(args), seed, temperature=0.0)
    correct = torch.round(p * EVAL_SAMPLES)
    out = {"pass@1": float(p.mean()), "greedy": float(greedy.mean())}
    tiers = sorted(args.tiers)
    for t in tiers:
        out[f"pass@1_tier{t}"] = float(p[tier == t].mean())
    for t in tiers[-2:]:
        for k in (16, 32):
            out[f"pass@{k}_tier{t}"] = float(pass_at_k(EVAL_SAMPLES, correct[tier == t], k).mean())
    return out


def summarise_steps(recorder: StepRecorder) -> dict[str, float]:
    steps = recorder.steps
    half = steps[len(steps) // 2:]
    mean = lambda key, rows: float(np.mean([r[key] for r in rows]))  # noqa: E731
    hard_visits = sum(r["hard_visits"] for r in steps)
    return {
        "eff_ratio_response_2nd_half": mean("effective_ratio_response", half),
        "eff_ratio_prompt_2nd_half": mean("effective_ratio_prompt", half),
        "eff_ratio_response_all": mean("effective_ratio_response", steps),
        "rollouts_total": float(sum(r["rollouts"] for r in steps)),
        "hard_positives_total": float(sum(r["hard_positives"] for r in steps)),
        "hard_positives_per_visit": float(sum(r["hard_positives"] for r in steps) / max(1, hard_visits)),
        "hard_rollouts_total": float(sum(r["hard_rollouts"] for r in steps)),
        "train_reward_2nd_half": mean("reward", half),
    }


def eval_keys(args) -> list[str]:
    tiers = sorted(args.tiers)
    return ["pass@1", "greedy"] + [f"pass@1_tier{t}" for t in tiers] + [
        f"pass@{k}_tier{t}" for t in tiers[-2:] for k in (16, 32)]
