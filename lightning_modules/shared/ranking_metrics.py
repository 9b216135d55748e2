"""Full-ranking recommendation metrics, vectorised in torch and exact under DDP.

Two protocols, both over *all* items with the user's known items masked by the caller (set to -inf):

* leave-one-out (sequential recommenders): one held-out target per user. The 0-based rank of the target is
  the number of items scoring strictly higher (``>``: ties resolved in the target's favour, the optimistic
  rule; no sort is needed). HR@K = Recall@K = 1[rank < K], NDCG@K = 1[rank < K] / log2(rank + 2).
* top-K sets (graph collaborative filtering): several held-out items per user. One ``topk`` of the largest K
  serves every cutoff. Recall@K = |hits in top K| / |test items|, NDCG@K = DCG@K / IDCG@min(|test|, K)
  (the SELFRec / LightGCN definition); users without test items are skipped.

The metrics accumulate sums and counts (``dist_reduce_fx="sum"``), so the DDP value equals the
single-process one. The optional sampled protocol of the original SASRec paper (target ranked against
100 sampled negatives) is `sampled_ranks`; its numbers are not comparable with full ranking.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_modules.shared.errors import UserInputError


def leave_one_out_ranks(scores: Tensor, target: Tensor) -> Tensor:
    """0-based rank of ``target[b]`` among ``scores[b]`` (B, N): how many items score strictly higher."""
    target_scores = scores.gather(1, target.view(-1, 1))
    return (scores > target_scores).sum(1)


def sampled_ranks(target_scores: Tensor, negative_scores: Tensor) -> Tensor:
    """0-based rank of each target (B,) among its sampled negatives (B, M) (the original SASRec protocol)."""
    return (negative_scores > target_scores.view(-1, 1)).sum(1)


def mask_known_items(scores: Tensor, known_items: Tensor, padding_value: int | None = 0) -> Tensor:
    """Set the scores of each row's known items (B, L) to -inf, in place; ``padding_value`` entries are ignored.

    The padding column itself (item 0 of sequential data) should be masked by the caller if it is scored.
    """
    if padding_value is None:
        scores.scatter_(1, known_items, float("-inf"))
        return scores
    valid = known_items != padding_value
    rows = torch.arange(len(known_items), device=scores.device).view(-1, 1).expand_as(known_items)
    scores[rows[valid], known_items[valid]] = float("-inf")
    return scores


def _check_cutoffs(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise UserInputError(f"ranking cutoffs {ks} must be positive integers, e.g. [10, 20].")
    return tuple(sorted(set(ks)))


class _CutoffMetrics(Metric):
    """Per-cutoff sums of Recall@K and NDCG@K over users, and the user count (all summed across processes)."""

    full_state_update = False

    def __init__(self, ks: Sequence[int] = (10, 20)) -> None:
        super().__init__()
        self.ks = _check_cutoffs(ks)
        self.add_state("recall", torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("ndcg", torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def compute(self) -> dict[str, Tensor]:
        count = self.count.clamp_min(1)
        out = {}
        for i, k in enumerate(self.ks):
            out[f"recall@{k}"] = (self.recall[i] / count).float()
            out[f"ndcg@{k}"] = (self.ndcg[i] / count).float()
        return out


class LeaveOneOutMetrics(_CutoffMetrics):
    """Recall@K (= HR@K) and NDCG@K from leave-one-out ranks; ``compute()`` returns ``{"recall@10": ...}``."""

    def update(self, ranks: Tensor) -> None:
        cutoffs = torch.tensor(self.ks, device=ranks.device).view(-1, 1)
        inside = (ranks.view(1, -1) < cutoffs).double()
        gain = 1.0 / torch.log2(ranks.double() + 2.0)
        self.recall += inside.sum(1)
        self.ndcg += (inside * gain.view(1, -1)).sum(1)
        self.count += ranks.numel()


class TopKMetrics(_CutoffMetrics):
    """Recall@K and NDCG@K for several held-out items per user, from masked scores and a test-item mask."""

    def update(self, scores: Tensor, test_items: Tensor) -> None:
        """``scores`` (B, N) with known items already at -inf; ``test_items`` (B, N) bool."""
        n_test = test_items.sum(1)
        users = n_test > 0
        scores, test_items, n_test = scores[users], test_items[users], n_test[users]
        k_max = min(self.ks[-1], scores.shape[1])
        top = scores.topk(k_max, dim=1).indices
        hit = test_items.gather(1, top).double()                                   # (B, k_max)
        discount = 1.0 / torch.log2(torch.arange(2, k_max + 2, device=scores.device, dtype=torch.float64))
        dcg = (hit * discount).cumsum(1)                                          # DCG@k for k = 1..k_max
        ideal = discount.cumsum(0)                                                # IDCG@k
        found = hit.cumsum(1)
        for i, k in enumerate(self.ks):
            k = min(k, k_max)
            self.recall[i] += (found[:, k - 1] / n_test).sum()
            self.ndcg[i] += (dcg[:, k - 1] / ideal[(n_test.clamp(max=k) - 1)]).sum()
        self.count += len(n_test)
