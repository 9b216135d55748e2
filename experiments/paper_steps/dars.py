"""DARS' two paper configs (Qwen2.5-Math-7B, hardness-weighted second stage) on OpenR1-Math in LUFFY's verl parquet
(``openr1.parquet``, the training file of the DARS scripts) with ``capacity_val.parquet`` for validation."""
from __future__ import annotations

from pathlib import Path

from experiments.paper_steps import Case
from experiments.paper_steps.grpo import PROBLEMS, qwen_model_folder, write_parquet

FORMAT = ("verl parquet as LUFFY's openr1.parquet (Elliott/Openr1-Math-46k-8192) lays it out: data_source, prompt "
          "[user message], target [assistant solution], ability, reward_model {ground_truth, style}, extra_info "
          "{index: int, split}; capacity_val.parquet in the same columns without target; model folder "
          "(save_pretrained: config.json, model.safetensors, tokenizer.json, tokenizer_config.json)")
LAYERS = 1


def openr1_rows(count: int, offset: int, with_target: bool, source: str) -> list[dict]:
    rows = []
    for i in range(count):
        problem, answer = PROBLEMS[(i + offset) % len(PROBLEMS)]
        row = {"data_source": source, "prompt": [{"content": problem, "role": "user"}], "ability": "math",
               "reward_model": {"ground_truth": answer, "style": "rule"},
               "extra_info": {"index": i, "split": "default"}}
        if with_target:
            row["target"] = [{"content": f"<think>\nWorking through the problem.\n</think>\n\n"
                                         f"The answer is $\\boxed{{{answer}}}$.", "role": "assistant"}]
        rows.append(row)
    return rows


def dars_files(folder: Path) -> list[str]:
    model = qwen_model_folder(folder / "models", "Qwen2.5-Math-7B", LAYERS)
    data = folder / "data" / "dars"
    write_parquet(openr1_rows(8, 0, True, "openr1"), data / "openr1.parquet")
    write_parquet(openr1_rows(4, 3, False, "aime24"), data / "capacity_val.parquet")
    return [f"--data.init_args.data_dir={data}", f"--data.init_args.tokenizer_path={model}",
            f"--model.init_args.policy.init_args.path={model}",
            "--data.init_args.num_workers=0"]


# one rollout batch = one optimiser step (the harness stops at exactly 2 and 3 optimiser steps); random weights
# solve nothing, so every group has zero reward variance and the zero-variance filter would leave no step at all
SMALL = ("--model.init_args.optimizer=torch.optim.SGD",
         "--trainer.val_check_interval=2", "--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2",
         "--model.init_args.rollouts_per_prompt=2", "--model.init_args.rollout_allocator.init_args.max_rollouts=4",
         "--model.init_args.max_new_tokens=16", "--model.init_args.ppo_mini_batches=1",
         "--model.init_args.drop_zero_variance_groups=false", "--model.init_args.eval_samples=2",
         "--model.init_args.eval_k=[1,2]")
TEST = ("--data.init_args.batch_size=1", "--data.init_args.eval_batch_size=1", "--model.init_args.max_new_tokens=8",
        "--model.init_args.eval_samples=1", "--model.init_args.eval_k=[1]")
COMMON_NOTE = (f"Qwen2.5-Math-7B architecture with {LAYERS} of 28 layers (widths, heads, KV heads, vocabulary "
               "unchanged), random weights, bf16-true as configured, stand-in byte-level BPE tokenizer with the "
               "released special-token ids and chat template; 2 prompts x N = 2 stage-1 rollouts with N_max = 4 "
               "(published {batch} x 8 with N_max = 64) of 16 new tokens (published up to 3072); zero-variance "
               "groups kept (random weights solve nothing, so the filter would leave no optimiser step); SGD "
               "without momentum instead of AdamW (weights, gradients and AdamW's two bf16 moment buffers of the "
               "1.32G parameters, most of them in the 152k-row embedding and output head, take 10.6 GB before "
               "activations, over the 10 GiB budget); one PPO mini-batch {epochs}so that one rollout batch is one "
               "optimiser step; validation 2 samples (published 128) after step 2 (published every {val} "
               "rollout batches; the 8-row file has 4 batches)")
CASES = {
    "configs/dars/paper.yaml": Case(
        dars_files, release_format=FORMAT, args=SMALL,
        note=COMMON_NOTE.format(batch=256, epochs="(published 8) ", val=400),
        test_args=TEST),
    "configs/dars/breadth_paper.yaml": Case(
        dars_files, release_format=FORMAT, args=(*SMALL, "--model.init_args.ppo_epochs=1"),
        note=COMMON_NOTE.format(batch=3072, epochs="and one PPO epoch (published 2) ", val=14),
        test_args=TEST),
}
