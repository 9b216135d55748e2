"""Emotion data for the hierarchy probe of "Emergence of Hierarchical Emotion Organization in Large Language
Models" (Zhao, Okawa, et al., ICML 2026, arXiv 2507.10599): a planted-hierarchy corpus for training small
language models, and scenario text files for probing real ones.

Emotion vocabulary: the prototype hierarchy of Shaver, Schwartz, Kirson & O'Connor (1987, J. Pers. Soc. Psychol.
52(6)), the word list the paper uses: 6 basic emotions (love, joy, surprise, anger, sadness, fear) and 129
subordinate words (love 15, joy 32, surprise 2, anger 28, sadness 36, fear 16), 135 words in all.

Planted corpus (``source: planted``, the embedded default; a CPU stand-in for web text, designed for this
collection, not from the paper). Parents are the 6 basic words, each with ``children_per_parent`` of its Shaver
subordinate words (surprise has only 2). For a "world" drawn from the seed, every leaf and every parent has a
distribution over ``num_context_words`` context words (Dirichlet(``context_alpha``)). A sentence picks a leaf e
uniformly, draws ``words_per_sentence`` context words from the 50/50 mixture of e's and its parent's
distributions, and ends with ``the emotion is <label>`` where the label is e (``p_leaf``), its parent
(``p_parent``), a sibling (``p_sibling``) or any emotion word (the rest): label noise that plants the
parent-child co-occurrence the probe recovers. Optional personas prefix every sentence with a persona token; for
``biased_persona`` a fraction ``bias_rate`` of the labels in the ``bias_from`` family is replaced by the
corresponding word of the ``bias_to`` family (parent by parent, j-th child by j-th child): the planted bias.

Splits: training sentences (``num_train``) as supervised LM batches; validation and test prompts (``num_val``,
``num_test``) as ``[persona] context the emotion is`` with the true leaf as the answer (validation uses the
training mix of personas; test and predict use ``probe_persona``, the persona prefix of the probe). Every split
has its own random stream of the seed; the world is shared.

Scenario files (``source: file``), read as the official code reads them (github.com/phys-ai/Emotion-Hierarchy-LLMs,
``emotion_hierarchy/scoring.py``, functions ``read_lines`` and ``read_scenarios``): a ``*.jsonl`` ``scenario_file``
holds one ``{"label": ..., "text": ...}`` object per line (the released ``data/recognition_scenarios.jsonl``, 20
scenarios for each of the 135 words; blank lines skipped); any other file holds one scenario per line, optionally
followed by a TAB and its emotion label, and every line is a prompt, an empty one too (the released
``data/hierarchy_prompts.txt`` has 5,000 rows, 3 of them empty, and the official scoring keeps them all). The
``prompt_id`` of a prompt is its 0-based record number in the file, so predictions line up with the official
scoring order. A label must be one of the 135 words; a JSON record in a plain-text file, invalid JSON, an unknown
label or a file without any scenario end in a `UserInputError` naming file and line. The probe prompt is
``prompt_template`` formatted with the stripped scenario and ``persona``. The official prompts are
``"{scenario} The emotion in this sentence is"`` for the trees (the default; an empty row gives
``" The emotion in this sentence is"`` as there) and ``"{scenario}\\n<persona prefix>I think the emotion involved in
this situation is"`` for recognition, with the prefixes of ``data/personas.json`` (``"As a woman, "``, ...;
``""`` for the neutral persona): ``"{scenario}\\nAs a {persona}, I think the emotion involved in this situation
is"`` with ``persona: woman`` writes the same prompt. The tokenizer comes from ``tokenizer_path`` (a local
transformers folder; nothing is downloaded). Files are for probing only: there is no training split.

Batches: training ``input_tokens`` [B, L] right-padded ``BOS sentence EOS`` and ``loss_mask`` (``loss_on: all``:
every token after BOS, plain language modelling; ``label``: the label and EOS only), the interface of
`lightning_modules.rlvr.sft.SupervisedWarmup`. Evaluation: ``prompt_tokens`` [M, Lp] left-padded, ``prompt_mask``,
``prompt_ids``, ``answers`` (M lists), ``labels`` [M] (index into ``emotion_words``; -1 = unlabelled).
"""
from __future__ import annotations

