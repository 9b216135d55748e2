"""Multi-answer RL: K candidates (with confidences) in one generation, rewarded as a set.

Paper: "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models" (Puri, Damani, Shenfeld,
Ghassemi, Andreas, Kim; arXiv 2603.24844; ICML 2026 poster "Escaping the Mode: Multi-Answer Reinforcement
Learning in LMs"). Official code: github.com/ishapuri/multi_answer_rl (`reward_fns.py`, `eval/check_functions.py`).

Method. Instead of sampling one answer K times, the policy writes K distinct candidates (and, for Multi-RLCR,
a confidence p_i for each) in ONE generation and is trained with GRPO on a set-level reward:

* format f in {0, 1}: every candidate (and confidence) tag is present and each confidence is a float in [0, 1];
* uniqueness u: the K answers differ after ``strip().lower()`` (surface strings only, as in the code);
* accuracy: zero unless the gate holds (f, times u where uniqueness is enforced, times the Sum p <= 1
  constraint for RLCR, see below); then either **any-correct** ``1[exists i: a_i in gold]`` (the code's default,
  mode ``rlvr_any``; pass@K within one generation) or **count** ``|distinct correct| / K`` (the code's
  ``more_than_one_correctness_point``, mode ``rlvr_count``);
* Multi-Brier (RLCR only): ``1 - (1/K) sum_i (y_i - p_i)^2`` with ``p_i`` clipped to [0, 1], zero unless f = 1 and
  the constraint c = (K unique answers) and (Sum p_i <= 1) holds (it is not clipped: violating it zeroes the term);
* total R = w_f f + w_acc acc (+ w_b brier), weights 0.5 each as in the released configs; GRPO then uses
  A = R - mean_group (no std scaling, ``scale_rewards="none"`` in their arguments.py).

Evaluation (``eval/check_functions.py``): pass@i within one generation (any of the top-i candidates correct;
RLCR ranks by confidence, RLVR keeps the listed order), set Brier = mean over examples of the SUM over candidates
of (p_i - y_i)^2 (training uses 1 - mean; never mix the two), ECE with 10 equal-width bins over all
(p_i, y_i) pairs, completion lengths. The single-answer baseline is sampled K times and scored with the same
set metrics (its pass@i uses the unbiased estimator of Chen et al. over the K samples).
Extra metrics of the method card's toy: coverage = |distinct correct| / min(K, |gold|), duplicate rate =
(candidates - distinct candidates) / candidates, tokens per answer and tokens per distinct correct answer.

`MultiAnswerReward` plugs into `lightning_modules.grpo.GRPO` as its ``reward``; `MultiAnswerGRPO` is that GRPO with
the set-level evaluation above (for the multi-answer policy and for the single-answer baseline sampled K times).

Two output styles (``style``):

* ``tags`` (the official format): ``<think>..</think> <answer1>a</answer1> <confidence1>p</confidence1> ...
  <analysis>..</analysis>``; the parser also accepts all answers first, then all confidences. Malformed output
  is handled as in ``reward_fns.py``: the format check only tests that every tag occurs (``<think>`` and
  ``</think>`` present, K numbered answer tags, for RLCR K confidence tags and ``<analysis>``); candidates are
  taken at their first ordered occurrence; a non-float or out-of-range confidence fails the format; K = 1 uses
  the unnumbered ``<answer>``/``<confidence>`` tags.
* ``compact`` (this repo's toy format for a from-scratch character-level GPT, from the method card's CPU
  experiment): ``a1@c1;a2@c2;a3@c3`` where ``c_i`` is ONE digit and ``p_i = c_i / 10``; without confidences
  ``a1;a2;a3``. Exactly K non-empty fields are required (more or fewer is malformed); no think/analysis parts.

Deviations / reconstructions (all documented choices):

* Answer matching is the official ``normalize_answer`` exact match (lowercase, strip punctuation and articles,
  collapse whitespace) against any gold string, plus numeric equality when both sides parse as numbers
  ("06" == "6"). ``math_verify`` (used by the code for math sources) is not a dependency here.
* Accuracy gating for RLCR follows the code read (``reward_fns.py`` @3f6b41a): it is gated by the whole response
  constraint (uniqueness AND Sum p <= 1); ``sum_constraint_gates_accuracy=False`` gates by uniqueness only, as
  the method card's summary words it. For RLVR uniqueness is not enforced unless ``enforce_uniqueness=True``.
* The code takes RLCR accuracy candidates at the LAST occurrence of each answer tag but the Brier/format at the
  first ordered occurrence; here one parse (first ordered occurrence) serves all terms.
* In the toy, the Multi-RLVR policies also write confidences (``with_confidence=True``, not rewarded) so that the
  set Brier of RLVR and RLCR can be compared, as the method card's experiment asks.
* The adaptive Brier-weight ramp (``enable_adaptive_brier``, off in the released configs) is not implemented.
* ``accuracy: count`` with ``mode: rlcr`` (RLCR with the count accuracy) is offered as an option; the released
  configs use any-correct for both variants.
* The paper's diversity metric was not visible; "tokens per answer" here = completion tokens (EOS included) / K
  per set, and "tokens per correct answer" = tokens per set / distinct correct answers per set.
* GRPO's training logs ``train/solve_*`` count a rollout as correct when reward > 0.5; for RLCR a well-formed set
  with no correct candidate can exceed 0.5, so read ``train/reward_correct`` (any candidate correct) instead.
"""
from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from lightning_modules.errors import UserInputError, check_range
from lightning_modules.grpo import GRPO, RewardFunction, decode_completions

