"""Supervised warm-up (SFT) of an RLVR policy: the "pretrain -> RL" chain's first stage.

The CPU recipe of this collection's RLVR papers (a documented choice, not from their text) warms the tiny GPT
up on freshly generated 1-3-digit sums plus ~5% 4-digit sums
(AdamW 3e-3, batch 128, ~1500 steps) so that the RL pool has the bimodal difficulty mix of a mid-trained model;
GRPO then fine-tunes from this checkpoint (``GRPO.init_from``: both modules keep the network at ``self.policy``,
so the weights match by name).

Loss: next-token cross-entropy on the target tokens only (the answer and EOS; ``loss_mask`` of the datamodule's
``sft`` split), averaged over target tokens. Validation: greedy accuracy (overall and per tier) and sampled
accuracy on the held-out prompts, scored by the same verifier as RL (``test``: the same on the test prompts). Each
sampled completion is drawn from its key of (prompt id, sample index) (`lightning_modules.rlvr.rollouts.rollout_keys`),
so the sampled accuracy does not depend on batching or on the number of processes.
`success_rates` estimates every prompt's p = P(correct) by sampling (the p-histogram of the pool's difficulty mix).

Predictions (``train.py predict``, one JSONL row per prompt): the prompt, the greedy completion and the reference
answers. With emotion data attached (`lightning_modules.shared.data_contract.EmotionWordData`: the language
models of the emotion-hierarchy paper, arXiv 2507.10599) each row also summarises the next-token distribution after the
prompt over the emotion words: the ``emotion_top_words`` (5 most probable) with their probabilities ``emotion_top_p``
and the probability of the true emotion (``label_prob``). That distribution, not the single greedy word, is what the
paper reads out of a language model (its trees are built from the same renormalised probabilities of the emotion
words among the 100 most probable tokens, `lightning_modules.emotion_hierarchy.emotion_probe.emotion_distribution`), so
a user can check a trained LM before probing it. ``predict_step`` therefore also returns the top-100 next-token ids and
probabilities of every prompt.

Data parallel (DDP, or fully sharded: FSDP2 through ``ModelParallelStrategy``, configs/trainer/fsdp.yaml): the
loss of a step is divided by the number of target tokens of ALL ranks (an all-reduce), and multiplied by the world
size against the gradient averaging, so a step equals one process's step on the global batch (tests/test_fsdp.py),
also when the ranks' batches hold different numbers of target tokens. Sharded, ``configure_model`` applies
``fully_shard`` to every block of the policy and then its root (`lightning_modules.shared.tiny_gpt.fully_shard_model`),
and validation's generation keeps the ranks' forward passes in step (`lightning_modules.rlvr.rollouts`, ``synced``).
"""
from __future__ import annotations

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import TokenizedData
from lightning_modules.emotion_hierarchy.emotion_probe import emotion_distribution, word_token_map
from lightning_modules.shared.data_contract import EmotionWordData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExactMeans
from lightning_modules.rlvr.grpo import (ExactMatchReward, RewardFunction, SpecialTokens, completion_fields,
                                   decode_completions, group_statistics)
from lightning_modules.rlvr.rollouts import rollout_keys, sample_completions
from lightning_modules.shared.tiny_gpt import (check_policy_vocabulary, fully_shard_model, is_sharded,
                                     picklable_hyperparameters, sharding_mesh)

NEXT_TOKEN_TOP_K = 100     # next-token candidates kept per prompt (the emotion paper's official code reads 100)
EMOTION_SUMMARY_WORDS = 5  # emotion words per row of the prediction file
EVALUATION_SEED = 0        # key seed of the sampled validation/test completions (fixed: the same in every run)


