"""Rollout generation for RLVR: batched temperature sampling with a KV cache, behind a small engine interface.

`sample_completions` draws ``num_samples_per_prompt[j]`` completions for prompt j, all rollouts of the call in
ONE padded batch: each prompt is prefilled once, its KV cache is gathered to its rollouts (``select_cache``),
then one token per step is sampled for every unfinished rollout until EOS or ``max_new_tokens``.

Returned (the contract GRPO, the allocators and the experiments rely on):

* ``completion_tokens`` LongTensor[R, T] (T <= max_new_tokens: the longest completion), padded with ``pad_id``
  after a completion ends; the EOS token, when produced, is part of the completion (as in TRL and verl);
* ``completion_mask`` BoolTensor[R, T], True on generated tokens (EOS included);
* ``group_index`` LongTensor[R]: the prompt position (0..M-1) of each rollout, rollouts of a prompt contiguous.

Sampling is ``softmax(logits / temperature)`` through ``torch.multinomial`` with the caller's generator
(temperature 0 = greedy), so a fixed generator seed gives the same rollouts with or without the cache (tested).
A faster engine (vLLM at scale) plugs in as a `RolloutEngine` subclass injected into GRPO (``rollout_engine``);
`TransformersGenerate` (transformers' ``generate``) is the reference engine used by the speed benchmark.

Per-rollout seeds (``row_seeds``): instead of one generator shared by the batch, rollout r draws its token at step t
by inverse-CDF sampling with a uniform hashed from (``row_seeds[r]``, t) (`keyed_uniforms`). A rollout's tokens then
depend only on its own key and the policy, not on which other rollouts share the batch, so splitting the prompts
over data-parallel ranks gives the same rollouts as one process.

Sharded policies (``synced=True``, FSDP2): every forward pass all-gathers parameters over the ranks, so every rank
must call the policy the same number of times even when its rollouts end earlier (or it has none). After each
step the ranks all-reduce a "still generating" flag and all keep calling the policy (on padding) until every rank
is done, as transformers' ``generate(..., synced_gpus=True)`` does; a rank without rollouts runs the same calls on
one dummy row. The returned tensors are what the unsynchronised call returns.
"""
from __future__ import annotations

import torch

from lightning_modules.shared.errors import UserInputError


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix of int64 values in [0, 2^32) (xor-shift-multiply rounds; the multipliers are below 2^31,
    so no product overflows int64 and CPU and GPU give the same bits)."""
    x = x & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
    x = ((x ^ (x >> 15)) * 0x1B873593) & 0xFFFFFFFF
    return x ^ (x >> 16)


def keyed_uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """One float64 uniform in [0, 1) per int64 key (24 random bits), a deterministic function of (key, step)."""
    keys = keys.long()
    mixed = _hash32(_hash32((keys >> 32) & 0xFFFFFFFF) ^ (keys & 0xFFFFFFFF))
    mixed = _hash32(mixed ^ _hash32(torch.full_like(mixed, step * 0x9E3779B1 % 2**32)))
    return (mixed >> 8).double() / 2.0 ** 24


def rollout_keys(seed: int, prompt_ids: torch.Tensor, counts: torch.Tensor,
                 first_index: torch.Tensor | None = None) -> torch.Tensor:
    """int64 key of every rollout, in `sample_completions`' row order: the high bits mix ``seed`` with the rollout's
    prompt id (31 bits: no int64 overflow), the low 32 bits are its index among the prompt's rollouts (counted from
    ``first_index[j]``: a second stage continues the numbering of the first)."""
    device = counts.device
    counts = counts.long()
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts)
    starts = torch.cumsum(counts, 0) - counts
    index = torch.arange(group.numel(), device=device) - starts[group]
    if first_index is not None:
        index = index + first_index.to(device).long()[group]
    seed_bits = _hash32(_hash32(torch.tensor((seed >> 32) & 0xFFFFFFFF, device=device)) ^ (seed & 0xFFFFFFFF))
    high = _hash32(seed_bits ^ _hash32(prompt_ids.to(device).long()[group]))
    return ((high & 0x7FFFFFFF) << 32) + (index & 0xFFFFFFFF)


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
                  row_seeds: torch.Tensor | None = None, step: int = 0) -> torch.Tensor:
    """One token per row of `logits` [R, V]: greedy at temperature 0, else a draw from softmax(logits / T), through
    ``torch.multinomial`` with ``generator`` or, with ``row_seeds`` [R], by inverse CDF at `keyed_uniforms`."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if row_seeds is None:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    cdf = probs.cumsum(-1)
    target = (keyed_uniforms(row_seeds.to(probs.device), step) * cdf[:, -1].double()).float()
    token = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    # a rounding edge can land on a zero-probability id: take the most probable one there
    return torch.where(probs.gather(1, token[:, None]).squeeze(-1) > 0, token, probs.argmax(-1))


