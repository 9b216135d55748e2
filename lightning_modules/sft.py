"""Supervised warm-up (SFT) of an RLVR policy: the "pretrain -> RL" chain's first stage.

The CPU recipe of this collection's RLVR papers (a documented choice, not from their text) warms the tiny GPT
up on freshly generated 1-3-digit sums plus ~5% 4-digit sums
(AdamW 3e-3, batch 128, ~1500 steps) so that the RL pool has the bimodal difficulty mix of a mid-trained model;
GRPO then fine-tunes from this checkpoint (``GRPO.init_from``: both modules keep the network at ``self.policy``,
so the weights match by name).

Loss: next-token cross-entropy on the target tokens only (the answer and EOS; ``loss_mask`` of the datamodule's
``sft`` split), averaged over target tokens. Validation: greedy accuracy (overall and per tier) and sampled
accuracy on the held-out prompts, scored by the same verifier as RL. `success_rates` estimates every prompt's
p = P(correct) by sampling (the p-histogram of the pool's difficulty mix).
"""
from __future__ import annotations

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from lightning_modules.base import PaperModule
from lightning_modules.data_contract import TokenizedData
from lightning_modules.errors import UserInputError, check_range
from lightning_modules.grpo import (ExactMatchReward, RewardFunction, SpecialTokens, completion_fields,
                                   decode_completions, group_statistics)
from lightning_modules.rollouts import sample_completions
from lightning_modules.tiny_gpt import check_policy_vocabulary


def sft_loss(policy: nn.Module, input_tokens: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the positions where ``loss_mask`` is True (targets)."""
    logits = policy(input_tokens[:, :-1])[0]
    targets, weights = input_tokens[:, 1:], loss_mask[:, 1:].float()
    losses = nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    return (losses * weights).sum() / weights.sum().clamp(min=1)


@torch.no_grad()
def success_rates(policy: nn.Module, loader, tokenizer, samples: int, max_new_tokens: int, temperature: float = 1.0,
                  reward: RewardFunction | None = None, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Per prompt of `loader`: ``prompt_ids``, ``tier`` and ``p`` = fraction of `samples` correct completions."""
    reward = reward or ExactMatchReward()
    ids, tiers, rates = [], [], []
    for batch in loader:
        prompts = batch["prompt_tokens"].to(device)
        counts = torch.full((prompts.shape[0],), samples, dtype=torch.long)
        tokens, mask, group = sample_completions(policy, prompts, batch["prompt_mask"].to(device), counts,
                                                 max_new_tokens, temperature, tokenizer, generator)
        answers = [batch["answers"][int(g)] for g in group.tolist()]
        rewards, flags, _ = reward.evaluate(decode_completions(tokens, mask, tokenizer), answers)
        correct = group_statistics(torch.as_tensor(rewards), group.cpu(), prompts.shape[0], correct=flags)["correct"]
        ids.append(batch["prompt_ids"])
        tiers.append(batch["tier"])
        rates.append(correct.float() / samples)
    return {"prompt_ids": torch.cat(ids), "tier": torch.cat(tiers), "p": torch.cat(rates)}


class SupervisedWarmup(PaperModule):
    """Next-token SFT of ``policy`` on the datamodule's ``sft`` split; greedy/sampled accuracy at validation.

    Args:
        policy: the network GRPO will fine-tune (kept at ``self.policy``).
        max_new_tokens: completion length at validation.
        eval_samples, eval_temperature: sampled accuracy at validation (0 samples: greedy only).
        reward: the verifier (default `ExactMatchReward`).
    """

    def __init__(self, policy: nn.Module, max_new_tokens: int = 8, eval_samples: int = 4,
                 eval_temperature: float = 1.0, reward: RewardFunction | None = None,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        self.save_hyperparameters()
        check_range("max_new_tokens", max_new_tokens, low=1)
        check_range("eval_samples", eval_samples, low=0)
        check_range("eval_temperature", eval_temperature, low=0.0)
        self.policy = policy
        self.reward = reward if reward is not None else ExactMatchReward()
        self._special = None

    def setup(self, stage: str) -> None:
        data_tokenizer = self.data_value(TokenizedData, "tokenizer")
        if data_tokenizer is not None:  # refuse a mismatch now, not while decoding the first validation samples
            check_policy_vocabulary(self.policy, data_tokenizer.vocab_size)
        super().setup(stage)

    @property
    def tokenizer(self):
        data_tokenizer = self.data_value(TokenizedData, "tokenizer")
        if data_tokenizer is not None:
            check_policy_vocabulary(self.policy, data_tokenizer.vocab_size)
            return data_tokenizer
        if self._special is not None:
            return self._special
        raise UserInputError("SupervisedWarmup needs a datamodule with a `.tokenizer` to generate.")

    def training_step(self, batch, batch_idx):
        if "input_tokens" not in batch:
            raise UserInputError("SupervisedWarmup trains on SFT batches: set the datamodule's train_split: sft.")
        loss = sft_loss(self.policy, batch["input_tokens"], batch["loss_mask"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_tokens"].shape[0])
        return loss

    def _accuracy(self, batch, samples: int, temperature: float, seed: int) -> torch.Tensor:
        num = batch["prompt_ids"].shape[0]
        generator = torch.Generator(device=self.device).manual_seed(seed)
        counts = torch.full((num,), samples, dtype=torch.long, device=self.device)
        tokens, mask, group = sample_completions(self.policy, batch["prompt_tokens"], batch["prompt_mask"], counts,
                                                 self.hparams.max_new_tokens, temperature, self.tokenizer, generator)
        answers = [batch["answers"][int(g)] for g in group.tolist()]
        rewards, flags, _ = self.reward.evaluate(decode_completions(tokens, mask, self.tokenizer), answers)
        rewards = torch.as_tensor(rewards).to(self.device)
        return group_statistics(rewards, group, num, correct=torch.as_tensor(flags))["correct"].float() / samples

    def validation_step(self, batch, batch_idx):
        greedy = self._accuracy(batch, 1, 0.0, batch_idx)
        size = greedy.numel()
        self.log("val/greedy_accuracy", greedy.mean(), batch_size=size, sync_dist=True)
        if self.hparams.eval_samples > 0:
            sampled = self._accuracy(batch, self.hparams.eval_samples, self.hparams.eval_temperature, batch_idx)
            self.log("val/accuracy", sampled.mean(), batch_size=size, sync_dist=True)
        if "input_tokens" in batch:
            self.log("val/loss", sft_loss(self.policy, batch["input_tokens"], batch["loss_mask"]), batch_size=size)

    def predict_step(self, batch, batch_idx=0):
        """Greedy completions [M, max_new_tokens] (padded with pad_id)."""
        ones = torch.ones(batch["prompt_ids"].shape[0], dtype=torch.long, device=self.device)
        tokens, _, _ = sample_completions(self.policy, batch["prompt_tokens"], batch["prompt_mask"], ones,
                                          self.hparams.max_new_tokens, 0.0, self.tokenizer)
        return nn.functional.pad(tokens, (0, self.hparams.max_new_tokens - tokens.shape[1]),
                                 value=self.tokenizer.pad_id)

    def prediction_fields(self, outputs, batch) -> dict:
        """Prompt and greedy completion as text (one JSONL line each), with the reference answers."""
        return completion_fields(outputs, batch, self.tokenizer)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        tok = self.data_value(TokenizedData, "tokenizer")
        if tok is not None:
            checkpoint["special_tokens"] = [tok.pad_id, tok.eos_id, tok.bos_id]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        if checkpoint.get("special_tokens") is not None:
            self._special = SpecialTokens(*checkpoint["special_tokens"])