def sft_loss_terms(policy: nn.Module, input_tokens: torch.Tensor, loss_mask: torch.Tensor,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed next-token cross-entropy over the positions where ``loss_mask`` is True, number of such targets)."""
    logits = policy(input_tokens[:, :-1])[0]
    targets, weights = input_tokens[:, 1:], loss_mask[:, 1:].float()
    losses = nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    return (losses * weights).sum(), weights.sum()


def sft_loss(policy: nn.Module, input_tokens: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the positions where ``loss_mask`` is True (targets)."""
    total, count = sft_loss_terms(policy, input_tokens, loss_mask)
    return total / count.clamp(min=1)


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
        self._eval_means = ExactMeans()

    def setup(self, stage: str) -> None:
        sharding_mesh(self._trainer, "SupervisedWarmup")  # refuses FSDP1, DeepSpeed and tensor parallelism
        data_tokenizer = self.data(TokenizedData).tokenizer
        if data_tokenizer is not None:  # refuse a mismatch now, not while decoding the first validation samples
            check_policy_vocabulary(self.policy, data_tokenizer.vocab_size)
        super().setup(stage)

    @property
    def tokenizer(self):
        data_tokenizer = self.data(TokenizedData).tokenizer
        if data_tokenizer is not None:
            check_policy_vocabulary(self.policy, data_tokenizer.vocab_size)
            return data_tokenizer
        if self._special is not None:
            return self._special
        raise UserInputError("SupervisedWarmup needs a datamodule with a `.tokenizer` to generate.")

    def configure_model(self) -> None:
        """FSDP2 under ModelParallelStrategy: shard the policy (every block, then its root)."""
        mesh = sharding_mesh(self._trainer, "SupervisedWarmup")
        if mesh is not None:
            fully_shard_model(self.policy, mesh)

    def training_step(self, batch, batch_idx):
        if "input_tokens" not in batch:
            raise UserInputError("SupervisedWarmup trains on SFT batches: set the datamodule's train_split: sft.")
        total, count = sft_loss_terms(self.policy, batch["input_tokens"], batch["loss_mask"])
        world = int(self.trainer.world_size) if self._trainer is not None else 1
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            sums = torch.stack([total.detach(), count.detach()]).float()
            torch.distributed.all_reduce(sums)  # global target tokens (and loss sum, for the logged value)
            loss = total / sums[1].clamp(min=1) * world  # x world undoes the gradient averaging over ranks
            logged = sums[0] / sums[1].clamp(min=1)
        else:
            loss = logged = total / count.clamp(min=1)
        self.log("train/loss", logged, prog_bar=True, batch_size=batch["input_tokens"].shape[0])
        return loss

    def _accuracy(self, batch, samples: int, temperature: float, seed: int) -> torch.Tensor:
        """Per prompt, the fraction of ``samples`` completions judged correct; sampled completions are keyed by
        (``seed``, prompt id, sample index)."""
        num = batch["prompt_ids"].shape[0]
        counts = torch.full((num,), samples, dtype=torch.long, device=self.device)
        keys = rollout_keys(seed, batch["prompt_ids"], counts) if temperature > 0 else None
        tokens, mask, group = sample_completions(self.policy, batch["prompt_tokens"], batch["prompt_mask"], counts,
                                                 self.hparams.max_new_tokens, temperature, self.tokenizer,
                                                 row_seeds=keys, synced=is_sharded(self.policy))
        answers = [batch["answers"][int(g)] for g in group.tolist()]
        rewards, flags, _ = self.reward.evaluate(decode_completions(tokens, mask, self.tokenizer), answers)
        rewards = torch.as_tensor(rewards).to(self.device)
        return group_statistics(rewards, group, num, correct=torch.as_tensor(flags))["correct"].float() / samples

    def _evaluate(self, batch, batch_idx, split: str) -> None:
        greedy = self._accuracy(batch, 1, 0.0, EVALUATION_SEED)
        size = greedy.numel()
        self._eval_means.add(f"{split}/greedy_accuracy", greedy.mean(), size)
        if self.hparams.eval_samples > 0:
            sampled = self._accuracy(batch, self.hparams.eval_samples, self.hparams.eval_temperature, EVALUATION_SEED)
            self._eval_means.add(f"{split}/accuracy", sampled.mean(), size)
        if "input_tokens" in batch:
            self._eval_means.add(f"{split}/loss", sft_loss(self.policy, batch["input_tokens"], batch["loss_mask"]),
                                 size)

    def _log_means(self) -> None:
        """The epoch's per-prompt means, summed exactly over ranks (`ExactMeans`); the same value on every rank."""
        for name, value in self._eval_means.compute(self.device).items():
            self.log(name, value, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._log_means()

    def on_test_epoch_end(self) -> None:
        self._log_means()

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "test")

    def predict_step(self, batch, batch_idx=0):
        """Greedy ``completion_tokens`` [M, max_new_tokens] (padded with pad_id) and the top-100 ``next_token_ids``
        / ``next_token_probs`` [M, 100] after each prompt."""
        ones = torch.ones(batch["prompt_ids"].shape[0], dtype=torch.long, device=self.device)
        tokens, _, _ = sample_completions(self.policy, batch["prompt_tokens"], batch["prompt_mask"], ones,
                                          self.hparams.max_new_tokens, 0.0, self.tokenizer,
                                          synced=is_sharded(self.policy))
        tokens = nn.functional.pad(tokens, (0, self.hparams.max_new_tokens - tokens.shape[1]),
                                   value=self.tokenizer.pad_id)
        logits = self.policy(batch["prompt_tokens"], attention_mask=batch["prompt_mask"])[0][:, -1]
        probs = logits.float().softmax(-1)
        top_probs, top_ids = probs.topk(min(NEXT_TOKEN_TOP_K, probs.shape[-1]), dim=-1)
        return {"completion_tokens": tokens, "next_token_ids": top_ids, "next_token_probs": top_probs}

    def prediction_fields(self, outputs, batch) -> dict:
        """Prompt and greedy completion as text (one JSONL line each), with the reference answers; with emotion
        data, the next-token emotion-word summary (module docstring)."""
        fields = completion_fields(outputs["completion_tokens"], batch, self.tokenizer)
        data = self.attached_data(EmotionWordData)
        if data is not None:
            fields.update(self.emotion_summary(outputs, batch, data))
        return fields

    def emotion_summary(self, outputs, batch, data) -> dict:
        """Top emotion words of the renormalised next-token distribution over ``data.emotion_words`` and the
        probability of each prompt's true emotion (``labels``, -1: unlabelled -> NaN)."""
        ids, top = outputs["next_token_ids"], outputs["next_token_probs"]
        vocab = max(int(ids.max()) + 1, self.tokenizer.vocab_size)
        probs = torch.zeros(ids.shape[0], vocab, dtype=top.dtype, device=top.device).scatter_(1, ids, top)
        words = list(data.emotion_words)
        word_of_token = word_token_map(data.tokenizer, words, vocab).to(ids.device)
        dist, _ = emotion_distribution(probs, word_of_token, len(words), top_k=ids.shape[1])
        best_probs, best = dist.topk(min(EMOTION_SUMMARY_WORDS, len(words)), dim=-1)
        fields = {"emotion_top_words": [[words[j] if p > 0 else "" for j, p in zip(row, row_p)]
                                        for row, row_p in zip(best.tolist(), best_probs.tolist())],
                  "emotion_top_p": best_probs}
        if "labels" in batch:
            labels = batch["labels"].to(dist.device)
            fields["label"] = [words[y] if y >= 0 else "" for y in labels.tolist()]
            picked = dist.gather(1, labels.clamp(min=0)[:, None]).squeeze(1)
            fields["label_prob"] = torch.where(labels >= 0, picked, torch.full_like(picked, float("nan")))
        return fields

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        picklable_hyperparameters(checkpoint)
        tok = self.data(TokenizedData).tokenizer
        if tok is not None:
            checkpoint["special_tokens"] = [tok.pad_id, tok.eos_id, tok.bos_id]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        if checkpoint.get("special_tokens") is not None:
            self._special = SpecialTokens(*checkpoint["special_tokens"])
