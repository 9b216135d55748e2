"""The answer protocol of multi-answer RL: how one generation writes K candidates (and confidences), and its parser.

Paper: "Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models" (Puri et al., arXiv
2603.24844); official code github.com/ishapuri/multi_answer_rl (``reward_fns.py``). The method, the rewards and
the evaluation are in `lightning_modules.multi_answer_rl.multi_answer_rl`; this module is the format shared by the
reward, the set metrics (`lightning_modules.multi_answer_rl.answer_set_metrics`) and the SFT targets of
`datamodules.many_answer_tasks`. Pure Python (no torch).

Two output styles (``style``):

* ``tags`` (the official format): ``<think>..</think> <answer1>a</answer1> <confidence1>p</confidence1> ...
  <analysis>..</analysis>``; the parser also accepts all answers first, then all confidences. Malformed output
  is handled as in ``reward_fns.py``: the format check only tests that every tag occurs (``<think>`` and
  ``</think>`` present, K numbered answer tags, for RLCR K confidence tags and ``<analysis>``); candidates are
  taken at their first ordered occurrence; a non-float or out-of-range confidence fails the format; K = 1 uses
  the unnumbered ``<answer>``/``<confidence>`` tags.
* ``compact`` (this repository's toy format for a from-scratch character-level GPT): ``a1@c1;a2@c2;a3@c3`` where
  ``c_i`` is ONE digit and ``p_i = c_i / 10``; without confidences ``a1;a2;a3``. Exactly K non-empty fields are
  required (more or fewer is malformed); no think/analysis parts.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal, Sequence

from lightning_modules.shared.errors import UserInputError

Style = Literal["compact", "tags"]
STYLES = ("compact", "tags")


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