def any_rank_active(active: bool, device: torch.device) -> bool:
    """Whether any rank of the default process group still generates (all-reduce MAX of a flag)."""
    flag = torch.tensor([float(active)], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item() > 0)


@torch.no_grad()
def sample_completions(policy, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor,
                       num_samples_per_prompt: torch.Tensor, max_new_tokens: int, temperature: float, tokenizer,
                       generator: torch.Generator | None = None, use_cache: bool = True,
                       row_seeds: torch.Tensor | None = None, synced: bool = False,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample completions for LEFT-padded prompts; see the module docstring for the returned tensors.

    ``tokenizer`` supplies ``eos_id`` (None: never stop early) and ``pad_id``. ``use_cache=False`` recomputes the
    whole sequence every step (the reference the KV-cache path is tested against). ``row_seeds`` (int64 [R], one
    per rollout) replaces ``generator`` by per-rollout keyed sampling; ``synced`` keeps the forward passes of all
    ranks of a sharded policy in step (module docstring).
    """
    device = prompt_tokens.device
    counts = num_samples_per_prompt.to(device=device, dtype=torch.long)
    group_index = torch.repeat_interleave(torch.arange(prompt_tokens.shape[0], device=device), counts)
    rollouts = group_index.numel()
    pad_id, eos_id = tokenizer.pad_id, tokenizer.eos_id
    if row_seeds is not None and row_seeds.numel() != rollouts:
        raise ValueError(f"row_seeds has {row_seeds.numel()} keys for {rollouts} rollouts.")
    if max_new_tokens == 0 or (rollouts == 0 and not synced):
        empty = torch.zeros(rollouts, 0, dtype=torch.long, device=device)
        return empty, empty.bool(), group_index
    idle = rollouts == 0  # synced, nothing to generate here: the same forward passes on one dummy row
    if idle:
        prompt_tokens = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
        prompt_mask = torch.ones(1, 1, dtype=torch.bool, device=device)
        counts = torch.ones(1, dtype=torch.long, device=device)
        work_index = torch.zeros(1, dtype=torch.long, device=device)
    else:
        work_index = group_index
    rows = work_index.numel()
    mask = prompt_mask.bool()[work_index]
    if use_cache and hasattr(policy, "select_cache"):
        used = torch.nonzero(counts > 0).squeeze(-1)  # prefill each prompt once, expand the cache to rollouts
        logits, cache = policy(prompt_tokens[used], attention_mask=prompt_mask[used], use_cache=True)
        to_row = torch.cumsum(counts > 0, 0)[work_index] - 1
        last, cache = logits[to_row, -1], policy.select_cache(cache, to_row)
    elif use_cache:
        logits, cache = policy(prompt_tokens[work_index], attention_mask=mask, use_cache=True)
        last = logits[:, -1]
    else:
        sequence = prompt_tokens[work_index]
        last = policy(sequence, attention_mask=mask)[0][:, -1]
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    generated = torch.zeros(rows, max_new_tokens, dtype=torch.bool, device=device)
    finished = torch.full((rows,), idle, dtype=torch.bool, device=device)
    length = max_new_tokens
    for step in range(max_new_tokens):
        if bool(finished.all()):  # only reached when synced: this rank is done, the others are not
            token = torch.full_like(finished, pad_id, dtype=torch.long)
        else:
            token = torch.where(finished, torch.full_like(finished, pad_id, dtype=torch.long),
                                sample_tokens(last, temperature, generator, row_seeds, step))
            tokens[:, step], generated[:, step] = token, ~finished
            if eos_id is not None:
                finished = finished | (token == eos_id)
            if bool(finished.all()):
                length = step + 1
        if step == max_new_tokens - 1:
            break
        active = not bool(finished.all())
        if not (any_rank_active(active, device) if synced else active):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if use_cache:
            logits, cache = policy(token[:, None], attention_mask=mask, past_key_values=cache, use_cache=True)
        else:
            sequence = torch.cat([sequence, token[:, None]], dim=1)
            logits = policy(sequence, attention_mask=mask)[0]
        last = logits[:, -1]
    if idle:
        empty = torch.zeros(0, 0, dtype=torch.long, device=device)
        return empty, empty.bool(), group_index
    return tokens[:, :length], generated[:, :length], group_index


class RolloutEngine:
    """How GRPO obtains rollouts. Subclass for a faster engine (e.g. vLLM with weight sync each step).

    GRPO passes ``row_seeds`` only with ``rollout_seeding: example`` and ``synced`` only when the policy is sharded,
    so an engine that supports neither keeps the four-argument signature plus ``generator``.
    """

    def generate(self, policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens: int,
                 temperature: float, tokenizer, generator=None, row_seeds=None, synced: bool = False):
        """Same arguments and return value as `sample_completions`."""
        raise NotImplementedError


class KVCacheSampler(RolloutEngine):
    """The default engine: `sample_completions` (batched, KV cache, one prefill per prompt)."""

    def generate(self, policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens, temperature,
                 tokenizer, generator=None, row_seeds=None, synced=False):
        return sample_completions(policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens,
                                  temperature, tokenizer, generator, row_seeds=row_seeds, synced=synced)


class TransformersGenerate(RolloutEngine):
    """transformers' ``generate`` on an `HFCausalLM` policy (the reference for the speed benchmark).

    Uses transformers' own sampler and RNG (the global torch RNG; ``generator`` is ignored), so its rollouts are
    not bit-identical to `KVCacheSampler`'s, and it cannot sample with per-rollout seeds. Sharded (``synced``), it
    passes ``synced_gpus=True`` (a rank without rollouts generates for one dummy row).
    """

    @torch.no_grad()
    def generate(self, policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens, temperature,
                 tokenizer, generator=None, row_seeds=None, synced=False):
        if row_seeds is not None:
            raise UserInputError("TransformersGenerate samples with transformers' own RNG and cannot use per-rollout "
                                 "seeds: set rollout_seeding: batch or use rollout_engine: KVCacheSampler.")
        model = getattr(policy, "model", policy)
        counts = num_samples_per_prompt.to(prompt_tokens.device, torch.long)
        group_index = torch.repeat_interleave(torch.arange(prompt_tokens.shape[0], device=counts.device), counts)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 \
            else {"do_sample": False}
        rows = group_index if group_index.numel() or not synced else torch.zeros(1, dtype=torch.long,
                                                                              device=counts.device)
        if synced and prompt_tokens.shape[0] == 0:
            raise UserInputError("TransformersGenerate (sharded) got a batch without prompts.")
        if synced:
            sampling["synced_gpus"] = True
        out = model.generate(input_ids=prompt_tokens[rows], attention_mask=prompt_mask[rows].long(),
                             max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_id,
                             eos_token_id=tokenizer.eos_id, **sampling)
        tokens = out[:len(group_index), prompt_tokens.shape[1]:]
        generated = torch.ones_like(tokens, dtype=torch.bool)
        if tokenizer.eos_id is not None:  # mask everything after the first EOS
            is_eos = tokens == tokenizer.eos_id
            generated = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0
        return tokens.masked_fill(~generated, tokenizer.pad_id), generated, group_index
