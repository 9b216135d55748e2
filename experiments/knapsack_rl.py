"""Knapsack RL vs uniform GRPO at equal rollouts: ``python -m experiments.knapsack_rl`` (~5 min, 2 cores).

Paper: "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation" (arXiv 2509.25849). Claim
checked: at the same total rollouts per step, allocating them by the knapsack over per-prompt success estimates
raises the response-level effective-gradient ratio (the fraction of rollouts whose group has mixed outcomes),
reported +20-40% relative in the paper; the method card expects +0.05..+0.3 absolute on this toy. Asserted
target: knapsack >= uniform + 0.05, averaged over the second half of training. pass@1 / pass@k are reported only.

Task (method card section 4, scaled to the CPU budget): reversed-digit addition ``a+b=`` -> digits of a+b least
significant first, from `datamodules.verifiable_tasks` (a fixed, tier-stratified RL pool with stable prompt ids, a
disjoint held-out test pool). Per seed: one supervised warm-up of the tiny GPT (plain loop over
`lightning_modules.sft.sft_loss`, AdamW; cached on disk under the temp dir keyed by seed and settings, and
shared by both arms and by ``experiments.dars``), then GRPO through `lightning_modules.grpo.GRPO` and a Lightning
Trainer, identical in both arms: M prompts x N = 8 rollouts per step (budget 8M), temperature 1, one on-policy
Adam step per batch (lr 1e-4), Â = r - group mean (Dr. GRPO) with the constant loss normaliser, no KL.
Arms: ``uniform`` (`UniformAllocator`) and ``knapsack`` (`KnapsackAllocator`, exact greedy solver, min_n =
negative_n = positive_n = 2, max_n 64, p from the last visit, valid after 8 rewards; the first epoch is uniform).

Scale (defaults; flags change them): digit tiers {2, 3, 4} (the card's {2..5} with SFT on 1-3 digits needs
~1500+ SFT steps of batch 128, many minutes per seed on this machine, so the SFT data and the top tier are one
digit shorter), RL pool 256 (85-86 per tier), test pool 256, 32 prompts per step (8 steps per epoch), 96 GRPO
steps (12 epochs), SFT 3000 steps of batch 64 at AdamW lr 3e-3 (grad-norm clip 1) on 1-2-digit sums plus 20%
3-digit sums (the card's 5% left the 3-digit tier at p ~ 0.001; 20% gives p ~ 0.01-0.04 there, ~0.2-0.95 on
2 digits, 0 on 4 digits), 2 seeds. Measured: ~5 min wall (SFT ~2 min per seed, ~20 s per GRPO arm).
"Hard" prompts are those whose success rate under the SFT policy (32 samples each,
measured once per seed before RL) is below 0.1; the same set is used in both arms.

Metrics: per step (from ``GRPO.last_rollouts``) the response- and prompt-level effective ratios, rollouts, and
positive rollouts on hard prompts; after training, on the test pool with 32 samples per prompt at T = 1:
pass@1 per tier, unbiased pass@16 / pass@32 on the two hardest tiers, greedy accuracy. Outputs: a markdown table
(mean ± std over seeds), ``results/knapsack_rl.json`` and ``results/knapsack_rl.png`` (allocation vs p̂ in the
second half, effective ratio vs cumulative rollouts).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from datamodules.verifiable_tasks import VerifiableTaskDataModule, collate_sft
from experiments import quiet_single_thread
from lightning_modules.grpo import GRPO, pass_at_k
from lightning_modules.rollout_allocation import KnapsackAllocator, RolloutAllocator, UniformAllocator
from lightning_modules.sft import sft_loss, success_rates
from lightning_modules.tiny_gpt import TinyGPT

PAPER = "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation (arXiv 2509.25849)"
RESULTS = Path(__file__).resolve().parents[1] / "results"
EVAL_SAMPLES = 32


def common_arguments(parser: argparse.ArgumentParser, seeds: int, steps: int) -> argparse.ArgumentParser:
    parser.add_argument("--seeds", type=int, default=seeds)
    parser.add_argument("--steps", type=int, default=steps, help="GRPO rollout steps per arm")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step (M)")
    parser.add_argument("--rollouts", type=int, default=8, help="uniform N per prompt")
    parser.add_argument("--pool", type=int, default=256, help="RL pool size (stratified over the tiers)")
    parser.add_argument("--test-pool", type=int, default=256)
    parser.add_argument("--tiers", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--sft-steps", type=int, default=3000)
    parser.add_argument("--sft-batch", type=int, default=64)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--sft-extra-fraction", type=float, default=0.2,
                        help="share of SFT sums with one digit more than the bulk (max tier - 1 digits)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--out", type=str, default=str(RESULTS))
    return parser


def datamodule(args, seed: int, split: str = "rl") -> VerifiableTaskDataModule:
    tiers = sorted(args.tiers)
    dm = VerifiableTaskDataModule(train_split=split, batch_size=args.batch, eval_batch_size=128,
                                  sft_batch_size=args.sft_batch, train_pool_size=args.pool,
                                  test_pool_size=args.test_pool, digit_tiers=tiers,
                                  sft_num_examples=max(20_000, args.sft_steps * args.sft_batch),
                                  sft_max_digits=max(1, tiers[-1] - 2), sft_extra_digits=tiers[-1] - 1,
                                  sft_extra_fraction=args.sft_extra_fraction, seed=seed)
    dm.setup("fit")
    return dm


def max_new_tokens(args) -> int:
    return max(args.tiers) + 2  # the sum has at most max digits + 1, plus EOS


# --------------------------------------------------------------------------------------------- SFT (cached)
def warm_up(args, seed: int) -> dict:
    """The SFT policy's state_dict for this seed, from the disk cache or trained now (plain loop)."""
    settings = dict(seed=seed, steps=args.sft_steps, batch=args.sft_batch, lr=args.sft_lr, pool=args.pool,
                    test_pool=args.test_pool, tiers=sorted(args.tiers), model="TinyGPT-default",
                    extra_fraction=args.sft_extra_fraction)
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / "icml26_rlvr_sft" / f"seed{seed}_{key}.pt"
    if cache.is_file():
        return torch.load(cache, weights_only=True)
    torch.manual_seed(seed)
    dm = datamodule(args, seed, split="sft")
    policy = TinyGPT()
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


