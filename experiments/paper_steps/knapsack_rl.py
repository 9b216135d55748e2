"""Knapsack-RL's paper config (Qwen2.5-Math-7B, knapsack re-allocation of the rollout budget) on DAPO-Math-17K in
verl parquet with AIME 2024 for validation, as in the released 7B script."""
from __future__ import annotations

from pathlib import Path

from experiments.paper_steps import Case
from experiments.paper_steps.grpo import DAPO_FORMAT, dapo_parquets, qwen_model_folder

LAYERS = 1


def knapsack_files(folder: Path) -> list[str]:
    model = qwen_model_folder(folder / "models", "Qwen2.5-Math-7B", LAYERS)
    data = dapo_parquets(folder / "data" / "dapo-math-17k")
    return [f"--data.init_args.data_dir={data}", f"--data.init_args.tokenizer_path={model}",
            f"--model.init_args.policy.init_args.path={model}",
            "--data.init_args.num_workers=0"]


CASES = {
    "configs/knapsack_rl/paper.yaml": Case(
        knapsack_files, release_format=DAPO_FORMAT,
        args=("--model.init_args.optimizer=torch.optim.SGD",
              "--trainer.val_check_interval=2", "--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2",
              "--model.init_args.rollouts_per_prompt=4", "--model.init_args.max_new_tokens=16",
              "--model.init_args.ppo_mini_batches=1", "--model.init_args.eval_samples=2",
              "--model.init_args.eval_k=[1,2]"),
        note=(f"Qwen2.5-Math-7B architecture with {LAYERS} of 28 layers (widths, heads, KV heads, vocabulary "
              "unchanged), random weights, bf16-true as configured, stand-in byte-level BPE tokenizer with the "
              "released special-token ids and chat template; 2 prompts x a budget of 4 rollouts each (published "
              "256 x 8) of 16 new tokens (published up to 4096); SGD without momentum instead of AdamW (weights, "
              "gradients and AdamW's two bf16 moment buffers of the 1.32G parameters, most of them in the 152k-row "
              "embedding and output head, take 10.6 GB before activations, over the 10 GiB budget); one PPO "
              "mini-batch per rollout batch (published 8) so that one rollout batch is one optimiser step; "
              "validation 2 samples (published 16) after step 2 (published every 400 rollout batches; the 8-row file "
              "has 4 batches)"),
        test_args=("--data.init_args.batch_size=1", "--data.init_args.eval_batch_size=1",
                   "--model.init_args.rollouts_per_prompt=2", "--model.init_args.max_new_tokens=8",
                   "--model.init_args.eval_samples=1", "--model.init_args.eval_k=[1]")),
}
