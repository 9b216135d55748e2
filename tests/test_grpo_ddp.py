"""GRPO under 2-process CPU DDP (gloo): ranks that keep different numbers of rollouts (one keeps none) after the
zero-variance filter and DARS' second stage still take the same synchronised backward passes, finish, and make
the same parameter update as one process on all ranks' rollouts.

Rollouts are injected (a fixed table per prompt, stage and rollout index) instead of sampled, so the one-process
reference sees exactly the rollouts the two ranks saw together. The two ranks are separate processes started the
way ``torchrun`` starts them (``LOCAL_RANK``, ``WORLD_SIZE``, ...), with a short collective timeout and a
wall-clock limit, so a desynchronised step fails the test instead of blocking it.

    python tests/test_grpo_ddp.py worker OUT_DIR     # what each rank runs (env set by the test)
"""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from datamodules.verifiable_tasks import CharTokenizer, collate_prompts
from lightning_modules.rlvr.grpo import GRPO, RewardFunction
from lightning_modules.rlvr.rollout_allocation import DARSAllocator
from lightning_modules.shared.tiny_gpt import TinyGPT

TOKENIZER = CharTokenizer()
# Stage-1 rewards per prompt id (4 rollouts each); stage 2 (DARS, prompts with accuracy < 0.5, +4 rollouts up to
# N_max = 8) rewards rollout i of prompts 3, 6, 9 when i % 3 == 1, everything else 0.
STAGE1 = {0: [0, 0, 0, 0], 1: [0, 0, 0, 0], 2: [0, 0, 0, 0], 3: [1, 0, 0, 0], 4: [1, 1, 0, 0], 5: [1, 1, 1, 1],
          6: [0, 1, 0, 0], 7: [0, 0, 0, 0], 8: [1, 0, 1, 0], 9: [0, 0, 0, 1]}
# Two training steps. Step 1: rank 0's prompts all stay unsolved (16 rollouts after stage 2, all dropped: it keeps
# none) while rank 1 keeps 12. Step 2: rank 0 keeps 8 rollouts, rank 1 keeps 12 (micro-batches of 2: 4 vs 6 passes).
RANK_BATCHES = [[[0, 1, 2], [6, 7]], [[3, 4, 5], [8, 9]]]
AGGREGATIONS = ("token_mean", "sequence_mean", "constant")
TIMEOUT_S = 240


def _reward_bit(prompt_id: int, stage: int, i: int) -> int:
    if stage == 0:
        return STAGE1[prompt_id][i]
    return int(prompt_id in (3, 6, 9) and i % 3 == 1)


class FirstCharReward(RewardFunction):
    """1 when the completion starts with "1" (the injected rollouts put their reward there)."""

    def __call__(self, completions, answers):
        return torch.tensor([float(c[:1] == "1") for c in completions]), {}


class InjectedRolloutGRPO(GRPO):
    """GRPO whose rollouts come from the fixed table above: deterministic per (prompt, stage, rollout index)."""

    def training_step(self, batch, batch_idx):
        self._stage = 0
        return super().training_step(batch, batch_idx)

    def generate(self, batch, counts, temperature, generator):
        if not self.policy.training or not hasattr(self, "_stage"):
            return super().generate(batch, counts, temperature, generator)
        rows, lengths, groups = [], [], []
        for j, (pid, n) in enumerate(zip(batch["prompt_ids"].tolist(), counts.tolist())):
            for i in range(int(n)):
                seed = torch.Generator().manual_seed(pid * 1000 + self._stage * 100 + i)
                length = 2 + (pid + i) % 4
                body = torch.randint(3, TOKENIZER.vocab_size, (length - 1,), generator=seed)
                first = TOKENIZER.encode(str(_reward_bit(pid, self._stage, i)))
                rows.append(torch.cat([torch.tensor(first), body]))
                lengths.append(length)
                groups.append(j)
        self._stage += 1
        width = max(lengths, default=0)
        tokens = torch.full((len(rows), width), TOKENIZER.pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for r, (row, length) in enumerate(zip(rows, lengths)):
            tokens[r, :length], mask[r, :length] = row, True
        return tokens.to(self.device), mask.to(self.device), torch.tensor(groups, dtype=torch.long, device=self.device)


class FixedBatches(LightningDataModule):
    """The training batches of one rank (``rank`` None: every rank's prompts together, for the reference)."""

    def __init__(self, rank: int | None) -> None:
        super().__init__()
        self.rank = rank

    def train_dataloader(self):
        if self.rank is None:
            steps = [sum((RANK_BATCHES[r][s] for r in range(len(RANK_BATCHES))), []) for s in range(2)]
        else:
            steps = RANK_BATCHES[self.rank]
        batches = [collate_prompts([{"prompt_id": p, "prompt": f"{p}+{p}=", "answers": ["0"]} for p in ids],
                                   TOKENIZER) for ids in steps]
        return DataLoader(batches, batch_size=None, collate_fn=lambda b: b)


def build_model(aggregation: str) -> GRPO:
    torch.manual_seed(0)
    policy = TinyGPT(vocab_size=TOKENIZER.vocab_size, n_layer=1, d_model=32, n_head=2, context_length=24)
    model = InjectedRolloutGRPO(
        policy, reward=FirstCharReward(), rollout_allocator=DARSAllocator("hardness_weighted", max_rollouts=8),
        rollouts_per_prompt=4, max_new_tokens=6, scale_by_group_std=False, loss_aggregation=aggregation,
        drop_zero_variance_groups=True, micro_batch_size=2, entropy_coef=0.01, max_grad_norm=1.0,
        optimizer=functools.partial(torch.optim.SGD, lr=0.5), rollout_seed=0)
    model.set_tokenizer(TOKENIZER)
    return model


def fit(aggregation: str, rank: int | None, **trainer_kwargs) -> tuple[dict[str, torch.Tensor], int]:
    model = build_model(aggregation)
    trainer = Trainer(accelerator="cpu", max_epochs=1, max_steps=-1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, use_distributed_sampler=False, **trainer_kwargs)
    trainer.fit(model, datamodule=FixedBatches(rank))
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}, trainer.global_step


def worker(out: str) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    for aggregation in AGGREGATIONS:
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60))
        weights, steps = fit(aggregation, rank, devices=2, strategy=strategy)
        torch.save({"weights": weights, "steps": steps}, Path(out) / f"rank{rank}_{aggregation}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_grpo_with_dars_and_dropped_groups_finishes_and_equals_one_process(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "NODE_RANK": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    ranks = [subprocess.Popen([sys.executable, __file__, "worker", str(tmp_path)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for process in ranks:
            process.kill()
        pytest.fail(f"2-process GRPO did not finish within {TIMEOUT_S} s: the ranks are out of step")
    assert all(p.returncode == 0 for p in ranks), "a rank failed:\n" + "\n".join(o[-3000:] for o in outputs)

    for aggregation in AGGREGATIONS:
        reference, steps = fit(aggregation, None, devices=1)
        initial = build_model(aggregation).policy.state_dict()
        assert steps == 2 and any(not torch.equal(v, initial[k]) for k, v in reference.items())
        for rank in range(2):
            got = torch.load(tmp_path / f"rank{rank}_{aggregation}.pt")
            assert got["steps"] == steps, (aggregation, rank, got["steps"])
            different = [k for k, v in reference.items()
                         if not torch.allclose(got["weights"][k], v, rtol=1e-5, atol=1e-7)]
            assert not different, f"{aggregation}, rank {rank}: weights differ from one process: {different[:4]}"


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(sys.argv[2])