import json
import os
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from datamodules.sampling import LoaderGeneratorReplaySampler, evaluation_sampler, training_sampler
from datamodules.verifiable_tasks import HFTokenizer, ListDataset, collate_prompts
from lightning_modules.shared.errors import UserInputError, check_range

# Shaver et al. (1987), Figure 1: basic category -> subordinate words (the basic word itself excluded).
SHAVER_BASIC = ("love", "joy", "surprise", "anger", "sadness", "fear")
SHAVER_SUBORDINATE = {
    "love": ("adoration", "affection", "fondness", "liking", "attraction", "caring", "tenderness", "compassion",
             "sentimentality", "arousal", "desire", "lust", "passion", "infatuation", "longing"),
    "joy": ("amusement", "bliss", "cheerfulness", "gaiety", "glee", "jolliness", "joviality", "delight",
            "enjoyment", "gladness", "happiness", "jubilation", "elation", "satisfaction", "ecstasy", "euphoria",
            "enthusiasm", "zeal", "zest", "excitement", "thrill", "exhilaration", "contentment", "pleasure", "pride",
            "triumph", "eagerness", "hope", "optimism", "enthrallment", "rapture", "relief"),
    "surprise": ("amazement", "astonishment"),
    "anger": ("aggravation", "irritation", "agitation", "annoyance", "grouchiness", "grumpiness", "exasperation",
              "frustration", "rage", "outrage", "fury", "wrath", "hostility", "ferocity", "bitterness", "hate",
              "loathing", "scorn", "spite", "vengefulness", "dislike", "resentment", "disgust", "revulsion",
              "contempt", "envy", "jealousy", "torment"),
    "sadness": ("agony", "suffering", "hurt", "anguish", "depression", "despair", "hopelessness", "gloom",
                "glumness", "unhappiness", "grief", "sorrow", "woe", "misery", "melancholy", "dismay",
                "disappointment", "displeasure", "guilt", "shame", "regret", "remorse", "alienation", "isolation",
                "neglect", "loneliness", "rejection", "homesickness", "defeat", "dejection", "insecurity",
                "embarrassment", "humiliation", "insult", "pity", "sympathy"),
    "fear": ("alarm", "shock", "fright", "horror", "terror", "panic", "hysteria", "mortification", "anxiety",
             "nervousness", "tenseness", "uneasiness", "apprehension", "worry", "distress", "dread"),
}
# the children of the planted corpus: well-known members of each family, in this order
PLANTED_CHILDREN = {
    "love": ("affection", "passion", "longing", "tenderness", "compassion", "desire"),
    "joy": ("happiness", "pride", "relief", "excitement", "delight", "hope"),
    "surprise": ("amazement", "astonishment"),
    "anger": ("irritation", "rage", "disgust", "envy", "frustration", "hate"),
    "sadness": ("grief", "shame", "loneliness", "despair", "guilt", "sorrow"),
    "fear": ("terror", "anxiety", "worry", "panic", "horror", "dread"),
}
TEMPLATE_WORDS = ("the", "emotion", "is")
PLANTED_PROMPT = "the emotion is"


def shaver_words() -> tuple[list[str], list[int], list[bool]]:
    """The 135 words, the basic-category index of each and whether it is one of the 6 basic words."""
    words, category, basic = [], [], []
    for c, name in enumerate(SHAVER_BASIC):
        for word in (name,) + SHAVER_SUBORDINATE[name]:
            words.append(word)
            category.append(c)
            basic.append(word == name)
    return words, category, basic


