"""Chosen-token log-probs and entropies of a causal LM's completions without a full-vocabulary log-softmax.

Used by GRPO's update (`lightning_modules.rlvr.grpo`); kept apart because it is a self-contained numerical kernel (a
custom autograd function) with its own equality tests against ``torch.log_softmax``. At paper sizes (vocabulary
151,936, 4,096 tokens) a full fp32 log-softmax of the logits is tens of GB; here only the logits exist at full size.
"""
from __future__ import annotations

import torch
from torch import nn


LOGPROB_CHUNK_ELEMENTS = 2 ** 24  # fp32 elements of one [rows, positions, vocab] chunk (64 MiB)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Chosen-token log-probs (and entropies) of next-token ``logits`` [R, L, V] for positions ``start``..L-2,
    computed chunk by chunk in fp32 without a full-size log-softmax; backward writes the logits' gradient
    (softmax-based, chunk by chunk) into ONE full-size buffer."""

    @staticmethod
    def forward(ctx, logits, targets, start: int, temperature: float, with_entropy: bool, chunk_elements: int):
        rows, positions, vocab = targets.shape[0], targets.shape[1], logits.shape[-1]
        step = max(1, int(chunk_elements) // max(1, rows * vocab))
        token_logp = torch.empty(rows, positions, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(token_logp)
        entropy = torch.empty_like(token_logp) if with_entropy else None
        for s in range(0, positions, step):
            e = min(positions, s + step)
            z = logits[:, start + s:start + e].float() / temperature
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[:, s:e] = chunk_lse
            token_logp[:, s:e] = z.gather(-1, targets[:, s:e, None]).squeeze(-1) - chunk_lse
            if with_entropy:
                z -= chunk_lse[..., None]  # log-probs, in place (two chunk-size buffers at a time)
                entropy[:, s:e] = -(z.exp().mul_(z)).sum(-1)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.start, ctx.temperature, ctx.step = start, temperature, step
        ctx.set_materialize_grads(False)
        if entropy is None:
            return token_logp, token_logp.new_zeros(0)
        return token_logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        if entropy is None:
            grad_entropy = None
        positions = targets.shape[1]
        for s in range(0, positions, ctx.step):
            e = min(positions, s + ctx.step)
            logp = logits[:, ctx.start + s:ctx.start + e].float() / ctx.temperature
            logp -= lse[:, s:e, None]
            g = logp.exp()  # softmax; then, in place: dL/dz = -p (g_logp + g_H (log p + H)) + onehot(y) g_logp
            if grad_entropy is not None:  # dH / dz = -p (log p + H)
                logp += entropy[:, s:e, None]
                logp *= grad_entropy[:, s:e, None]
                if grad_logp is not None:
                    logp += grad_logp[:, s:e, None]
                g *= logp
            elif grad_logp is not None:
                g *= grad_logp[:, s:e, None]
            else:
                g.zero_()
            g.neg_()
            if grad_logp is not None:  # d logp_y / dz = onehot(y) - softmax(z)
                g.scatter_add_(-1, targets[:, s:e, None], grad_logp[:, s:e, None])
            grad[:, ctx.start + s:ctx.start + e] = g.div_(ctx.temperature)
        return grad, None, None, None, None, None


def completion_logprobs(policy: nn.Module, sequences: torch.Tensor, mask: torch.Tensor, prompt_length: int,
                        temperature: float, with_entropy: bool = False, entropy_grad: bool = False,
                        chunk_elements: int = LOGPROB_CHUNK_ELEMENTS):
    """Log-probs [R, T] of the completion tokens (positions >= prompt_length) under `policy` at `temperature`,
    and (``with_entropy``) the per-token entropy, differentiable only if ``entropy_grad``.

    Memory: the policy's logits are the only full-vocabulary tensor of the forward pass. The chosen token's
    log-prob is its logit minus the logsumexp, and the entropy is computed, in fp32 chunks of positions holding
    at most ``chunk_elements`` vocabulary entries; backward rebuilds each chunk's softmax and writes the logits'
    gradient into one buffer. No full-size fp32 copy, log-softmax or softmax of the logits is built (values and
    gradients equal the direct ``log_softmax`` computation up to float rounding).
    """
    logits = policy(sequences, attention_mask=mask)[0]
    targets = sequences[:, prompt_length:]
    token_logp, entropy = _ChunkedTokenLogprobs.apply(logits, targets, prompt_length - 1, float(temperature),
                                                      with_entropy, chunk_elements)
    if not with_entropy:
        return token_logp, None
    return token_logp, entropy if entropy_grad and torch.is_grad_enabled() else entropy.detach()
