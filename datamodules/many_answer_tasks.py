"""Many-answer tasks for multi-answer RL: prompts whose gold answer is a SET (any member is correct).

Embedded task (no files): "name a non-trivial divisor of n" for the composite n in [divisor_n_min, divisor_n_max]
(default 12..99: 68 prompts, 1 to 10 valid answers each), this collection's CPU toy (a documented choice) for
"Reaching Beyond the Mode" (arXiv 2603.24844). Each prompt has a stable id (its position in the pool, pool sorted
by n), the gold list (every non-trivial divisor) and a tier = min(|gold|, K): how many of the K slots CAN be filled with
distinct correct answers (1..K).

User data (``source: jsonl``): a JSON-lines file with one object per line, ``{"question": str, "answers":
[str, ...]}`` (``"problem"`` / ``"answer"`` accepted as in the official loader; a single string or number counts
as a one-element list). Prompt ids are the line order (blank lines skipped). Tier = min(|answers|, K). Errors name
the file, the line and the field. ``val_data_path`` adds a validation file (ids 1_000_000 + its line order,
or the next 1_000_000 * 10**k above the training ids for a training file of more than a million prompts).

Two split kinds share one datamodule (``train_split``):

* ``rl``: batches of prompts for GRPO (``collate_prompts`` of `datamodules.verifiable_tasks`: ``prompt_ids``,
  ``prompt_tokens`` left-padded, ``prompt_mask``, ``answers``, ``tier``);
* ``sft``: format warm-up (``input_tokens``, ``loss_mask`` on the target only). Targets teach the FORMAT, not the
  answers: ``answer_format: multi`` writes K candidates ``a1@c1;a2@c2;a3@c3`` (compact style; the official
  ``<answer_i>``/``<confidence_i>`` tags with ``style: tags``), ``single`` writes one answer. Every candidate is,
  independently, a random gold answer with probability ``sft_valid_prob`` and otherwise a random distractor (a
  gold answer of another prompt that is not gold here), so the single- and multi-answer warm-ups have the same
  per-candidate distribution (candidates may repeat, as K independent single answers would). Confidence digits
  are uniform in 0..3 (Sum p <= 0.9 <= 1) and carry no information: calibration is left to RL. This SFT design is
  this repo's reconstruction of "K random valid or invalid answers".

Validation and test use the same prompt pool as training unless ``val_fraction > 0`` (a seeded held-out split of
the prompts): on the toy the question is how much of the answer SET a policy covers on the prompts it is trained
on, not generalisation of divisibility. The tokenizer is `CharTokenizer` over the alphabet of the data (prompts,
answers and format symbols), or a local transformers tokenizer (``tokenizer_path``) for real LMs.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from datamodules.verifiable_tasks import CharTokenizer, HFTokenizer, ListDataset, PromptCollator, evaluation_id_offset
from datamodules.sampling import LoaderGeneratorReplaySampler, evaluation_sampler, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.multi_answer_rl.multi_answer_protocol import format_completion

Source = Literal["divisors", "jsonl"]
AnswerFormat = Literal["multi", "single"]
OutputStyle = Literal["compact", "tags"]
FORMAT_SYMBOLS = "0123456789;@"
VAL_ID_OFFSET = 1_000_000
TAGS_PROMPT = ("{question}\nGive EXACTLY {k} DISTINCT candidate answers, ranked by likelihood. Reason inside "
               "<think></think>, then write <answer1>...</answer1> <confidence1>p1</confidence1> and so on up to "
               "<answer{k}>, where each confidence is a probability in [0, 1] and the confidences sum to at most 1; "
               "end with <analysis>...</analysis>.")
TAGS_PROMPT_SINGLE = ("{question}\nReason inside <think></think>, then give your final answer inside "
                      "<answer></answer>.")


@dataclass(frozen=True)
class ManyAnswerExample:
    """One prompt: stable id, question text, every acceptable answer, tier (slots fillable with gold, 1..K)."""
    id: int
    question: str
    answers: tuple[str, ...]
    tier: int


def nontrivial_divisors(n: int) -> list[int]:
    """Divisors d of n with 1 < d < n (empty for primes and n < 4)."""
    return [d for d in range(2, n) if n % d == 0]


def divisor_pool(n_min: int, n_max: int, num_candidates: int) -> list[ManyAnswerExample]:
    """Every composite n in [n_min, n_max] as a prompt ``"<n>:"`` whose answers are its non-trivial divisors."""
    examples = []
    for n in range(n_min, n_max + 1):
        gold = nontrivial_divisors(n)
        if gold:
            examples.append(ManyAnswerExample(len(examples), f"{n}:", tuple(str(d) for d in gold),
                                              min(len(gold), num_candidates)))
    return examples


def load_many_answer_jsonl(path: str, num_candidates: int) -> list[ManyAnswerExample]:
    """Read ``{"question": str, "answers": [str, ...]}`` lines (see the module docstring); clear errors."""
    if not os.path.isfile(path):
        raise UserInputError(f"many-answer data file '{path}' does not exist. Expected a JSON-lines file with one "
                             '{"question": "...", "answers": ["...", ...]} object per line.')
    examples = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserInputError(f"{where}: not valid JSON ({err.msg}).") from None
            if not isinstance(record, dict):
                raise UserInputError(f"{where}: expected a JSON object with 'question' and 'answers'.")
            question = record.get("question", record.get("problem"))
            if not isinstance(question, str) or not question.strip():
                raise UserInputError(f"{where}: field 'question' is missing or not a non-empty string.")
            answers = record.get("answers", record.get("answer"))
            if isinstance(answers, (str, int, float)) and not isinstance(answers, bool):
                answers = [answers]
            if not isinstance(answers, list) or not answers:
                raise UserInputError(f"{where}: field 'answers' is missing or not a non-empty list of strings.")
            if not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) and str(a).strip()
                       for a in answers):
                raise UserInputError(f"{where}: every entry of 'answers' must be a non-empty string (or number).")
            gold = tuple(dict.fromkeys(str(a).strip() for a in answers))
            examples.append(ManyAnswerExample(len(examples), question, gold, min(len(gold), num_candidates)))
    if not examples:
        raise UserInputError(f"many-answer data file '{path}' holds no examples.")
    return examples


def sft_target(example: ManyAnswerExample, distractors: list[str], answer_format: AnswerFormat, num_candidates: int,
               with_confidence: bool, valid_prob: float, rng: random.Random, style: str = "compact") -> str:
    """One SFT target (see the module docstring): K (or 1) candidates, each gold w.p. `valid_prob`."""
    count = num_candidates if answer_format == "multi" else 1
    wrong = [d for d in distractors if d not in example.answers] or list(example.answers)
    picks = [rng.choice(example.answers) if rng.random() < valid_prob else rng.choice(wrong) for _ in range(count)]
    if answer_format == "single":
        return format_completion(picks, None, style="compact") if style == "compact" else \
            f"<think></think> <answer>{picks[0]}</answer>"
    confidences = [rng.randint(0, 3) / 10 for _ in picks] if with_confidence else None
    return format_completion(picks, confidences, style=style)


class ManyAnswerDataModule(LightningDataModule):
    """Many-answer prompts for GRPO (``train_split: rl``) and the format warm-up (``train_split: sft``).

    Args:
        source: ``divisors`` (embedded) or ``jsonl`` (``data_path``, see `load_many_answer_jsonl`).
        data_path: the JSON-lines file for ``source: jsonl``.
        val_data_path: optional JSON-lines validation/test file (ids past the training ids, see above); else
            ``val_fraction``.
        target_format: SFT targets with K candidates (``multi``) or one answer (``single``: the baseline).
        task_num_candidates: K (the multi-answer format and the tiers).
        with_confidence: multi targets carry a confidence per candidate.
        output_style: ``compact`` (``a@c;a@c;a@c``, character-level toy) or ``tags`` (official tags; the prompt
            then includes the format instruction `TAGS_PROMPT`).
        divisor_n_min, divisor_n_max: range of n for the embedded task (composites only).
        sft_samples_per_prompt, sft_valid_prob: SFT targets per prompt and the chance a candidate is gold.
        val_fraction: share of prompts held out for validation (0: validate on the training prompts).
        batch_size: prompts per RL step; eval_batch_size: prompts per evaluation batch; sft_batch_size: SFT rows.
        train_split: ``rl`` or ``sft`` (what ``train_dataloader`` serves).
        tokenizer_path, use_chat_template: a local transformers tokenizer (default: a character tokenizer).
        max_prompt_tokens: refuse longer prompts (None: no limit); prompts are never truncated.
        seed: SFT targets, the held-out split and shuffling.
    """

    def __init__(self, source: Source = "divisors", data_path: str | None = None, val_data_path: str | None = None,
                 target_format: AnswerFormat = "multi", task_num_candidates: int = 3, with_confidence: bool = True,
                 output_style: OutputStyle = "compact", divisor_n_min: int = 12, divisor_n_max: int = 99,
                 sft_samples_per_prompt: int = 64, sft_valid_prob: float = 0.7, val_fraction: float = 0.0,
                 batch_size: int = 16, eval_batch_size: int = 128, sft_batch_size: int = 64,
                 train_split: Literal["rl", "sft"] = "rl", tokenizer_path: str | None = None,
                 use_chat_template: bool = True, max_prompt_tokens: int | None = None, seed: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        for name in ("task_num_candidates", "sft_samples_per_prompt", "batch_size", "eval_batch_size",
                     "sft_batch_size"):
            check_range(name, getattr(self.hparams, name), low=1)
        check_range("sft_valid_prob", sft_valid_prob, 0.0, 1.0)
        check_range("val_fraction", val_fraction, 0.0, 1.0, high_inclusive=False)
        check_range("num_workers", num_workers, low=0)
        if source not in ("divisors", "jsonl"):
            raise UserInputError(f"source={source!r}: choose 'divisors' (embedded) or 'jsonl' (set data_path).")
        if target_format not in ("multi", "single"):
            raise UserInputError(f"target_format={target_format!r}: choose 'multi' or 'single'.")
        if output_style not in ("compact", "tags"):
            raise UserInputError(f"output_style={output_style!r}: choose 'compact' or 'tags'.")
        if train_split not in ("rl", "sft"):
            raise UserInputError(f"train_split={train_split!r}: choose 'rl' or 'sft'.")
        if source == "divisors":
            check_range("divisor_n_min", divisor_n_min, low=4)
            if divisor_n_max < divisor_n_min:
                raise UserInputError(f"divisor_n_max={divisor_n_max} must be >= divisor_n_min={divisor_n_min}.")
            self.examples = divisor_pool(divisor_n_min, divisor_n_max, task_num_candidates)
            if not self.examples:
                raise UserInputError(f"no composite number in [{divisor_n_min}, {divisor_n_max}]: widen the range.")
        else:
            if data_path is None:
                raise UserInputError("source='jsonl' reads a file: set data_path to a JSON-lines file with "
                                     "'question' and 'answers' fields.")
            self.examples = load_many_answer_jsonl(data_path, task_num_candidates)
        order = torch.randperm(len(self.examples), generator=torch.Generator().manual_seed(seed)).tolist()
        held_out = set(order[:int(round(val_fraction * len(self.examples)))])
        if val_fraction > 0 and (not held_out or len(held_out) == len(self.examples)):
            raise UserInputError(f"val_fraction={val_fraction} leaves an empty train or validation split for "
                                 f"{len(self.examples)} prompts.")
        self.train_pool = [e for e in self.examples if e.id not in held_out]
        self.val_pool = [e for e in self.examples if e.id in held_out] if held_out else list(self.train_pool)
        if val_data_path is not None:
            if val_fraction > 0:
                raise UserInputError("set either val_data_path or val_fraction, not both.")
            # ids past every training id (training ids are line orders), however long the training file
            offset = evaluation_id_offset([e.id for e in self.examples], VAL_ID_OFFSET)
            self.val_pool = [ManyAnswerExample(offset + e.id, e.question, e.answers, e.tier)
                             for e in load_many_answer_jsonl(val_data_path, task_num_candidates)]
            self.examples = self.examples + self.val_pool
        self.prompts = {e.id: self._prompt_text(e) for e in self.examples}
        self.sft_examples = self._sft_examples()
        if tokenizer_path is not None:
            self.tokenizer = HFTokenizer(tokenizer_path, use_chat_template)
            self.prompts = {i: self.tokenizer.render_chat([{"role": "user", "content": p}])
                            for i, p in self.prompts.items()}
        else:
            chars = set(FORMAT_SYMBOLS)
            for e in self.examples:
                chars.update(self.prompts[e.id])
                for a in e.answers:
                    chars.update(a)
            for ex in self.sft_examples:
                chars.update(ex["target"])
            self.tokenizer = CharTokenizer("".join(sorted(chars)))
        self.sft_examples = [{"prompt": self.prompts[ex["id"]], "target": ex["target"]} for ex in self.sft_examples]
        if max_prompt_tokens is not None:
            for e in self.examples:
                if len(self.tokenizer.encode(self.prompts[e.id])) > max_prompt_tokens:
                    raise UserInputError(f"prompt id {e.id} ({e.question[:40]!r}...) has more than max_prompt_tokens="
                                         f"{max_prompt_tokens} tokens; raise the limit or filter the data (prompts "
                                         "are not truncated).")

    def _prompt_text(self, example: ManyAnswerExample) -> str:
        h = self.hparams
        if h.output_style == "compact":
            return example.question
        template = TAGS_PROMPT if h.target_format == "multi" else TAGS_PROMPT_SINGLE
        return template.format(question=example.question, k=h.task_num_candidates)

    def _sft_examples(self) -> list[dict]:
        h = self.hparams
        rng = random.Random(h.seed)
        distractors = sorted({a for e in self.examples for a in e.answers})
        if len(distractors) < 2 and h.sft_valid_prob < 1:
            distractors = distractors + [str(v) for v in range(2, 12)]
        rows = []
        for e in self.train_pool:
            for _ in range(h.sft_samples_per_prompt):
                rows.append({"id": e.id, "target": sft_target(e, distractors, h.target_format, h.task_num_candidates,
                                                              h.with_confidence, h.sft_valid_prob, rng,
                                                              h.output_style)})
        return rows

    def rl_examples(self, pool: list[ManyAnswerExample]) -> list[dict]:
        return [{"prompt_id": e.id, "prompt": self.prompts[e.id], "answers": list(e.answers), "tier": e.tier}
                for e in pool]

    def _loader(self, items: list, batch_size: int, shuffle: bool, sft: bool = False,
                shard: bool = False) -> DataLoader:
        # training: an order that is a pure function of (seed, epoch), so a resumed run continues it; evaluation
        # under DDP (shard): unpadded shards, so that reduced metrics equal one process's (datamodules.sampling)
        dataset = ListDataset(items)
        if shuffle:
            sampler = training_sampler(len(dataset), self.hparams.seed, self.trainer, LoaderGeneratorReplaySampler,
                                       batch_size=batch_size)
        else:
            sampler = evaluation_sampler(dataset, self.trainer) if shard else None
        generator = torch.Generator().manual_seed(self.hparams.seed) if shuffle else None
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=generator,
                          collate_fn=PromptCollator(self.tokenizer, sft=sft), num_workers=self.hparams.num_workers)

    def train_dataloader(self) -> DataLoader:
        if self.hparams.train_split == "sft":
            return self._loader(self.sft_examples, self.hparams.sft_batch_size, shuffle=True, sft=True)
        return self._loader(self.rl_examples(self.train_pool), self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.rl_examples(self.val_pool), self.hparams.eval_batch_size, shuffle=False, shard=True)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def train_pool_loader(self, batch_size: int | None = None) -> DataLoader:
        """The RL training prompts in fixed order (evaluation on the training pool)."""
        return self._loader(self.rl_examples(self.train_pool), batch_size or self.hparams.eval_batch_size, False)