Mode = Literal["rlvr_any", "rlvr_count", "rlcr"]
Style = Literal["compact", "tags"]
MODES = ("rlvr_any", "rlvr_count", "rlcr")
STYLES = ("compact", "tags")


# --------------------------------------------------------------------------------------------- matching
def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation of the official code: lowercase, drop punctuation and articles, collapse spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _as_number(text: str) -> float | None:
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answer_key(text: str) -> str:
    """Canonical form used to match answers and to count distinct answers (numbers: their value)."""
    number = _as_number(text)
    if number is not None:
        return repr(int(number)) if number == int(number) else repr(number)
    return normalize_answer(text)


def is_correct(candidate: str, gold: Sequence[str]) -> bool:
    """True if the candidate matches any gold string (normalised exact match or equal numbers); '' never does."""
    if not candidate or not candidate.strip():
        return False
    key = answer_key(candidate)
    return bool(key) and any(key == answer_key(g) for g in gold)


# --------------------------------------------------------------------------------------------- parser
@dataclass(frozen=True)
class ParsedCompletion:
    """One parsed generation. ``answers``/``confidences`` are None when they could not be extracted.

    ``format_ok`` is the format reward f; ``confidences`` are the raw floats (not clipped; a value outside [0, 1]
    makes the format fail, as in the code)."""
    answers: list[str] | None
    confidences: list[float] | None
    format_ok: bool

    @property
    def unique(self) -> bool:
        """Uniqueness as in the code: all answers distinct after strip().lower() (surface strings only)."""
        if not self.answers:
            return False
        keys = [a.strip().lower() for a in self.answers]
        return len(set(keys)) == len(keys)


_MALFORMED = ParsedCompletion(None, None, False)
_COMPACT_CONFIDENCE = re.compile(r"^(.*)@(\d)$", re.DOTALL)