def policy_from(state: dict) -> TinyGPT:
    policy = TinyGPT()
    policy.load_state_dict(state)
    return policy


def success_table(policy, loader, tokenizer, samples: int, new_tokens: int, seed: int, temperature: float = 1.0):
    out = success_rates(policy.eval(), loader, tokenizer, samples, new_tokens, temperature,
                        generator=torch.Generator().manual_seed(seed))
    return out["prompt_ids"], out["tier"], out["p"]


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


def train_grpo(args, seed: int, state: dict, allocator: RolloutAllocator, hard_ids: set[int], *,
               rollouts: int | None = None, batch: int | None = None, epochs: int | None = None,
               ppo_epochs: int = 1, drop_zero_variance: bool = False) -> tuple[GRPO, StepRecorder, float]:
    """GRPO from the SFT weights through Lightning; returns the module, the per-step record and wall seconds."""
    seed_everything(seed, workers=True, verbose=False)
    dm = datamodule(args, seed)
    if batch is not None:
        dm.hparams.batch_size = batch
    steps_per_epoch = -(-args.pool // dm.hparams.batch_size)
    module = GRPO(policy=policy_from(state), rollout_allocator=allocator,
                  rollouts_per_prompt=rollouts or args.rollouts, max_new_tokens=max_new_tokens(args),
                  temperature=1.0, scale_by_group_std=False, loss_aggregation="constant",
                  drop_zero_variance_groups=drop_zero_variance, ppo_epochs=ppo_epochs, ppo_mini_batches=1,
                  kl_coef=0.0, rollout_seed=seed, optimizer=functools.partial(torch.optim.Adam, lr=args.lr))
    recorder = StepRecorder(hard_ids)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=epochs or max(1, args.steps // steps_per_epoch),
                      limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder])
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    return module, recorder, time.perf_counter() - start


def evaluate(args, policy, seed: int) -> dict[str, float]:
    """Test pool: pass@1 per tier (mean over 32 samples at T 1), pass@16/32 on the two hardest tiers, greedy."""
    dm = datamodule(args, seed)
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


