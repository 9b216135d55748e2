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
"""
from __future__ import annotations

import torch


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `logits` [R, V]: greedy at temperature 0, else a draw from softmax(logits / T)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def sample_completions(policy, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor,
                       num_samples_per_prompt: torch.Tensor, max_new_tokens: int, temperature: float, tokenizer,
                       generator: torch.Generator | None = None, use_cache: bool = True,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample completions for LEFT-padded prompts; see the module docstring for the returned tensors.

    ``tokenizer`` supplies ``eos_id`` (None: never stop early) and ``pad_id``. ``use_cache=False`` recomputes the
    whole sequence every step (the reference the KV-cache path is tested against).
    """
    device = prompt_tokens.device
    counts = num_samples_per_prompt.to(device=device, dtype=torch.long)
    group_index = torch.repeat_interleave(torch.arange(prompt_tokens.shape[0], device=device), counts)
    rollouts = group_index.numel()
    pad_id, eos_id = tokenizer.pad_id, tokenizer.eos_id
    if rollouts == 0 or max_new_tokens == 0:
        empty = torch.zeros(rollouts, 0, dtype=torch.long, device=device)
        return empty, empty.bool(), group_index
    mask = prompt_mask.bool()[group_index]
    if use_cache and hasattr(policy, "select_cache"):
        used = torch.nonzero(counts > 0).squeeze(-1)  # prefill each prompt once, expand the cache to rollouts
        logits, cache = policy(prompt_tokens[used], attention_mask=prompt_mask[used], use_cache=True)
        to_row = torch.cumsum(counts > 0, 0)[group_index] - 1
        last, cache = logits[to_row, -1], policy.select_cache(cache, to_row)
    elif use_cache:
        logits, cache = policy(prompt_tokens[group_index], attention_mask=mask, use_cache=True)
        last = logits[:, -1]
    else:
        sequence = prompt_tokens[group_index]
        last = policy(sequence, attention_mask=mask)[0][:, -1]
    tokens = torch.full((rollouts, max_new_tokens), pad_id, dtype=torch.long, device=device)
    generated = torch.zeros(rollouts, max_new_tokens, dtype=torch.bool, device=device)
    finished = torch.zeros(rollouts, dtype=torch.bool, device=device)
    length = max_new_tokens
    for step in range(max_new_tokens):
        token = torch.where(finished, torch.full_like(finished, pad_id, dtype=torch.long),
                            sample_tokens(last, temperature, generator))
        tokens[:, step], generated[:, step] = token, ~finished
        if eos_id is not None:
            finished = finished | (token == eos_id)
        if step == max_new_tokens - 1:
            break
        if bool(finished.all()):
            length = step + 1
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if use_cache:
            logits, cache = policy(token[:, None], attention_mask=mask, past_key_values=cache, use_cache=True)
        else:
            sequence = torch.cat([sequence, token[:, None]], dim=1)
            logits = policy(sequence, attention_mask=mask)[0]
        last = logits[:, -1]
    return tokens[:, :length], generated[:, :length], group_index


class RolloutEngine:
    """How GRPO obtains rollouts. Subclass for a faster engine (e.g. vLLM with weight sync each step)."""

    def generate(self, policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens: int,
                 temperature: float, tokenizer, generator=None):
        """Same arguments and return value as `sample_completions`."""
        raise NotImplementedError


class KVCacheSampler(RolloutEngine):
    """The default engine: `sample_completions` (batched, KV cache, one prefill per prompt)."""

    def generate(self, policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens, temperature,
                 tokenizer, generator=None):
        return sample_completions(policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens,
                                  temperature, tokenizer, generator)


class TransformersGenerate(RolloutEngine):
    """transformers' ``generate`` on an `HFCausalLM` policy (the reference for the speed benchmark).

    Uses transformers' own sampler and RNG (the global torch RNG; ``generator`` is ignored), so its rollouts are
    not bit-identical to `KVCacheSampler`'s.
    """

    @torch.no_grad()
    def generate(self, policy, prompt_tokens, prompt_mask, num_samples_per_prompt, max_new_tokens, temperature,
                 tokenizer, generator=None):
        model = getattr(policy, "model", policy)
        counts = num_samples_per_prompt.to(prompt_tokens.device, torch.long)
        group_index = torch.repeat_interleave(torch.arange(prompt_tokens.shape[0], device=counts.device), counts)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 \
            else {"do_sample": False}
        out = model.generate(input_ids=prompt_tokens[group_index], attention_mask=prompt_mask[group_index].long(),
                             max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_id,
                             eos_token_id=tokenizer.eos_id, **sampling)
        tokens = out[:, prompt_tokens.shape[1]:]
        generated = torch.ones_like(tokens, dtype=torch.bool)
        if tokenizer.eos_id is not None:  # mask everything after the first EOS
            is_eos = tokens == tokenizer.eos_id
            generated = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0
        return tokens.masked_fill(~generated, tokenizer.pad_id), generated, group_index