def _safe_float(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _between(content: str, open_tag: str, close_tag: str, start: int) -> tuple[str, int] | None:
    """The stripped text between the first `open_tag` at/after `start` and the next `close_tag`, and the end index."""
    begin = content.find(open_tag, start)
    if begin == -1:
        return None
    begin += len(open_tag)
    end = content.find(close_tag, begin)
    if end == -1:
        return None
    return content[begin:end].strip(), end + len(close_tag)


def _tag_names(k: int, num_candidates: int) -> tuple[str, str]:
    suffix = "" if num_candidates == 1 else str(k + 1)
    return f"answer{suffix}", f"confidence{suffix}"


def _parse_tags(content: str, num_candidates: int, with_confidence: bool, require_think: bool,
                require_analysis: bool) -> ParsedCompletion:
    """The official tag format (``reward_fns.format_reward`` + ``_extract_flat_candidates``)."""
    if require_think and ("<think>" not in content or "</think>" not in content):
        return _MALFORMED
    names = [_tag_names(k, num_candidates) for k in range(num_candidates)]
    for answer, confidence in names:
        needed = [f"<{answer}>", f"</{answer}>"]
        if with_confidence:
            needed += [f"<{confidence}>", f"</{confidence}>"]
        if any(tag not in content for tag in needed):
            return _MALFORMED
    if with_confidence and require_analysis and ("<analysis>" not in content or "</analysis>" not in content):
        return _MALFORMED
    answers: list[str] = []
    raw_conf: list[str] = []
    position = 0
    for answer, confidence in names:  # interleaved: answer_i, confidence_i, answer_{i+1}, ...
        got = _between(content, f"<{answer}>", f"</{answer}>", position)
        if got is None:
            break
        answers.append(got[0])
        position = got[1]
        if with_confidence:
            got = _between(content, f"<{confidence}>", f"</{confidence}>", position)
            if got is None:
                break
            raw_conf.append(got[0])
            position = got[1]
    if len(answers) < num_candidates or (with_confidence and len(raw_conf) < num_candidates):
        if not with_confidence:
            return _MALFORMED
        answers, raw_conf, position = [], [], 0  # block order: all answers first, then all confidences
        for answer, _ in names:
            got = _between(content, f"<{answer}>", f"</{answer}>", position)
            if got is None:
                return _MALFORMED
            answers.append(got[0])
            position = got[1]
        for _, confidence in names:
            got = _between(content, f"<{confidence}>", f"</{confidence}>", position)
            if got is None:
                return _MALFORMED
            raw_conf.append(got[0])
            position = got[1]
    if not with_confidence:
        return ParsedCompletion(answers, None, True)
    values = [_safe_float(c) for c in raw_conf]
    if any(v is None for v in values):
        return ParsedCompletion(answers, None, False)
    ok = all(0.0 <= v <= 1.0 for v in values)
    return ParsedCompletion(answers, values, ok)


def _parse_compact(content: str, num_candidates: int, with_confidence: bool) -> ParsedCompletion:
    """``a1@c1;a2@c2;...`` (one confidence digit, p = c / 10) or ``a1;a2;...``; exactly K non-empty fields."""
    fields = [f.strip() for f in content.strip().split(";")]
    if len(fields) != num_candidates:
        return _MALFORMED
    answers, confidences = [], []
    for field in fields:
        if with_confidence:
            match = _COMPACT_CONFIDENCE.match(field)
            if match is None:
                return _MALFORMED
            field = match.group(1).strip()
            confidences.append(int(match.group(2)) / 10.0)
        if not field or "@" in field:
            return _MALFORMED
        answers.append(field)
    return ParsedCompletion(answers, confidences if with_confidence else None, True)


def parse_completion(content: str, num_candidates: int, with_confidence: bool, style: Style = "compact",
                     require_think: bool = True, require_analysis: bool = True) -> ParsedCompletion:
    """Parse one generation into K answers (and confidences); see the module docstring for both styles."""
    if style == "tags":
        return _parse_tags(content, num_candidates, with_confidence, require_think, require_analysis)
    if style == "compact":
        return _parse_compact(content, num_candidates, with_confidence)
    raise UserInputError(f"style={style!r} is not one of {STYLES}.")


def format_completion(answers: Sequence[str], confidences: Sequence[float] | None = None, style: Style = "compact",
                      think: str = "", analysis: str = "") -> str:
    """Inverse of `parse_completion` (used for SFT targets): confidences are rounded to one digit in compact style."""
    if style == "compact":
        if confidences is None:
            return ";".join(answers)
        return ";".join(f"{a}@{min(9, max(0, round(10 * p)))}" for a, p in zip(answers, confidences))
    if style != "tags":
        raise UserInputError(f"style={style!r} is not one of {STYLES}.")
    k = len(answers)
    parts = [f"<think>{think}</think>"]
    for i, a in enumerate(answers):
        answer, confidence = _tag_names(i, k)
        parts.append(f"<{answer}>{a}</{answer}>")
        if confidences is not None:
            parts.append(f"<{confidence}>{confidences[i]:.2f}</{confidence}>")
    if confidences is not None:
        parts.append(f"<analysis>{analysis}</analysis>")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------- metrics
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021), product form: 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def set_brier(confidences: torch.Tensor, correct: torch.Tensor) -> float:
    """Evaluation set Brier: mean over rows of SUM_i (p_i - y_i)^2 (``eval/check_functions.py``); p clipped."""
    if confidences.numel() == 0:
        return float("nan")
    p = confidences.double().clamp(0.0, 1.0)
    return float(((p - correct.double()) ** 2).sum(-1).mean())


