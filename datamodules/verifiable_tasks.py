"""Verifiable-reward prompt sets for RLVR (GRPO, Knapsack-RL, DARS): an embedded arithmetic task and file loaders.

Embedded task (``task="reversed_addition"``, this collection's shared CPU task for the RLVR papers):
the prompt is ``a+b=`` and the target is the digits of a+b **least-significant first** (reversal makes carries
learnable for a tiny model), followed by EOS; reward 1 for an exact match. Vocabulary: ``0-9 + =`` plus PAD, BOS,
EOS (15 ids). Difficulty tier = max(#digits(a), #digits(b)).

* RL train pool: ``train_pool_size`` (512) prompts stratified over ``digit_tiers`` ({2, 3, 4, 5}, 128 each), fixed
  for the whole run (history-based allocators need to revisit prompts) with stable ids 0..M-1.
* Held-out test pool: ``test_pool_size`` prompts with the same strata, disjoint from the train pool, ids
  1_000_000 + i (validation / test / predict).
* SFT split (``train_split="sft"``, the supervised warm-up): ``sft_num_examples`` fresh sums with 1..``sft_max_digits``
  digits plus a ``sft_extra_fraction`` (5%) of ``sft_extra_digits``-digit sums, none of them in either pool
  (reconstruction of "freshly generated"; excluding both pools keeps the test pool held out and the
  RL pool unseen). SFT batches are shuffled per epoch (``sft_sampling="shuffle"``), or drawn with replacement,
  ``sft_batch_size`` uniform indices per step from one stream seeded with ``seed`` (``"replacement"``,
  `datamodules.sampling.ReplacementSampler`: the sampling of the RLVR experiments' former hand-written warm-up
  loop, kept so that their SFT checkpoints stay the same).

File loaders (``task="jsonl"`` or ``"parquet"``), files ``data_dir/train_file`` and ``data_dir/val_file``:

* JSONL, one object per line: ``question`` or ``prompt`` (a string or a chat list ``[{"role", "content"}]``) and
  ``answer`` / ``answers`` (a string, a number or a list of acceptable answers); optional ``id``, ``tier``.
* verl-style parquet: ``prompt`` as a chat list, ``reward_model.ground_truth`` (string or list),
  ``extra_info.index`` as the stable id; plain ``question``/``answer`` columns work too.
* Prompt ids: ``id`` / ``extra_info.index`` (non-negative integers, unique within a file), else the row number;
  string ids (DAPO-Math-17k's ``extra_info.index`` is a UUID) must be unique and give the row number too (the
  string is kept as ``source_id``).
  Each split numbers its rows from 0 (verl's ``extra_info.index`` restarts in every split), and ids key the
  rollout allocators' per-prompt history and the evaluation, so the evaluation file's ids are shifted by
  ``TEST_ID_OFFSET`` (1_000_000, or the next ``1_000_000 * 10**k`` above the largest training id): as in the
  embedded task, evaluation id = offset + the file's id (``eval_id_offset`` on the datamodule).
  Missing files, unreadable lines and missing fields raise `UserInputError` naming file, line/row and field.
  Without ``tokenizer_path`` a `CharTokenizer` over the characters of the files is used; with it, the tokenizer
  of a local transformers folder (chat prompts go through its chat template when it has one).

Batches (the interface every RLVR module reads): ``prompt_ids`` [M], ``prompt_tokens`` [M, Lp] LEFT-padded
(BOS first when the tokenizer has one), ``prompt_mask`` [M, Lp], ``answers`` (M lists of strings), ``tier`` [M].
SFT batches: ``input_tokens`` [B, L] RIGHT-padded ``BOS prompt target EOS`` and ``loss_mask`` [B, L], True where
the token is a supervised target (target and EOS; predicted from the previous position).

The verifier (`extract_answer`, `normalize_math_answer`, `answers_match`) lives in `lightning_modules.rlvr.answers`,
shared by the rewards and the data.
"""
from __future__ import annotations

import json
import os
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from datamodules.sampling import (LoaderGeneratorReplaySampler, ReplacementSampler, evaluation_sampler,
                                  training_sampler)
from lightning_modules.shared.errors import UserInputError, check_range

