"""Set-level evaluation of multi-answer RL: pass@i, coverage, duplicates, set Brier, ECE, tokens per answer.

Paper: "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models" (Puri et al., arXiv
2603.24844); the protocol is the official ``eval/check_functions.py`` (github.com/ishapuri/multi_answer_rl), read
top to bottom in the docstring of `lightning_modules.multi_answer_rl.multi_answer_rl`, whose `MultiAnswerGRPO` logs
these metrics. `AnswerSetAccumulator` sums them over batches (and DDP ranks, through `merge`).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from lightning_modules.rlvr.answers import answer_key, is_correct
from lightning_modules.shared.errors import UserInputError
from lightning_modules.rlvr.grpo import pass_at_k  # the one unbiased estimator of the collection (Chen et al. 2021)
from lightning_modules.multi_answer_rl.multi_answer_protocol import Style, parse_completion


def set_brier(confidences: torch.Tensor, correct: torch.Tensor) -> float:
    """Evaluation set Brier: mean over rows of SUM_i (p_i - y_i)^2 (``eval/check_functions.py``); p clipped.

    torchmetrics has no Brier score; this is K times the mean squared error over all (set, candidate) pairs.
    """
    if confidences.numel() == 0:
        return float("nan")
    p = confidences.double().clamp(0.0, 1.0)
    return float(((p - correct.double()) ** 2).sum(-1).mean())


def expected_calibration_error(confidences: torch.Tensor, correct: torch.Tensor, num_bins: int = 10) -> float:
    """ECE with equal-width bins on [0, 1] (p = 1 falls in the last bin): sum_b n_b / N |acc_b - conf_b|.

    torchmetrics' ``BinaryCalibrationError(n_bins=10)`` agrees below 1 but gives p = 1 a bin of its own, which
    changes the value when stated confidences of exactly 1 share the top bin with under-confident ones.
    """
    p = confidences.double().flatten().clamp(0.0, 1.0)
    y = correct.double().flatten()
    if p.numel() == 0:
        return float("nan")
    bins = (p * num_bins).long().clamp(max=num_bins - 1)
    conf_sum = torch.zeros(num_bins, dtype=torch.double).index_add_(0, bins, p)
    acc_sum = torch.zeros(num_bins, dtype=torch.double).index_add_(0, bins, y)
    return float((conf_sum - acc_sum).abs().sum() / p.numel())


def _nanmean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def set_rows(candidates: Sequence[Sequence[str]], golds: Sequence[Sequence[str]], num_candidates: int,
             ranked: bool = True) -> dict[str, list[float]]:
    """Per-set values (one entry per candidate list; [] = nothing usable, e.g. a malformed generation).

    ``ranked=True`` (one multi-answer generation): pass@i = any of the first i listed candidates is correct
    (order them by confidence beforehand for RLCR). ``ranked=False`` (K independent single-answer samples):
    pass@i = unbiased estimator over the K samples. Coverage = |distinct correct| / min(K, |distinct gold|);
    duplicate rate = (n - n_distinct) / n (NaN for n = 0: excluded from means)."""
    out: dict[str, list[float]] = {"coverage": [], "distinct_correct": [], "duplicate_rate": []}
    for i in range(1, num_candidates + 1):
        out[f"pass@{i}"] = []
    for cands, gold in zip(candidates, golds):
        correct = [is_correct(c, gold) for c in cands]
        keys = [answer_key(c) for c in cands]
        distinct_correct = len({k for k, ok in zip(keys, correct) if ok})
        gold_distinct = len({answer_key(g) for g in gold})
        out["coverage"].append(distinct_correct / max(1, min(num_candidates, gold_distinct)))
        out["distinct_correct"].append(float(distinct_correct))
        out["duplicate_rate"].append((len(keys) - len(set(keys))) / len(keys) if keys else float("nan"))
        for i in range(1, num_candidates + 1):
            if ranked:
                out[f"pass@{i}"].append(float(any(correct[:i])))
            else:
                out[f"pass@{i}"].append(float(pass_at_k(num_candidates, sum(correct), i)))
    return out


class AnswerSetAccumulator:
    """Accumulates set metrics over batches (sums and counts, NaN skipped; ECE bins; per-tier coverage).

    ``add_multi`` takes one multi-answer generation per set, ``add_single`` K single-answer samples per set.
    ``compute()`` returns the means plus ``set_brier`` / ``ece`` / ``confidence_sum`` when confidences exist.
    """

    def __init__(self, num_candidates: int, with_confidence: bool = False, style: Style = "compact",
                 rank_by_confidence: bool = False, require_think: bool = True, require_analysis: bool = True,
                 ece_bins: int = 10) -> None:
        self.k, self.with_confidence, self.style = num_candidates, with_confidence, style
        self.rank_by_confidence, self.require_think, self.require_analysis = rank_by_confidence, require_think, \
            require_analysis
        self.ece_bins = ece_bins
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.confidences: list[list[float]] = []
        self.correct: list[list[float]] = []

    def _add(self, name: str, values: Sequence[float]) -> None:
        for v in values:
            if not math.isnan(v):
                self.sums[name] = self.sums.get(name, 0.0) + float(v)
                self.counts[name] = self.counts.get(name, 0) + 1
        self.counts.setdefault(name, 0)

    def _add_rows(self, rows: dict[str, list[float]], tiers: Sequence[int] | None) -> None:
        for name, values in rows.items():
            self._add(name, values)
        if tiers is not None:
            for tier, value in zip(tiers, rows["coverage"]):
                self._add(f"coverage_tier{int(tier)}", [value])

    def add_multi(self, completions: Sequence[str], golds: Sequence[Sequence[str]],
                  completion_tokens: Sequence[int] | None = None, tiers: Sequence[int] | None = None) -> None:
        candidates, formats, uniques = [], [], []
        for text, gold in zip(completions, golds):
            p = parse_completion(text, self.k, self.with_confidence, self.style, self.require_think,
                                 self.require_analysis)
            formats.append(float(p.format_ok))
            uniques.append(float(p.format_ok and p.unique))
            if not p.format_ok:
                candidates.append([])
                continue
            order = list(range(self.k))
            if self.rank_by_confidence and p.confidences is not None:  # stable: ties keep the listed order
                order.sort(key=lambda i: -min(1.0, max(0.0, p.confidences[i])))
            candidates.append([p.answers[i] for i in order])
            if self.with_confidence and p.confidences is not None:
                self.confidences.append([min(1.0, max(0.0, c)) for c in p.confidences])
                self.correct.append([float(is_correct(a, gold)) for a in p.answers])
                self._add("confidence_sum", [sum(p.confidences)])
        self._add_rows(set_rows(candidates, golds, self.k, ranked=True), tiers)
        self._add("format", formats)
        self._add("unique", uniques)
        if completion_tokens is not None:
            self._add("tokens_per_answer", [t / self.k for t in completion_tokens])
            self._add("tokens_per_set", [float(t) for t in completion_tokens])

    def add_single(self, samples: Sequence[Sequence[str]], golds: Sequence[Sequence[str]],
                   completion_tokens: Sequence[Sequence[int]] | None = None,
                   tiers: Sequence[int] | None = None) -> None:
        if any(len(s) != self.k for s in samples):
            raise UserInputError(f"add_single needs exactly K={self.k} samples per set.")
        candidates, formats = [], []
        for group in samples:
            parsed = [parse_completion(c, 1, False, self.style, self.require_think, self.require_analysis)
                      for c in group]
            formats.extend(float(p.format_ok) for p in parsed)
            candidates.append([p.answers[0] for p in parsed if p.format_ok])
        self._add_rows(set_rows(candidates, golds, self.k, ranked=False), tiers)
        self._add("format", formats)
        if completion_tokens is not None:
            self._add("tokens_per_answer", [sum(t) / self.k for t in completion_tokens])
            self._add("tokens_per_set", [float(sum(t)) for t in completion_tokens])

    def merge(self, other: "AnswerSetAccumulator") -> None:
        """Add another accumulator's sets (e.g. from another DDP rank)."""
        for name, n in other.counts.items():
            self.sums[name] = self.sums.get(name, 0.0) + other.sums.get(name, 0.0)
            self.counts[name] = self.counts.get(name, 0) + n
        self.confidences += other.confidences
        self.correct += other.correct

    def compute(self) -> dict[str, float]:
        out = {name: (self.sums.get(name, 0.0) / n if n else float("nan")) for name, n in self.counts.items()}
        if "distinct_correct" in out and "tokens_per_set" in out:
            found = out["distinct_correct"]
            out["tokens_per_correct_answer"] = out["tokens_per_set"] / found if found > 0 else float("nan")
        if self.with_confidence:
            conf = torch.tensor(self.confidences, dtype=torch.double).reshape(-1, self.k)
            corr = torch.tensor(self.correct, dtype=torch.double).reshape(-1, self.k)
            out["set_brier"] = set_brier(conf, corr)
            out["ece"] = expected_calibration_error(conf, corr, self.ece_bins)
        return out