def expected_calibration_error(confidences: torch.Tensor, correct: torch.Tensor, num_bins: int = 10) -> float:
    """ECE with equal-width bins on [0, 1] (p = 1 falls in the last bin): sum_b n_b / N |acc_b - conf_b|."""
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
                out[f"pass@{i}"].append(pass_at_k(num_candidates, sum(correct), i))
    return out


def candidate_set_metrics(candidates: Sequence[Sequence[str]], golds: Sequence[Sequence[str]], num_candidates: int,
                          ranked: bool = True) -> dict[str, float]:
    """Means of `set_rows` over the sets (NaN entries skipped)."""
    return {name: _nanmean(values) for name, values in set_rows(candidates, golds, num_candidates, ranked).items()}


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


def multi_answer_eval_metrics(completions: Sequence[str], golds: Sequence[Sequence[str]], num_candidates: int,
                              with_confidence: bool, style: Style = "compact", rank_by_confidence: bool = False,
                              completion_tokens: Sequence[int] | None = None, ece_bins: int = 10,
                              require_think: bool = True, require_analysis: bool = True) -> dict[str, float]:
    """All evaluation metrics of one multi-answer generation per example (the official eval protocol)."""
    acc = AnswerSetAccumulator(num_candidates, with_confidence, style, rank_by_confidence, require_think,
                               require_analysis, ece_bins)
    acc.add_multi(completions, golds, completion_tokens)
    return acc.compute()


def single_answer_eval_metrics(samples: Sequence[Sequence[str]], golds: Sequence[Sequence[str]],
                               completion_tokens: Sequence[Sequence[int]] | None = None,
                               style: Style = "compact") -> dict[str, float]:
    """The single-answer baseline sampled K times per example (``samples[i]`` = its K completions), scored with
    the same set metrics; pass@i is the unbiased estimator over the K samples."""
    if not samples:
        raise UserInputError("single_answer_eval_metrics got no samples.")
    acc = AnswerSetAccumulator(len(samples[0]), False, style, require_think=False)
    acc.add_single(samples, golds, completion_tokens)
    return acc.compute()