TEST_ID_OFFSET = 1_000_000


def evaluation_id_offset(train_ids, base: int = TEST_ID_OFFSET) -> int:
    """The shift for evaluation prompt ids: `base`, times 10 until it exceeds every (non-negative) training id."""
    top, offset = max(train_ids, default=-1), base
    while offset <= top:
        offset *= 10
    return offset


# --------------------------------------------------------------------------------------------- tokenizers
class CharTokenizer:
    """One id per character of `alphabet`, after PAD=0, BOS=1, EOS=2 (15 ids for the default arithmetic alphabet)."""

    def __init__(self, alphabet: str = "0123456789+=") -> None:
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise UserInputError(f"CharTokenizer: alphabet {alphabet!r} must be non-empty without repeated characters.")
        self.alphabet = alphabet
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.vocab_size = 3 + len(alphabet)
        self._to_id = {c: i + 3 for i, c in enumerate(alphabet)}

    def encode(self, text: str) -> list[int]:
        try:
            return [self._to_id[c] for c in text]
        except KeyError as err:
            raise UserInputError(f"CharTokenizer: character {err.args[0]!r} of {text[:60]!r} is not in the alphabet "
                                 f"{self.alphabet!r}.") from None

    def decode(self, ids) -> str:
        return "".join(self.alphabet[i - 3] for i in (int(t) for t in ids) if i >= 3)