class WordTokenizer:
    """One id per whitespace-separated word of a closed vocabulary, after PAD=0, BOS=1, EOS=2."""

    def __init__(self, words: list[str]) -> None:
        if len(set(words)) != len(words):
            raise UserInputError("WordTokenizer: the vocabulary repeats a word.")
        self.words = list(words)
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.vocab_size = 3 + len(words)
        self._to_id = {w: i + 3 for i, w in enumerate(words)}

    def encode(self, text: str) -> list[int]:
        try:
            return [self._to_id[w] for w in text.split()]
        except KeyError as err:
            raise UserInputError(f"WordTokenizer: word {err.args[0]!r} of {text[:60]!r} is not in the "
                                 "vocabulary of the planted corpus.") from None

    def decode(self, ids) -> str:
        return " ".join(self.words[i - 3] for i in (int(t) for t in ids) if i >= 3)


def read_scenarios(path: str, words: list[str]) -> list[tuple[str, int]]:
    """``(scenario, label index or -1)`` per record of ``path``, in file order, read as the official code reads it.

    * ``*.jsonl``: one JSON object per line with the scenario in ``text`` and its emotion in ``label`` (the
      official ``data/recognition_scenarios.jsonl``); blank lines are skipped and ``text`` is stripped, as in
      ``emotion_hierarchy/scoring.py::read_scenarios`` of github.com/phys-ai/Emotion-Hierarchy-LLMs. A record
      without ``label`` (or ``null``) is unlabelled.
    * any other name: one scenario per line, optionally followed by a TAB and its label. Every physical line is
      a record, an empty one too (it becomes the prompt with an empty scenario), as
      ``scoring.py::read_lines`` keeps the 3 empty rows of the official ``data/hierarchy_prompts.txt`` so that its
      5,000 rows are all scored.

    A label must be one of ``words`` (case-insensitive); anything else is a `UserInputError` naming the line.
    """
    if not os.path.isfile(path):
        raise UserInputError(f"scenario_file '{path}' does not exist: give a text file with one scenario per line "
                             "(optionally followed by a TAB and its emotion label), or a .jsonl file of "
                             '{"text": ..., "label": ...} records.')
    index = {w: i for i, w in enumerate(words)}
    reader = _read_scenario_jsonl if path.lower().endswith(".jsonl") else _read_scenario_lines
    with open(path, encoding="utf-8") as f:
        rows = reader(f, path, index, words)
    if not any(text for text, _ in rows):
        raise UserInputError(f"scenario_file '{path}' holds no scenario (it is empty or blank): write one scenario "
                             "per line.")
    return rows


def _label_index(label: str, path: str, number: int, index: dict[str, int], words: list[str]) -> int:
    label = label.strip().lower()
    if not label:
        return -1
    if label not in index:
        raise UserInputError(f"{path}, line {number}: label {label!r} is not one of the {len(words)} emotion words "
                             f"(e.g. {', '.join(words[:4])}, ...); fix the label or drop it (unlabelled scenarios "
                             "still build the tree).")
    return index[label]


def _read_scenario_lines(lines, path: str, index: dict[str, int], words: list[str]) -> list[tuple[str, int]]:
    rows = []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r\n")
        text, _, label = line.partition("\t")
        if text.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict):
                raise UserInputError(f"{path}, line {number} is a JSON record, not a scenario: a file of "
                                     '{"text": ..., "label": ...} lines (like the official '
                                     "recognition_scenarios.jsonl) must be named *.jsonl to be read as JSON lines.")
        if label.strip() and not text.strip():
            raise UserInputError(f"{path}, line {number}: the scenario text before the TAB is empty.")
        rows.append((text.strip(), _label_index(label, path, number, index, words)))
    return rows


def _read_scenario_jsonl(lines, path: str, index: dict[str, int], words: list[str]) -> list[tuple[str, int]]:
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserInputError(f"{path}, line {number}: not valid JSON ({err.msg} at column {err.colno}); write "
                                 'one {"text": ..., "label": ...} object per line.') from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UserInputError(f"{path}, line {number}: expected a JSON object with a string field 'text' (the "
                                 "scenario) and optionally 'label' (its emotion word), got "
                                 f"{line.strip()[:60]!r}.")
        label = record.get("label")
        if label is not None and not isinstance(label, str):
            raise UserInputError(f"{path}, line {number}: 'label' must be an emotion word (a string) or null, got "
                                 f"{label!r}.")
        rows.append((record["text"].strip(), _label_index(label or "", path, number, index, words)))
    return rows