# --------------------------------------------------------------------------------------------- reward
class MultiAnswerReward(RewardFunction):
    """Multi-RLVR / Multi-RLCR reward of one generation holding K candidates (see the module docstring).

    Args:
        mode: ``rlvr_any`` (binary any-correct, the code's default), ``rlvr_count`` (|distinct correct| / K),
            ``rlcr`` (any-correct plus the Multi-Brier term).
        num_candidates: K.
        style: ``compact`` (toy, character-level) or ``tags`` (official XML-like tags).
        with_confidence: whether the format has confidences (default: only for ``rlcr``). RLVR modes with
            confidences check them in the format but do not reward them.
        enforce_uniqueness: gate accuracy on K distinct answers (default: True for ``rlcr``, False for RLVR).
        confidence_sum_constraint: the Brier term needs Sum p_i <= 1 (the code's ``confidences_sum_to_less_than_1``).
        sum_constraint_gates_accuracy: for ``rlcr``, accuracy is also zeroed when Sum p_i > 1 (the code).
        format_weight / accuracy_weight / brier_weight: the reward weights (0.5 each in the released configs).
        require_think / require_analysis: tag-style format requirements (ignored in compact style).
        accuracy: ``any`` or ``count`` accuracy term (default from the mode: ``count`` for ``rlvr_count``, else
            ``any``); ``mode: rlcr, accuracy: count`` is RLCR with the code's ``more_than_one_correctness_point``.
    """

    def __init__(self, mode: Mode = "rlcr", num_candidates: int = 3, style: Style = "compact",
                 with_confidence: bool | None = None, enforce_uniqueness: bool | None = None,
                 confidence_sum_constraint: bool = True, sum_constraint_gates_accuracy: bool = True,
                 format_weight: float = 0.5, accuracy_weight: float = 0.5, brier_weight: float = 0.5,
                 require_think: bool = True, require_analysis: bool = True,
                 accuracy: Literal["any", "count"] | None = None) -> None:
        super().__init__()
        if mode not in MODES:
            raise UserInputError(f"mode={mode!r} is not one of {MODES}.")
        if style not in STYLES:
            raise UserInputError(f"style={style!r} is not one of {STYLES}.")
        if not isinstance(num_candidates, int) or num_candidates < 1:
            raise UserInputError(f"num_candidates={num_candidates!r} must be an integer >= 1 (K candidates).")
        for name, value in (("format_weight", format_weight), ("accuracy_weight", accuracy_weight),
                            ("brier_weight", brier_weight)):
            check_range(name, value, 0.0)
        if with_confidence is False and mode == "rlcr":
            raise UserInputError("mode='rlcr' rewards stated confidences: it needs with_confidence=True (or unset).")
        if accuracy not in (None, "any", "count"):
            raise UserInputError(f"accuracy={accuracy!r}: choose 'any', 'count' or leave it unset (from the mode).")
        if mode == "rlvr_any" and accuracy == "count" or mode == "rlvr_count" and accuracy == "any":
            raise UserInputError(f"mode={mode!r} contradicts accuracy={accuracy!r}; use the other RLVR mode.")
        self.mode = mode
        self.accuracy = accuracy or ("count" if mode == "rlvr_count" else "any")
        self.num_candidates = num_candidates
        self.style = style
        self.with_confidence = (mode == "rlcr") if with_confidence is None else bool(with_confidence)
        self.enforce_uniqueness = (mode == "rlcr") if enforce_uniqueness is None else bool(enforce_uniqueness)
        self.confidence_sum_constraint = confidence_sum_constraint
        self.sum_constraint_gates_accuracy = sum_constraint_gates_accuracy
        self.weights = (float(format_weight), float(accuracy_weight), float(brier_weight))
        self.require_think = require_think
        self.require_analysis = require_analysis

    def parse(self, completion: str) -> ParsedCompletion:
        return parse_completion(completion, self.num_candidates, self.with_confidence, self.style,
                                self.require_think, self.require_analysis)

    def components(self, completions: Sequence[str], answers: Sequence[Sequence[str]]) -> dict[str, torch.Tensor]:
        """Per-completion reward terms: format, unique, constraint, accuracy, brier, correct (any), distinct_correct."""
        if len(completions) != len(answers):
            raise UserInputError(f"{len(completions)} completions but {len(answers)} answer lists: one list of "
                                 "acceptable answers per completion is needed.")
        k = self.num_candidates
        rows = []
        for completion, gold in zip(completions, answers):
            parsed = self.parse(completion)
            f = parsed.format_ok
            unique = parsed.unique if parsed.answers is not None else False
            correct = [is_correct(a, gold) for a in parsed.answers] if parsed.answers is not None else [False] * k
            distinct = len({answer_key(a) for a, ok in zip(parsed.answers or [], correct) if ok})
            sum_ok = True
            if self.with_confidence and parsed.confidences is not None and self.confidence_sum_constraint:
                sum_ok = sum(parsed.confidences) <= 1.0 + 1e-9
            constraint = unique and sum_ok  # response_constraint_reward of the code
            gate = f and (unique or not self.enforce_uniqueness)
            if self.mode == "rlcr" and self.sum_constraint_gates_accuracy:
                gate = gate and sum_ok
            if self.accuracy == "count":
                accuracy = distinct / k if gate else 0.0
            else:
                accuracy = float(any(correct)) if gate else 0.0
            brier = 0.0
            if self.mode == "rlcr" and f and constraint and parsed.confidences is not None:
                p = [min(1.0, max(0.0, c)) for c in parsed.confidences]
                brier = 1.0 - sum((float(y) - q) ** 2 for y, q in zip(correct, p)) / k
            rows.append((float(f), float(unique), float(constraint), accuracy, brier, float(f and any(correct)),
                         float(distinct if f else 0)))
        table = torch.tensor(rows, dtype=torch.float32).reshape(-1, 7)
        names = ("format", "unique", "constraint", "accuracy", "brier", "correct", "distinct_correct")
        return {name: table[:, i] for i, name in enumerate(names)}

    def __call__(self, completions: list[str], answers: list[list[str]]) -> tuple[torch.Tensor, dict[str, float]]:
        terms = self.components(completions, answers)
        w_f, w_acc, w_b = self.weights
        reward = w_f * terms["format"] + w_acc * terms["accuracy"]
        if self.mode == "rlcr":
            reward = reward + w_b * terms["brier"]
        metrics = {name: float(value.mean()) if value.numel() else float("nan") for name, value in terms.items()}
        return reward, metrics


