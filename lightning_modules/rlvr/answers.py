"""Answer checking shared by the RL-with-verifiable-rewards papers: pure Python, no torch, no models.

Models (the rewards of `lightning_modules.rlvr.grpo` and `lightning_modules.multi_answer_rl.multi_answer_rl`) and
datamodules may both import it. Two verifiers live here, because the two paper families compare answers differently:

* Math-style answers (GRPO, Knapsack RL, DARS on `datamodules.verifiable_tasks`): `extract_answer` finds the final
  answer in a completion (last ``\\boxed{}``, GSM8K's ``####``, "answer is"), `normalize_math_answer` makes
  equivalent spellings of a number or a short text compare equal (``1,000`` = ``1000``, ``0.5`` = ``1/2`` =
  ``\\frac{1}{2}``; exact fractions, punctuation kept), and `answers_match` compares against every acceptable
  answer.
* Short free-text answers of multi-answer RL ("Reaching Beyond the Mode", arXiv 2603.24844; official code
  ishapuri/multi_answer_rl, ``eval/check_functions.py``): `normalize_squad_answer` is the SQuAD-style
  normalisation of that code (lowercase, drop punctuation and articles, collapse spaces), `answer_key` adds
  numeric equality (``06`` = ``6``), and `is_correct` matches one candidate against the gold strings.
"""
from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from fractions import Fraction


# --------------------------------------------------------------------------------------------- math-style answers
_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{") - 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def extract_answer(completion: str) -> str:
    """The final answer inside a completion: last ``\\boxed{}``, else after the last ``####`` (GSM8K), else the
    rest of the line after the last ``Answer:`` (the format DAPO-Math-17k's prompts ask for; verl
    ``reward_score/math_dapo.py`` extracts ``(?i)Answer\\s*:\\s*([^\\n]+)``), else after the last "answer is", else
    the whole text."""
    boxed = _last_boxed(completion)
    if boxed is not None:
        return boxed
    if "####" in completion:
        return completion.rsplit("####", 1)[1]
    dapo = _DAPO_ANSWER.findall(completion)
    if dapo:
        return dapo[-1]
    match = list(re.finditer(r"answer is[:\s]*", completion, flags=re.IGNORECASE))
    return completion[match[-1].end():] if match else completion


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_FRACTION = re.compile(r"^([+-]?\d+)\s*/\s*(\d+)$")
_LATEX_FRAC = re.compile(r"^([+-]?)\\d?frac\{(\d+)\}\{(\d+)\}$")


def normalize_math_answer(text) -> str:
    """Canonical form of a short math answer, so equivalent spellings compare equal.

    Text: strip spaces, ``$``, ``\\text{}``/``\\left``/``\\right``, a trailing period; lower-case; collapse spaces.
    Numbers: ``1,000`` -> ``1000``; ``0.50`` / ``1/2`` / ``\\frac{1}{2}`` -> ``1/2``; ``3.0`` -> ``3`` (exact
    fractions, no float rounding). An integer written with leading zeros (``007``) is kept as text, so digit
    strings such as the reversed sums of the embedded task are compared exactly.
    """
    s = str(text).strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("$", "")
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip().lower()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    latex = _LATEX_FRAC.match(s)
    if latex:
        s = f"{latex.group(1)}{latex.group(2)}/{latex.group(3)}"
    fraction = _FRACTION.match(s)
    if _NUMBER.match(s) or (fraction and int(fraction.group(2)) != 0):
        digits = s.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
            return s  # leading zeros carry meaning (digit strings): compare as text
        value = Fraction(int(fraction.group(1)), int(fraction.group(2))) if fraction else Fraction(s)
        return str(value)
    return s


def answers_match(completion: str, answers: list[str], extract: bool = True) -> bool:
    """True when the (extracted) completion equals any acceptable answer after `normalize_math_answer`."""
    guess = normalize_math_answer(extract_answer(completion) if extract else completion)
    return any(guess == normalize_math_answer(a) for a in answers)


# --------------------------------------------------------------------------------------------- free-text answers
def normalize_squad_answer(text: str) -> str:
    """SQuAD-style normalisation of the multi-answer RL code: lowercase, drop punctuation and articles, collapse
    spaces (``"  The Common-Cold! "`` -> ``"commoncold"``)."""
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
    """Canonical form used to match answers and to count distinct answers (numbers: their value, else
    `normalize_squad_answer`)."""
    number = _as_number(text)
    if number is not None:
        return repr(int(number)) if number == int(number) else repr(number)
    return normalize_squad_answer(text)


def is_correct(candidate: str, gold: Sequence[str]) -> bool:
    """True if the candidate matches any gold string (normalised exact match or equal numbers); '' never does."""
    if not candidate or not candidate.strip():
        return False
    key = answer_key(candidate)
    return bool(key) and any(key == answer_key(g) for g in gold)
