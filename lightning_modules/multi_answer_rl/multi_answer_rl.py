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
Extra metrics of this collection's CPU toy: coverage = |distinct correct| / min(K, |gold|), duplicate rate =
(candidates - distinct candidates) / candidates, tokens per answer and tokens per distinct correct answer.
Evaluation sets are sampled with GRPO's keyed evaluation sampling (each set from its key of seed, stage, prompt id
and sample index) and scored once per epoch from every rank's prompts, each counted once, in prompt-id order
(`lightning_modules.shared.example_rng.gather_objects`): any number of processes reports one process's numbers.

`MultiAnswerReward` plugs into `lightning_modules.rlvr.grpo.GRPO` as its ``reward``; `MultiAnswerGRPO` is that GRPO with
the set-level evaluation above (for the multi-answer policy and for the single-answer baseline sampled K times).
This file holds the rewards and the module. The answer format and its parser are in
`lightning_modules.multi_answer_rl.multi_answer_protocol` (shared with the SFT targets of
`datamodules.many_answer_tasks`), answer matching in `lightning_modules.rlvr.answers` (`is_correct`, `answer_key`), the
set metrics in `lightning_modules.multi_answer_rl.answer_set_metrics`.

Two output styles (``style``): ``tags``, the official format, and ``compact``, this collection's toy format for
a from-scratch character-level GPT; both are specified in `lightning_modules.multi_answer_rl.multi_answer_protocol`.

Deviations / reconstructions (all documented choices):

* Answer matching is the official ``normalize_answer`` exact match (here `normalize_squad_answer`: lowercase,
  strip punctuation and articles, collapse whitespace) against any gold string, plus numeric equality when both
  sides parse as numbers ("06" == "6"). ``math_verify`` (used by the code for math sources) is not a dependency here.
* Accuracy gating for RLCR follows the code read (``reward_fns.py`` @3f6b41a): it is gated by the whole response
  constraint (uniqueness AND Sum p <= 1); ``sum_constraint_gates_accuracy=False`` gates by uniqueness only (the
  simpler reading of the rule). For RLVR uniqueness is not enforced unless ``enforce_uniqueness=True``.
* The code takes RLCR accuracy candidates at the LAST occurrence of each answer tag but the Brier/format at the
  first ordered occurrence; here one parse (first ordered occurrence) serves all terms.