# --------------------------------------------------------------------------------------------- module
class MultiAnswerGRPO(GRPO):
    """GRPO (`lightning_modules.grpo.GRPO`, all its arguments) whose evaluation scores answer SETS.

    Training is GRPO unchanged with the injected reward (`MultiAnswerReward` for Multi-RLVR / Multi-RLCR,
    `ExactMatchReward` for the single-answer baseline). Validation/test replace GRPO's pass@k-by-threshold (a
    multi-answer reward of 0.5 + 0.5 * brier is not "correct") with the set metrics of the module docstring:
    ``eval_samples`` sets per prompt at ``eval_temperature``; a set is one generation (``answer_format: multi``)
    or K independent samples (``single``). Logged as ``val/coverage``, ``val/duplicate_rate``,
    ``val/distinct_correct``, ``val/pass@1..K``, ``val/format``, ``val/tokens_per_answer``,
    ``val/tokens_per_correct_answer``, ``val/coverage_tier<t>`` and, with confidences, ``val/set_brier``,
    ``val/ece``, ``val/confidence_sum``.

    Args:
        num_candidates: K. For ``multi`` it must equal the reward's ``num_candidates``.
        answer_format: ``multi`` (K candidates per generation) or ``single`` (the baseline sampled K times).
        rank_by_confidence: order candidates by confidence for pass@i (default: True for RLCR, False otherwise,
            as in ``eval/check_functions.py``).
        (all other arguments: `GRPO`)
    """

    def __init__(self, *args, num_candidates: int = 3, answer_format: Literal["multi", "single"] = "multi",
                 rank_by_confidence: bool | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(num_candidates, int) or num_candidates < 1:
            raise UserInputError(f"num_candidates={num_candidates!r} must be an integer >= 1.")
        if answer_format not in ("multi", "single"):
            raise UserInputError(f"answer_format={answer_format!r}: choose 'multi' or 'single'.")
        if answer_format == "multi":
            if not isinstance(self.reward, MultiAnswerReward):
                raise UserInputError("answer_format='multi' needs reward: lightning_modules.multi_answer_rl."
                                     f"MultiAnswerReward (got {type(self.reward).__name__}).")
            if self.reward.num_candidates != num_candidates:
                raise UserInputError(f"num_candidates={num_candidates} differs from the reward's "
                                     f"num_candidates={self.reward.num_candidates}; set both to the same K.")
        self.num_candidates = num_candidates
        self.answer_format = answer_format
        is_rlcr = isinstance(self.reward, MultiAnswerReward) and self.reward.mode == "rlcr"
        self.rank_by_confidence = is_rlcr if rank_by_confidence is None else bool(rank_by_confidence)
        self._sets: AnswerSetAccumulator | None = None

    def new_accumulator(self) -> AnswerSetAccumulator:
        reward = self.reward if isinstance(self.reward, MultiAnswerReward) else None
        if self.answer_format == "single" or reward is None:
            style = reward.style if reward is not None else "compact"
            return AnswerSetAccumulator(self.num_candidates, False, style, require_think=False)
        return AnswerSetAccumulator(self.num_candidates, reward.with_confidence, reward.style,
                                    self.rank_by_confidence, reward.require_think, reward.require_analysis)

    @torch.no_grad()
    def score_sets(self, batch: dict, accumulator: AnswerSetAccumulator, sets_per_prompt: int, temperature: float,
                   generator: torch.Generator) -> None:
        """Generate `sets_per_prompt` answer sets per prompt of `batch` and add them to `accumulator`."""
        num_prompts = batch["prompt_ids"].shape[0]
        per_set = self.num_candidates if self.answer_format == "single" else 1
        counts = torch.full((num_prompts,), sets_per_prompt * per_set, dtype=torch.long, device=self.device)
        tokens, mask, group_index = self.generate(batch, counts, temperature, generator)
        completions = decode_completions(tokens, mask, self.tokenizer)
        lengths = mask.sum(1).tolist()
        group = group_index.tolist()
        tiers = batch["tier"].tolist()
        if self.answer_format == "multi":
            accumulator.add_multi(completions, [batch["answers"][g] for g in group], lengths,
                                  [tiers[g] for g in group])
            return
        k = self.num_candidates  # rollouts of a prompt are contiguous: consecutive blocks of K form one set
        sets = [completions[i:i + k] for i in range(0, len(completions), k)]
        set_lengths = [lengths[i:i + k] for i in range(0, len(lengths), k)]
        owners = [group[i] for i in range(0, len(group), k)]
        accumulator.add_single(sets, [batch["answers"][g] for g in owners], set_lengths, [tiers[g] for g in owners])

    def _score_eval_batch(self, batch, batch_idx: int, stream: int) -> None:
        if self._sets is None:
            self._sets = self.new_accumulator()
        self.score_sets(batch, self._sets, self.hparams.eval_samples, self.hparams.eval_temperature,
                        self._generator(stream, batch_idx))

    def _log_sets(self, prefix: str) -> None:
        accumulator, self._sets = self._sets, None
        if accumulator is None:
            accumulator = self.new_accumulator()
        if torch.distributed.is_available() and torch.distributed.is_initialized():  # every rank's sets
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, accumulator)
            accumulator = self.new_accumulator()
            for part in gathered:
                accumulator.merge(part)
        for name, value in accumulator.compute().items():
            if not math.isnan(value):
                self.log(f"{prefix}/{name}", value)  # identical on every rank after the merge

    def validation_step(self, batch, batch_idx):
        self._score_eval_batch(batch, batch_idx, stream=1)

    def on_validation_epoch_end(self) -> None:
        self._log_sets("val")

    def test_step(self, batch, batch_idx):
        self._score_eval_batch(batch, batch_idx, stream=2)

    def on_test_epoch_end(self) -> None:
        self._log_sets("test")