class PlantedWorld:
    """The latent structure of the planted corpus, drawn once from ``seed`` (shared by every split)."""

    def __init__(self, children_per_parent: int, num_context_words: int, context_alpha: float, seed: int) -> None:
        self.parents = list(SHAVER_BASIC)
        self.children = {p: list(PLANTED_CHILDREN[p][:children_per_parent]) for p in self.parents}
        self.words = self.parents + [c for p in self.parents for c in self.children[p]]
        self.index = {w: i for i, w in enumerate(self.words)}
        self.category = [SHAVER_BASIC.index(p) for p in self.parents] + [
            SHAVER_BASIC.index(p) for p in self.parents for _ in self.children[p]]
        self.is_basic = [True] * len(self.parents) + [False] * (len(self.words) - len(self.parents))
        self.leaves = [self.index[c] for p in self.parents for c in self.children[p]]
        self.parent_of = {self.index[c]: self.index[p] for p in self.parents for c in self.children[p]}
        self.edges = [(self.index[p], self.index[c]) for p in self.parents for c in self.children[p]]
        rng = np.random.default_rng([seed, 0])
        alpha = np.full(num_context_words, context_alpha)
        self.leaf_dist = {leaf: rng.dirichlet(alpha) for leaf in self.leaves}
        self.parent_dist = {self.index[p]: rng.dirichlet(alpha) for p in self.parents}
        self.context_words = [f"w{i}" for i in range(num_context_words)]

    def counterpart(self, word: int, source: str, target: str) -> int:
        """The word of family ``target`` that corresponds to ``word`` of family ``source`` (parent to parent,
        j-th child to j-th child, wrapping when ``target`` has fewer children)."""
        name = self.words[word]
        if name == source:
            return self.index[target]
        j = self.children[source].index(name)
        return self.index[self.children[target][j % len(self.children[target])]]