* In the toy, the Multi-RLVR policies also write confidences (``with_confidence=True``, not rewarded) so that the
  set Brier of RLVR and RLCR can be compared (a documented choice of this collection's experiment).
* The adaptive Brier-weight ramp (``enable_adaptive_brier``, off in the released configs) is not implemented.
* ``accuracy: count`` with ``mode: rlcr`` (RLCR with the count accuracy) is offered as an option; the released
  configs use any-correct for both variants.
* The paper's diversity metric was not visible; "tokens per answer" here = completion tokens (EOS included) / K
  per set, and "tokens per correct answer" = tokens per set / distinct correct answers per set.
* What GRPO counts as solved (``train/solve_*``, allocators' success estimates) is the reward's correct flag
  (`MultiAnswerReward.evaluate`): the accuracy term is non-zero. It is not ``reward > 0.5``: for RLCR a well-formed
  set with no correct candidate scores 0.5 + 0.5 * brier. For the RLVR modes (weights 0.5/0.5) the two agree.
"""
from __future__ import annotations

import math
from typing import Literal, Sequence

import torch

from lightning_modules.multi_answer_rl.answer_set_metrics import AnswerSetAccumulator
from lightning_modules.rlvr.answers import answer_key, is_correct
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import gather_objects
from lightning_modules.rlvr.grpo import GRPO, RewardFunction, decode_completions
from lightning_modules.multi_answer_rl.multi_answer_protocol import STYLES, ParsedCompletion, Style, parse_completion

Mode = Literal["rlvr_any", "rlvr_count", "rlcr"]
MODES = ("rlvr_any", "rlvr_count", "rlcr")


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

    def evaluate(self, completions: list[str], answers: list[list[str]],
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(rewards, correct, metrics); correct = the accuracy term credits the set (a correct candidate in a
        response that passes the accuracy gate), whatever the format and Brier terms add."""
        terms = self.components(completions, answers)
        w_f, w_acc, w_b = self.weights
        reward = w_f * terms["format"] + w_acc * terms["accuracy"]
        if self.mode == "rlcr":
            reward = reward + w_b * terms["brier"]
        metrics = {name: float(value.mean()) if value.numel() else float("nan") for name, value in terms.items()}
        return reward, terms["accuracy"] > 0, metrics

    def __call__(self, completions: list[str], answers: list[list[str]]) -> tuple[torch.Tensor, dict[str, float]]:
        reward, _, metrics = self.evaluate(completions, answers)
        return reward, metrics


# --------------------------------------------------------------------------------------------- module
class MultiAnswerGRPO(GRPO):
    """GRPO (`lightning_modules.rlvr.grpo.GRPO`, all its arguments) whose evaluation scores answer SETS.

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
                raise UserInputError("answer_format='multi' needs reward: "
                                     "lightning_modules.multi_answer_rl.multi_answer_rl.MultiAnswerReward "
                                     f"(got {type(self.reward).__name__}).")
            if self.reward.num_candidates != num_candidates:
                raise UserInputError(f"num_candidates={num_candidates} differs from the reward's "
                                     f"num_candidates={self.reward.num_candidates}; set both to the same K.")
        self.num_candidates = num_candidates
        self.answer_format = answer_format
        is_rlcr = isinstance(self.reward, MultiAnswerReward) and self.reward.mode == "rlcr"
        self.rank_by_confidence = is_rlcr if rank_by_confidence is None else bool(rank_by_confidence)
        self._eval_records: list[tuple[int, dict]] = []

    def new_accumulator(self) -> AnswerSetAccumulator:
        reward = self.reward if isinstance(self.reward, MultiAnswerReward) else None
        if self.answer_format == "single" or reward is None:
            style = reward.style if reward is not None else "compact"
            return AnswerSetAccumulator(self.num_candidates, False, style, require_think=False)
        return AnswerSetAccumulator(self.num_candidates, reward.with_confidence, reward.style,
                                    self.rank_by_confidence, reward.require_think, reward.require_analysis)

    @torch.no_grad()
    def sample_sets(self, batch: dict, sets_per_prompt: int, temperature: float, generator: torch.Generator,
                    keyed: bool | None = None) -> list[dict]:
        """Generate `sets_per_prompt` answer sets per prompt of `batch`: one record per prompt (its id, answers,
        tier, completions and their lengths, rollouts in order); ``keyed`` as in `GRPO.generate`."""
        num_prompts = batch["prompt_ids"].shape[0]
        per_set = self.num_candidates if self.answer_format == "single" else 1
        counts = torch.full((num_prompts,), sets_per_prompt * per_set, dtype=torch.long, device=self.device)
        tokens, mask, group_index = self.generate(batch, counts, temperature, generator, keyed=keyed)
        completions = decode_completions(tokens, mask, self.tokenizer)
        lengths = mask.sum(1).tolist()
        records = [{"prompt_id": int(i), "answers": batch["answers"][j], "tier": int(batch["tier"][j]),
                    "completions": [], "lengths": []} for j, i in enumerate(batch["prompt_ids"].tolist())]
        for completion, length, g in zip(completions, lengths, group_index.tolist()):
            records[g]["completions"].append(completion)
            records[g]["lengths"].append(length)
        return records

    def add_sets(self, accumulator: AnswerSetAccumulator, records: Sequence[dict]) -> None:
        """Score the answer sets of `sample_sets` records into `accumulator` (in the records' order)."""
        if self.answer_format == "multi":
            owners = [r for r in records for _ in r["completions"]]
            accumulator.add_multi([c for r in records for c in r["completions"]], [r["answers"] for r in owners],
                                  [n for r in records for n in r["lengths"]], [r["tier"] for r in owners])
            return
        k = self.num_candidates  # rollouts of a prompt are contiguous: consecutive blocks of K form one set
        sets, set_lengths, owners = [], [], []
        for r in records:
            for i in range(0, len(r["completions"]), k):
                sets.append(r["completions"][i:i + k])
                set_lengths.append(r["lengths"][i:i + k])
                owners.append(r)
        accumulator.add_single(sets, [r["answers"] for r in owners], set_lengths, [r["tier"] for r in owners])

    def score_sets(self, batch: dict, accumulator: AnswerSetAccumulator, sets_per_prompt: int, temperature: float,
                   generator: torch.Generator, keyed: bool | None = None) -> None:
        """Generate `sets_per_prompt` answer sets per prompt of `batch` and add them to `accumulator`."""
        self.add_sets(accumulator, self.sample_sets(batch, sets_per_prompt, temperature, generator, keyed))

    def _score_eval_batch(self, batch, batch_idx: int, stream: int) -> None:
        records = self.sample_sets(batch, self.hparams.eval_samples, self.hparams.eval_temperature,
                                   self.evaluation_generator(batch_idx, stream), keyed=self.keyed_evaluation)
        self._eval_records += [(r["prompt_id"], r) for r in records]

    def _log_sets(self, prefix: str) -> None:
        """Set metrics of every rank's prompts, each once (padding copies dropped), in prompt-id order."""
        pairs, self._eval_records = self._eval_records, []
        _, records = gather_objects([i for i, _ in pairs], [r for _, r in pairs])
        accumulator = self.new_accumulator()
        self.add_sets(accumulator, records)
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
