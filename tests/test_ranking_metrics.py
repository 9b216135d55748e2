"""Ranking metrics against direct formulas on small hand-made cases."""
from __future__ import annotations

import math

import pytest
import torch

from lightning_modules.shared.errors import UserInputError
from lightning_modules.shared.ranking_metrics import (LeaveOneOutMetrics, TopKMetrics, leave_one_out_ranks,
                                               mask_known_items, sampled_ranks)


def test_leave_one_out_ranks_and_optimistic_ties():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7], [1.0, 1.0, 0.0, 0.0]])
    ranks = leave_one_out_ranks(scores, torch.tensor([2, 1]))
    assert ranks.tolist() == [2, 0]  # 0.5 is beaten by 0.9 and 0.7; a tie counts in the target's favour


def test_sampled_ranks():
    assert sampled_ranks(torch.tensor([0.5]), torch.tensor([[0.1, 0.6, 0.7]])).tolist() == [2]


def test_mask_known_items_ignores_padding():
    scores = torch.zeros(2, 5)
    mask_known_items(scores, torch.tensor([[0, 0, 3], [1, 2, 0]]))
    assert torch.isinf(scores).nonzero().tolist() == [[0, 3], [1, 1], [1, 2]]


def test_leave_one_out_metrics_direct_formula():
    metric = LeaveOneOutMetrics(ks=(1, 3))
    metric.update(torch.tensor([0, 2]))
    metric.update(torch.tensor([5]))
    out = metric.compute()
    assert out["recall@1"].item() == pytest.approx(1 / 3)
    assert out["recall@3"].item() == pytest.approx(2 / 3)
    assert out["ndcg@1"].item() == pytest.approx(1 / 3)
    assert out["ndcg@3"].item() == pytest.approx((1 + 1 / math.log2(4)) / 3)


def test_topk_metrics_direct_formula():
    # user 0: test items {1, 3}; ranking 3, 0, 1, 2 -> hits at positions 1 and 3
    # user 1: test item {2}; ranking 2 first -> recall 1, ndcg 1; user 2: no test item -> skipped
    scores = torch.tensor([[0.5, 0.2, 0.1, 0.9], [0.0, 0.1, 0.8, 0.3], [0.1, 0.2, 0.3, 0.4]])
    test = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    metric = TopKMetrics(ks=(2, 3))
    metric.update(scores, test)
    out = metric.compute()
    assert out["recall@2"].item() == pytest.approx((0.5 + 1.0) / 2)
    assert out["recall@3"].item() == pytest.approx((1.0 + 1.0) / 2)
    idcg2 = 1 + 1 / math.log2(3)
    assert out["ndcg@2"].item() == pytest.approx((1 / idcg2 + 1.0) / 2)
    assert out["ndcg@3"].item() == pytest.approx(((1 + 1 / math.log2(4)) / idcg2 + 1.0) / 2)


def test_topk_matches_a_sort_based_reference_on_random_data():
    torch.manual_seed(0)
    scores, test = torch.randn(50, 30), torch.rand(50, 30) < 0.1
    metric = TopKMetrics(ks=(5, 10))
    metric.update(scores[:20], test[:20])
    metric.update(scores[20:], test[20:])  # accumulation over batches
    out = metric.compute()
    recalls, ndcgs = [], []
    for s, t in zip(scores, test):
        if t.sum() == 0:
            continue
        order = s.argsort(descending=True)[:10]
        hits = t[order].float()
        recalls.append(hits.sum() / t.sum())
        dcg = sum(h / math.log2(i + 2) for i, h in enumerate(hits.tolist()))
        idcg = sum(1 / math.log2(i + 2) for i in range(min(int(t.sum()), 10)))
        ndcgs.append(dcg / idcg)
    assert out["recall@10"].item() == pytest.approx(float(torch.stack(recalls).mean()), rel=1e-5)
    assert out["ndcg@10"].item() == pytest.approx(sum(ndcgs) / len(ndcgs), rel=1e-5)


def test_bad_cutoffs_are_refused():
    with pytest.raises(UserInputError, match="cutoffs"):
        LeaveOneOutMetrics(ks=(0, 10))