class EmotionCorpusDataModule(LightningDataModule):
    """The planted-hierarchy corpus (train, validate, test) or a scenario file (test/predict) for `EmotionProbe`.

    Args:
        source: ``planted`` (embedded generator) or ``file`` (``scenario_file`` + ``tokenizer_path``).
        num_train, num_val, num_test: sentences per split (planted).
        children_per_parent: Shaver children per basic emotion (at most 6; surprise has 2).
        num_context_words, context_alpha, words_per_sentence: the context-word model.
        p_leaf, p_parent, p_sibling: label noise (the rest: a uniformly random emotion word).
        personas: persona tokens; each training sentence gets one uniformly (empty: no persona prefix).
        biased_persona, bias_from, bias_to, bias_rate: the planted persona bias (see the module docstring).
        probe_persona: persona prefix of the test/predict prompts (must be one of ``personas``; None: the
            training mix for planted data, none for files).
        loss_on: ``all`` (language modelling on every token) or ``label`` (the label and EOS only).
        scenario_file, tokenizer_path, prompt_template, persona: the file source.
        batch_size, eval_batch_size, seed, num_workers: loaders.
    """

    def __init__(self, source: Literal["planted", "file"] = "planted", num_train: int = 30000, num_val: int = 256,
                 num_test: int = 2000, children_per_parent: int = 4, num_context_words: int = 200,
                 context_alpha: float = 0.1, words_per_sentence: int = 6, p_leaf: float = 0.55,
                 p_parent: float = 0.30, p_sibling: float = 0.10, personas: list[str] | None = None,
                 biased_persona: str | None = None, bias_from: str = "fear", bias_to: str = "anger",
                 bias_rate: float = 0.3, probe_persona: str | None = None,
                 loss_on: Literal["all", "label"] = "all", scenario_file: str | None = None,
                 tokenizer_path: str | None = None,
                 prompt_template: str = "{scenario} The emotion in this sentence is", persona: str | None = None,
                 batch_size: int = 64, eval_batch_size: int = 256, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        for name in ("num_train", "num_val", "num_test", "num_context_words", "words_per_sentence", "batch_size",
                     "eval_batch_size"):
            check_range(name, getattr(self.hparams, name), low=1)
        check_range("children_per_parent", children_per_parent, 1, 6)
        check_range("context_alpha", context_alpha, low=0.0, low_inclusive=False)
        for name in ("p_leaf", "p_parent", "p_sibling", "bias_rate"):
            check_range(name, getattr(self.hparams, name), 0.0, 1.0)
        if p_leaf + p_parent + p_sibling > 1.0 + 1e-9:
            raise UserInputError(f"p_leaf + p_parent + p_sibling = {p_leaf + p_parent + p_sibling:.3f} exceeds 1; "
                                 "the rest is the probability of a random label.")
        self.personas = list(personas or [])
        if len(set(self.personas)) != len(self.personas):
            raise UserInputError(f"personas={self.personas} repeats a persona.")
        for name, value in (("biased_persona", biased_persona), ("probe_persona", probe_persona)):
            if source == "planted" and value is not None and value not in self.personas:
                raise UserInputError(f"{name}={value!r} is not one of personas={self.personas}; add it there.")
        for name, value in (("bias_from", bias_from), ("bias_to", bias_to)):
            if value not in SHAVER_BASIC:
                raise UserInputError(f"{name}={value!r}: choose a basic emotion, one of {list(SHAVER_BASIC)}.")
        self.source = source
        self.world: PlantedWorld | None = None
        self.splits: dict[str, list[dict]] = {}
        if source == "planted":
            self.world = PlantedWorld(children_per_parent, num_context_words, context_alpha, seed)
            self.emotion_words = list(self.world.words)
            self.emotion_categories = list(self.world.category)
            self.emotion_is_basic = list(self.world.is_basic)
            self.reference_edges = list(self.world.edges)
            self.tokenizer = WordTokenizer(self.personas + self.world.context_words + list(TEMPLATE_WORDS)
                                           + self.emotion_words)
        elif source == "file":
            if scenario_file is None or tokenizer_path is None:
                raise UserInputError("source='file' needs scenario_file (one scenario per line) and tokenizer_path "
                                     "(the local folder of the probed model's tokenizer).")
            if "{scenario}" not in prompt_template:
                raise UserInputError(f"prompt_template={prompt_template!r} lacks the '{{scenario}}' placeholder.")
            if "{persona}" in prompt_template and not persona:
                raise UserInputError(f"prompt_template={prompt_template!r} has a '{{persona}}' placeholder: set "
                                     "persona (e.g. 'person').")
            self.emotion_words, self.emotion_categories, self.emotion_is_basic = shaver_words()
            self.reference_edges = None
            self.tokenizer = HFTokenizer(tokenizer_path, use_chat_template=False)
        else:
            raise UserInputError(f"source={source!r}: choose 'planted' or 'file'.")
        self.category_names = list(SHAVER_BASIC)

    # ------------------------------------------------------------------ generation
    def _sentences(self, count: int, stream: int, persona: str | None = None) -> list[dict]:
        """``count`` planted sentences from random stream ``stream`` (persona None: the training mix)."""
        h, world = self.hparams, self.world
        rng = np.random.default_rng([h.seed, stream])
        leaves = rng.choice(world.leaves, size=count)
        personas = ([persona] * count if persona is not None else
                    list(rng.choice(self.personas, size=count)) if self.personas else [None] * count)
        label_draw = rng.random(count)
        rows = []
        for i, leaf in enumerate(leaves.tolist()):
            parent = world.parent_of[leaf]
            mix = 0.5 * world.leaf_dist[leaf] + 0.5 * world.parent_dist[parent]
            context = rng.choice(len(mix), size=h.words_per_sentence, p=mix)
            siblings = [w for w, p in world.parent_of.items() if p == parent and w != leaf]
            u = label_draw[i]
            if u < h.p_leaf:
                label = leaf
            elif u < h.p_leaf + h.p_parent:
                label = parent
            elif u < h.p_leaf + h.p_parent + h.p_sibling and siblings:
                label = int(rng.choice(siblings))
            else:
                label = int(rng.integers(len(world.words)))
            if (personas[i] is not None and personas[i] == h.biased_persona
                    and world.category[label] == SHAVER_BASIC.index(h.bias_from) and rng.random() < h.bias_rate):
                label = world.counterpart(label, h.bias_from, h.bias_to)
            head = [] if personas[i] is None else [str(personas[i])]
            prompt = " ".join(head + [world.context_words[c] for c in context] + [PLANTED_PROMPT])
            rows.append({"prompt_id": len(rows), "prompt": prompt, "target": world.words[label],
                         "answers": [world.words[leaf]], "label": leaf})
        return rows

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        if self.splits:
            return
        if self.source == "file":
            scenarios = read_scenarios(h.scenario_file, self.emotion_words)
            rows = [{"prompt_id": i, "prompt": h.prompt_template.format(scenario=text, persona=h.persona),
                     "answers": [self.emotion_words[label]] if label >= 0 else [], "label": label}
                    for i, (text, label) in enumerate(scenarios)]
            self.splits = {"test": rows}
            return
        self.splits = {"train": self._sentences(h.num_train, 1), "val": self._sentences(h.num_val, 2),
                       "test": self._sentences(h.num_test, 3, h.probe_persona)}

    # ------------------------------------------------------------------ loaders
    def _eval_loader(self, split: str) -> DataLoader:
        if split not in self.splits:
            raise UserInputError(f"source='file' has only a test/predict split (scenarios to probe); there is no "
                                 f"{split} split. Train language models on source='planted'.")
        dataset = ListDataset(self.splits[split])
        return DataLoader(dataset, batch_size=self.hparams.eval_batch_size,
                          sampler=evaluation_sampler(dataset, self.trainer), collate_fn=EmotionCollator(self),
                          num_workers=self.hparams.num_workers)

    def train_dataloader(self) -> DataLoader:
        if "train" not in self.splits:
            raise UserInputError("source='file' holds scenarios to probe, not a training corpus: train language "
                                 "models on source='planted' and probe with `train.py test`.")
        dataset = ListDataset(self.splits["train"])
        sampler = training_sampler(len(dataset), self.hparams.seed, self.trainer, LoaderGeneratorReplaySampler,
                                   batch_size=self.hparams.batch_size)
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler,
                          generator=torch.Generator().manual_seed(self.hparams.seed),
                          collate_fn=EmotionCollator(self, train=True), num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


def collate_language_model(rows: list[dict], tokenizer, loss_on: str) -> dict:
    """``BOS prompt target EOS`` right-padded, with the loss mask of ``loss_on`` (``all`` or ``label``)."""
    sequences, masks = [], []
    for row in rows:
        head = tokenizer.encode(row["prompt"])
        tail = tokenizer.encode(row["target"]) + [tokenizer.eos_id]
        sequences.append([tokenizer.bos_id] + head + tail)
        masks.append([False] + [loss_on == "all"] * len(head) + [True] * len(tail))
    width = max(len(s) for s in sequences)
    tokens = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (s, m) in enumerate(zip(sequences, masks)):
        tokens[i, :len(s)] = torch.tensor(s)
        loss_mask[i, :len(m)] = torch.tensor(m)
    return {"input_tokens": tokens, "loss_mask": loss_mask}


class EmotionCollator:
    """Picklable collate_fn: language-model batches for training, probe prompts (with labels) for evaluation."""

    def __init__(self, datamodule: EmotionCorpusDataModule, train: bool = False) -> None:
        self.tokenizer, self.train = datamodule.tokenizer, train
        self.loss_on = datamodule.hparams.loss_on

    def __call__(self, rows: list[dict]) -> dict:
        if self.train:
            return collate_language_model(rows, self.tokenizer, self.loss_on)
        batch = collate_prompts(rows, self.tokenizer)
        batch["labels"] = torch.tensor([int(r["label"]) for r in rows], dtype=torch.long)
        return batch