def aggregate(per_seed: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    arms = {}
    for arm, rows in per_seed.items():
        arms[arm] = {key: {"mean": float(np.mean([r[key] for r in rows])), "std": float(np.std([r[key] for r in rows]))}
                     for key in rows[0]}
    return arms


def markdown(arms: dict, keys: list[str]) -> str:
    lines = ["| arm | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for arm, metrics in arms.items():
        cells = [f"{metrics[k]['mean']:.3f} ± {metrics[k]['std']:.3f}" if k in metrics else "-" for k in keys]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pool_difficulty(args, state: dict, seed: int):
    """Success rate of every RL-pool prompt under the SFT policy (32 samples): the p-histogram and the hard set."""
    dm = datamodule(args, seed)
    ids, tier, p = success_table(policy_from(state), dm.train_pool_loader(128), dm.tokenizer, EVAL_SAMPLES,
                                 max_new_tokens(args), seed + 3)
    return ids, tier, p


def plot(path: Path, allocations: list, curves: dict[str, list[list[dict]]], rollouts_per_prompt: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    data = np.array([(n, p) for n, p in allocations if np.isfinite(p)]) if allocations else np.zeros((0, 2))
    if len(data):
        axes[0].scatter(data[:, 1], data[:, 0], s=6, alpha=0.25, label="prompt visits (2nd half)")
        bins = np.linspace(0, 1, 11)
        centre = (bins[:-1] + bins[1:]) / 2
        which = np.clip(np.digitize(data[:, 1], bins) - 1, 0, 9)
        means = [data[which == b, 0].mean() if (which == b).any() else np.nan for b in range(10)]
        axes[0].plot(centre, means, "r-o", label="mean N per p̂ bin")
    axes[0].axhline(rollouts_per_prompt, color="k", ls="--", lw=1, label=f"uniform N={rollouts_per_prompt}")
    axes[0].set(xlabel="p̂ (knapsack's estimate at plan time)", ylabel="rollouts N_i", yscale="log",
                title="Knapsack allocation vs success estimate")
    axes[0].legend(fontsize=8)
    for arm, runs in curves.items():
        for i, steps in enumerate(runs):
            x = np.cumsum([r["rollouts"] for r in steps])
            y = np.convolve([r["effective_ratio_response"] for r in steps], np.ones(5) / 5, mode="same")
            axes[1].plot(x, y, color="C0" if arm == "uniform" else "C1", alpha=0.8,
                         label=arm if i == 0 else None)
    axes[1].set(xlabel="cumulative rollouts", ylabel="response-level effective ratio (5-step mean)",
                title="Effective-gradient ratio")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> dict:
    quiet_single_thread()
    start = time.perf_counter()
    per_seed: dict[str, list[dict[str, float]]] = {"uniform": [], "knapsack": []}
    curves: dict[str, list[list[dict]]] = {"uniform": [], "knapsack": []}
    allocations, histograms, timings = [], [], {"sft_s": 0.0, "uniform_s": 0.0, "knapsack_s": 0.0}
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        state = warm_up(args, seed)
        timings["sft_s"] += time.perf_counter() - t0
        ids, tier, p = pool_difficulty(args, state, seed)
        hard = {int(i) for i, q in zip(ids.tolist(), p.tolist()) if q < 0.1}
        histograms.append({f"tier{t}": np.histogram(p[tier == t].numpy(), bins=10, range=(0, 1))[0].tolist()
                           for t in sorted(args.tiers)})
        sft_eval = {f"sft_p_tier{t}": float(p[tier == t].mean()) for t in sorted(args.tiers)}
        print(f"seed {seed}: SFT pool success {sft_eval}, hard prompts {len(hard)}", flush=True)
        for arm in ("uniform", "knapsack"):
            allocator = UniformAllocator() if arm == "uniform" else KnapsackAllocator(
                min_n=2, max_n=64, negative_n=2, positive_n=2, min_history=8, solver="greedy")
            module, recorder, wall = train_grpo(args, seed, state, allocator, hard)
            timings[f"{arm}_s"] += wall
            row = {**summarise_steps(recorder), **evaluate(args, module.policy, seed), "wall_s": wall}
            per_seed[arm].append(row)
            curves[arm].append(recorder.steps)
            if arm == "knapsack":
                second_half = len(recorder.steps) // 2
                allocations += [(n, q) for step, n, q, _ in recorder.allocations if step >= second_half]
            print(f"  {arm}: eff ratio (2nd half) {row['eff_ratio_response_2nd_half']:.3f}, pass@1 "
                  f"{row['pass@1']:.3f}, {wall:.0f}s", flush=True)
    arms = aggregate(per_seed)
    diffs = [k["eff_ratio_response_2nd_half"] - u["eff_ratio_response_2nd_half"]
             for k, u in zip(per_seed["knapsack"], per_seed["uniform"])]
    claim = {"target": "knapsack effective ratio (response level, 2nd half) >= uniform + 0.05",
             "difference_mean": float(np.mean(diffs)), "difference_per_seed": diffs,
             "held": bool(np.mean(diffs) >= 0.05)}
    tiers = sorted(args.tiers)
    keys_train = ["eff_ratio_response_2nd_half", "eff_ratio_prompt_2nd_half", "rollouts_total",
                  "hard_positives_per_visit"]
    keys_eval = ["pass@1", "greedy"] + [f"pass@1_tier{t}" for t in tiers] + [
        f"pass@{k}_tier{t}" for t in tiers[-2:] for k in (16, 32)]
    wall = time.perf_counter() - start
    print(f"\n## {PAPER}\n\nscale: {args.seeds} seeds, {args.steps} GRPO steps x {args.batch} prompts x "
          f"{args.rollouts} rollouts (budget {args.batch * args.rollouts}/step), pool {args.pool}, tiers {tiers}, "
          f"SFT {args.sft_steps} steps; wall {wall:.0f}s\n")
    print(markdown(arms, keys_train) + "\n\n" + markdown(arms, keys_eval))
    print(f"\nclaim: {claim['target']}: difference {claim['difference_mean']:+.3f} -> "
          f"{'HELD' if claim['held'] else 'NOT HELD'}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"paper": "knapsack_rl", "seeds": args.seeds, "wall_s": wall, "arms": arms, "claim": claim,
              "scale": {k: v for k, v in vars(args).items() if k != "out"}, "timings_s": timings,
              "sft_pool_histograms": histograms, "per_seed": per_seed}
    (out / "knapsack_rl.json").write_text(json.dumps(result, indent=1))
    plot(out / "knapsack_rl.png", allocations, curves, args.rollouts)
    return result


def main() -> None:
    parser = common_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]), seeds=2, steps=96)
    run(parser.parse_args())


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