class HFTokenizer:
    """The tokenizer of a local transformers folder, behind the same small interface as `CharTokenizer`."""

    def __init__(self, path: str, use_chat_template: bool = True) -> None:
        if not os.path.isdir(path):
            raise UserInputError(f"tokenizer_path '{path}' is not a folder (expected a save_pretrained folder).")
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as err:
            raise UserInputError(f"tokenizer_path '{path}': no tokenizer could be loaded ({err}).") from None
        tok = self.tokenizer
        self.eos_id = tok.eos_token_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if self.pad_id is None:
            raise UserInputError(f"tokenizer at '{path}' has neither a pad nor an eos token; add one.")
        self.bos_id = tok.bos_token_id
        self.vocab_size = len(tok)
        self.use_chat_template = use_chat_template and bool(getattr(tok, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def render_chat(self, messages: list[dict]) -> str:
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n".join(m["content"] for m in messages)


def render_prompt(prompt, tokenizer) -> str:
    """A prompt as text: strings stay, chat lists go through the tokenizer's chat template (or are joined)."""
    if isinstance(prompt, str):
        return prompt
    if hasattr(tokenizer, "render_chat"):
        return tokenizer.render_chat(prompt)
    return "\n".join(m["content"] for m in prompt)


# --------------------------------------------------------------------------------------------- collation
def collate_prompts(examples: list[dict], tokenizer) -> dict:
    """Examples ``{"prompt_id", "prompt" (text) | "prompt_token_ids", "answers", "tier"}`` -> a LEFT-padded batch."""
    rows = []
    for ex in examples:
        ids = ex.get("prompt_token_ids")
        if ids is None:
            ids = tokenizer.encode(ex["prompt"])
        rows.append(([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + list(ids))
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            tokens[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = True
    return {"prompt_ids": torch.tensor([int(ex["prompt_id"]) for ex in examples], dtype=torch.long),
            "prompt_tokens": tokens, "prompt_mask": mask,
            "answers": [list(ex["answers"]) for ex in examples],
            "tier": torch.tensor([int(ex.get("tier", -1)) for ex in examples], dtype=torch.long)}


def collate_sft(examples: list[dict], tokenizer) -> dict:
    """Examples ``{"prompt", "target"}`` -> RIGHT-padded ``BOS prompt target EOS`` with the target's loss mask."""
    rows, masks = [], []
    for ex in examples:
        head = ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + tokenizer.encode(ex["prompt"])
        tail = tokenizer.encode(ex["target"]) + ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
        rows.append(head + tail)
        masks.append([False] * len(head) + [True] * len(tail))
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, :len(r)] = torch.tensor(r)
        loss_mask[i, :len(m)] = torch.tensor(m)
    return {"input_tokens": tokens, "loss_mask": loss_mask}


class PromptCollator:
    """Picklable collate_fn binding a tokenizer (DataLoader workers cannot pickle lambdas)."""

    def __init__(self, tokenizer, sft: bool = False) -> None:
        self.tokenizer, self.sft = tokenizer, sft

    def __call__(self, examples):
        return (collate_sft if self.sft else collate_prompts)(examples, self.tokenizer)


# --------------------------------------------------------------------------------------------- embedded task
def reversed_sum(a: int, b: int) -> str:
    return str(a + b)[::-1]


def _numbers_with_digits(rng: np.random.Generator, digits: np.ndarray) -> np.ndarray:
    low = np.where(digits == 1, 0, 10 ** (digits - 1).astype(np.int64))
    return rng.integers(low, 10 ** digits.astype(np.int64))


def sample_pairs(rng: np.random.Generator, max_digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (a, b) with max(#digits) == max_digits[i]: one operand has that many digits, the other 1..that many."""
    other = rng.integers(1, max_digits + 1)
    first = _numbers_with_digits(rng, max_digits)
    second = _numbers_with_digits(rng, other)
    swap = rng.random(len(max_digits)) < 0.5
    return np.where(swap, second, first), np.where(swap, first, second)


def stratified_pool(rng: np.random.Generator, size: int, tiers: list[int], exclude: set[tuple[int, int]]) -> list:
    """`size` distinct (a, b, tier) with an equal share per tier (remainder to the first tiers), none in `exclude`."""
    pool, seen = [], set(exclude)
    for position, tier in enumerate(tiers):
        want = size // len(tiers) + (position < size % len(tiers))
        got = 0
        for _ in range(1000):
            a, b = sample_pairs(rng, np.full(4 * want + 16, tier))
            for x, y in zip(a.tolist(), b.tolist()):
                if got < want and (x, y) not in seen:
                    seen.add((x, y))
                    pool.append((x, y, tier))
                    got += 1
            if got == want:
                break
        if got < want:
            raise UserInputError(f"only {got} distinct {tier}-digit sums are available for a pool needing {want}; "
                                 "lower the pool size or use larger digit tiers.")
    return pool


def addition_example(prompt_id: int, a: int, b: int, tier: int) -> dict:
    return {"prompt_id": prompt_id, "prompt": f"{a}+{b}=", "answers": [reversed_sum(a, b)], "tier": tier}


class ListDataset(Dataset):
    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class AdditionSFTDataset(Dataset):
    """Fresh sums for the supervised warm-up (numpy arrays; examples built on access)."""

    def __init__(self, a: np.ndarray, b: np.ndarray) -> None:
        self.a, self.b = a, b

    def __len__(self) -> int:
        return len(self.a)

    def __getitem__(self, i):
        a, b = int(self.a[i]), int(self.b[i])
        return {"prompt": f"{a}+{b}=", "target": reversed_sum(a, b)}


# --------------------------------------------------------------------------------------------- file loaders
def _get(record: dict, dotted: str):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            return None
        value = value[part]
    return value


def record_to_example(record, where: str, position: int) -> dict:
    """One JSONL object / parquet row -> an example; `where` (file:line) names the culprit in errors."""
    if not isinstance(record, dict):
        raise UserInputError(f"{where}: expected a JSON object, got {type(record).__name__}.")
    prompt = _get(record, "prompt")
    if prompt is None:
        prompt = _get(record, "question")
    if prompt is None:
        raise UserInputError(f"{where}: missing field 'question' or 'prompt' (found fields {sorted(record)}).")
    if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):
        prompt = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        if not prompt or not all(isinstance(m, dict) and "content" in m for m in prompt):
            raise UserInputError(f"{where}: field 'prompt' must be a string or a chat list of "
                                 "{'role': ..., 'content': ...} messages.")
    elif not isinstance(prompt, str):
        raise UserInputError(f"{where}: field 'prompt'/'question' must be a string or a chat list, "
                             f"got {type(prompt).__name__}.")
    answers = None
    for field in ("answers", "answer", "reward_model.ground_truth", "ground_truth"):
        answers = _get(record, field)
        if answers is not None:
            break
    if answers is None:
        raise UserInputError(f"{where}: missing field 'answer', 'answers' or 'reward_model.ground_truth' "
                             f"(found fields {sorted(record)}).")
    if hasattr(answers, "tolist"):
        answers = answers.tolist()
    answers = [str(a) for a in (answers if isinstance(answers, (list, tuple)) else [answers])]
    if not answers:
        raise UserInputError(f"{where}: the answer list is empty.")
    prompt_id = _get(record, "id")
    if prompt_id is None:
        prompt_id = _get(record, "extra_info.index")
    if prompt_id is None:
        prompt_id = position
    source_id = None
    try:
        prompt_id = int(prompt_id)
    except (TypeError, ValueError):
        if not isinstance(prompt_id, str) or not prompt_id.strip():
            raise UserInputError(f"{where}: field 'id' / 'extra_info.index' must be an integer or a non-empty "
                                 f"string, got {prompt_id!r}.") from None
        source_id, prompt_id = prompt_id, position  # a string key (DAPO-Math-17k's UUIDs): see `_checked`
    if prompt_id < 0:
        raise UserInputError(f"{where}: field 'id' / 'extra_info.index' is {prompt_id}; ids must be >= 0.")
    tier = next((t for t in (_get(record, k) for k in ("tier", "level", "difficulty")) if t is not None), -1)
    try:
        tier = int(tier)
    except (TypeError, ValueError):
        tier = -1  # textual levels ("Level 3" in MATH) are not tiers
    example = {"prompt_id": prompt_id, "prompt": prompt, "answers": answers, "tier": tier}
    if source_id is not None:
        example["source_id"] = source_id
    return example


def load_jsonl(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise UserInputError(f"data file '{path}' does not exist. Expected JSONL with one object per line holding "
                             "'question' (or 'prompt') and 'answer' (or 'answers').")
    examples = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserInputError(f"{path}:{line_number}: not valid JSON ({err.msg}).") from None
            examples.append(record_to_example(record, f"{path}:{line_number}", len(examples)))
    return _checked(examples, path)


def load_parquet(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise UserInputError(f"data file '{path}' does not exist. Expected a parquet file with 'prompt' (chat list "
                             "or string) and 'reward_model.ground_truth' (verl) or 'question'/'answer' columns.")
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise UserInputError(f"reading '{path}' needs a working pyarrow (pip install pyarrow): {err}") from None

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several unrelated types for a bad file
        raise UserInputError(f"{path}: not a readable parquet file ({type(err).__name__}: {err}).") from None
    return _checked([record_to_example(r, f"{path}: row {i}", i) for i, r in enumerate(rows)], path)


def _checked(examples: list[dict], path: str) -> list[dict]:
    if not examples:
        raise UserInputError(f"{path}: the file holds no examples.")
    keys = [ex.get("source_id") for ex in examples]
    if any(key is not None for key in keys):
        # string ids (DAPO-Math-17k's extra_info.index is a UUID): the prompt id is the row number, which is as
        # stable as the file; the strings must still name distinct prompts
        strings = [key for key in keys if key is not None]
        if len(strings) != len(keys):
            raise UserInputError(f"{path}: 'id' / 'extra_info.index' mixes integers and strings; use one kind.")
        if len(set(strings)) != len(strings):
            duplicate = next(k for k in strings if strings.count(k) > 1)
            raise UserInputError(f"{path}: prompt id {duplicate!r} appears more than once; ids ('id' / "
                                 "'extra_info.index') must be unique.")
        for position, ex in enumerate(examples):
            ex["prompt_id"] = position
    ids = [ex["prompt_id"] for ex in examples]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise UserInputError(f"{path}: prompt id {duplicate} appears more than once; ids ('id' / 'extra_info.index' "
                             "or the line number) must be unique.")
    return examples


# --------------------------------------------------------------------------------------------- datamodule
class VerifiableTaskDataModule(LightningDataModule):
    """Prompt batches with verifiable answers for RLVR, and the SFT split for the warm-up stage.

    Args:
        task: ``reversed_addition`` (embedded, no files), ``jsonl`` or ``parquet`` (files under ``data_dir``).
        data_dir, train_file, val_file: file locations (defaults ``train.<task>`` / ``test.<task>``).
        batch_size: prompts per RL step (M); ``eval_batch_size``: prompts per validation batch.
        train_split: ``rl`` (prompt batches) or ``sft`` (supervised batches of the warm-up stage).
        sft_batch_size: sequences per SFT step.
        train_pool_size, test_pool_size, digit_tiers: the embedded pools (stratified by max #digits; a tier
            listed k times gets k shares, e.g. ``[2, 2, 3]``: two thirds 2-digit sums).
        sft_num_examples, sft_max_digits, sft_extra_digits, sft_extra_fraction: the embedded SFT split.
        sft_sampling: ``shuffle`` (a permutation per epoch) or ``replacement`` (uniform draws with replacement).
        tokenizer_path: local transformers folder whose tokenizer to use (default: a character tokenizer).
        use_chat_template: render chat-list prompts with that tokenizer's chat template.
        max_prompt_tokens: refuse prompts longer than this (None: no limit); prompts are never truncated.
        seed: pools, SFT data and shuffling.
    """

    def __init__(self, task: Literal["reversed_addition", "jsonl", "parquet"] = "reversed_addition",
                 data_dir: str | None = None, train_file: str | None = None, val_file: str | None = None,
                 batch_size: int = 32, eval_batch_size: int = 64, train_split: Literal["rl", "sft"] = "rl",
                 sft_batch_size: int = 128, train_pool_size: int = 512, test_pool_size: int = 512,
                 digit_tiers: list[int] | None = None, sft_num_examples: int = 200_000, sft_max_digits: int = 3,
                 sft_extra_digits: int = 4, sft_extra_fraction: float = 0.05, tokenizer_path: str | None = None,
                 use_chat_template: bool = True, max_prompt_tokens: int | None = None, seed: int = 0,
                 num_workers: int = 0, sft_sampling: Literal["shuffle", "replacement"] = "shuffle") -> None:
        super().__init__()
        self.save_hyperparameters()
        for name in ("batch_size", "eval_batch_size", "sft_batch_size", "train_pool_size", "test_pool_size",
                     "sft_num_examples", "sft_max_digits", "sft_extra_digits"):
            check_range(name, getattr(self.hparams, name), low=1)
        check_range("sft_extra_fraction", sft_extra_fraction, 0.0, 1.0)
        if sft_sampling not in ("shuffle", "replacement"):
            raise UserInputError(f"sft_sampling={sft_sampling!r}: choose shuffle or replacement.")
        digit_tiers = [2, 3, 4, 5] if digit_tiers is None else list(digit_tiers)
        self.digit_tiers = digit_tiers
        if task == "reversed_addition":
            if not digit_tiers or any(int(d) < 1 or int(d) > 9 for d in digit_tiers):
                raise UserInputError(f"digit_tiers={list(digit_tiers)}: give digit counts between 1 and 9.")
        elif data_dir is None:
            raise UserInputError(f"task={task!r} reads files: set data_dir (folder with {train_file or 'train.' + task}"
                                 f" and {val_file or 'test.' + task}).")
        self.task = task
        self.tokenizer = HFTokenizer(tokenizer_path, use_chat_template) if tokenizer_path else None
        self.train_examples: list[dict] | None = None
        self.val_examples: list[dict] | None = None
        self.sft_dataset: Dataset | None = None
        self.eval_id_offset = TEST_ID_OFFSET
        if task == "reversed_addition" and self.tokenizer is None:
            self.tokenizer = CharTokenizer()
        if task != "reversed_addition":
            self._load_files()

    # ------------------------------------------------------------------ building the splits
    def _load_files(self) -> None:
        h = self.hparams
        loader = load_jsonl if self.task == "jsonl" else load_parquet
        self.train_examples = loader(os.path.join(h.data_dir, h.train_file or f"train.{self.task}"))
        self.val_examples = loader(os.path.join(h.data_dir, h.val_file or f"test.{self.task}"))
        # each file numbers its prompts from 0: shift the evaluation ids past the training ids (module docstring)
        self.eval_id_offset = evaluation_id_offset([ex["prompt_id"] for ex in self.train_examples])
        for ex in self.val_examples:
            ex["prompt_id"] += self.eval_id_offset
        if self.tokenizer is None:  # a character vocabulary over every prompt and answer of both files
            chars = set()
            for ex in self.train_examples + self.val_examples:
                chars.update(render_prompt(ex["prompt"], None))
                for a in ex["answers"]:
                    chars.update(a)
            self.tokenizer = CharTokenizer("".join(sorted(chars)))
        for examples in (self.train_examples, self.val_examples):
            for ex in examples:
                ex["prompt"] = render_prompt(ex["prompt"], self.tokenizer)
        self.sft_dataset = ListDataset([{"prompt": ex["prompt"], "target": ex["answers"][0]}
                                        for ex in self.train_examples])

    def _build_embedded(self) -> None:
        h = self.hparams
        rng = np.random.default_rng(h.seed)
        tiers = [int(d) for d in self.digit_tiers]
        train = stratified_pool(rng, h.train_pool_size, tiers, set())
        test = stratified_pool(rng, h.test_pool_size, tiers, {(a, b) for a, b, _ in train})
        self.train_examples = [addition_example(i, a, b, t) for i, (a, b, t) in enumerate(train)]
        self.val_examples = [addition_example(TEST_ID_OFFSET + i, a, b, t) for i, (a, b, t) in enumerate(test)]
        extra = rng.random(h.sft_num_examples) < h.sft_extra_fraction
        digits = np.where(extra, h.sft_extra_digits, rng.integers(1, h.sft_max_digits + 1, h.sft_num_examples))
        a, b = sample_pairs(rng, digits)
        pooled = np.array([a_ * 10**10 + b_ for a_, b_, _ in train + test], dtype=np.int64)
        keep = ~np.isin(a.astype(np.int64) * 10**10 + b, pooled)
        self.sft_dataset = AdditionSFTDataset(a[keep], b[keep])

    def setup(self, stage: str | None = None) -> None:
        if self.train_examples is None:
            self._build_embedded()
        limit = self.hparams.max_prompt_tokens
        if limit is not None:
            for ex in self.train_examples + self.val_examples:
                if len(self.tokenizer.encode(ex["prompt"])) > limit:
                    raise UserInputError(f"prompt id {ex['prompt_id']} has more than max_prompt_tokens={limit} "
                                         "tokens; raise the limit or filter the data (prompts are not truncated).")

    # ------------------------------------------------------------------ loaders
    def _loader(self, dataset, batch_size: int, shuffle: bool, sft: bool = False, shard: bool = False) -> DataLoader:
        # training: an order that is a pure function of (seed, epoch), so a resumed run continues it; evaluation
        # under DDP (shard): unpadded shards, so that reduced metrics equal one process's (datamodules.sampling)
        if shuffle and sft and self.hparams.sft_sampling == "replacement":
            sampler = training_sampler(len(dataset), self.hparams.seed, self.trainer, ReplacementSampler,
                                       batch_size=batch_size)
        elif shuffle:
            sampler = training_sampler(len(dataset), self.hparams.seed, self.trainer, LoaderGeneratorReplaySampler,
                                       batch_size=batch_size)
        else:
            sampler = evaluation_sampler(dataset, self.trainer) if shard else None
        generator = torch.Generator().manual_seed(self.hparams.seed) if shuffle else None
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=generator,
                          collate_fn=PromptCollator(self.tokenizer, sft=sft), num_workers=self.hparams.num_workers)

    def train_dataloader(self) -> DataLoader:
        if self.hparams.train_split == "sft":
            return self._loader(self.sft_dataset, self.hparams.sft_batch_size, shuffle=True, sft=True)
        return self._loader(ListDataset(self.train_examples), self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(ListDataset(self.val_examples), self.hparams.eval_batch_size, shuffle=False, shard=True)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def train_pool_loader(self, batch_size: int | None = None) -> DataLoader:
        """The RL train pool in fixed order (for per-prompt success estimates, e.g. the p-histogram)."""
        return self._loader(ListDataset(self.train_examples), batch_size or self.hparams.eval_batch_size, False)
