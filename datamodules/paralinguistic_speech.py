"""Spoken multiple-choice questions about HOW something is said (pitch, speed, gender, volume) whose transcript
asserts an answer: the data family of VoxParadox (Pang, Chaubey & Soleymani, "Do Audio LLMs Listen or Read?
Analyzing and Mitigating Paralinguistic Failures with VoxParadox", arXiv 2605.27772).

Embedded default: speech synthesised offline with espeak-ng (a system package; ``apt-get install espeak-ng``).
Every clip has all four attributes, drawn uniformly and forced by espeak-ng controls:

* pitch: ``-p 20`` (low) / ``-p 80`` (high); speed: ``-s 110`` (slow) / ``-s 230`` words per minute (fast);
* gender: voice variant ``en-us+m3`` (male) / ``en-us+f3`` (female); volume: amplitude ``-a 25`` (quiet) /
  ``-a 180`` (loud).

Each clip asks about one task, and its sentence is one of five templates per (task, value) that assert a value
("I am talking really fast right now") or one of ten neutral sentences. The training and validation splits are
mostly *congruent* (the sentence asserts the true value; ``congruent_fraction``), the rest neutral text (and
``incongruent_fraction`` contradicting text, 0 by default); the test split is *adversarial*: the sentence always
asserts the other value, as in VoxParadox (paper Sec. 3), so ``adv_label`` (the transcript's answer) never equals
``label`` (the acoustic truth). Options are the task's two values plus two values of other tasks, shuffled.
Generation is deterministic from ``seed``; every clip is synthesised once (espeak-ng's 22,050 Hz output resampled
to 16 kHz with a polyphase filter) and cached as ``.npy`` under ``cache_dir`` keyed by the espeak-ng version and the
clip's parameters, so different seeds share clips.

Each example also carries ``content`` (the sentence id, 50 classes): the content-only pre-training target of the
encoder (`lightning_modules.audio_language_model.SpeechContentPretraining`) and ``attributes`` (the four values,
-1 when unknown) for the per-layer probes (`callbacks.layer_probing.LayerProbing`).

Files (``data_dir``): ``{train,val,test}.jsonl``, one question per line, audio paths relative to ``data_dir``,
16 kHz mono PCM wav (read with the stdlib ``wave`` module):

* ``data_format: jsonl`` (generic): ``{"audio", "question", "options": [...], "label"}``, optional ``task`` and
  ``adv_label``;
* ``data_format: voxparadox``: the fields of a VoxParadox item as shown on the project page (voxparadox.github.io):
  ``{"task", "audio", "question", "options", "true_label", "adversarial_label"}``; ``options`` is a list or a
  mapping ``{"A": ..., "B": ...}``, labels are an option text or its letter. The public release's exact column
  names were not available when this was written; rename columns to these if they differ.

A label that is not among the options, a question without options, missing or unreadable audio and a sampling
rate other than 16 kHz are each one `UserInputError` naming the file and line. Words are tokenised on whitespace
into a vocabulary built from the embedded questions plus every question of the files (ids are a property of the
text, not a statistic of a split); each option text is ONE token ``<option text>`` so that the model scores an
option by one logit.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import wave
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from datamodules.sampling import evaluation_sampler, training_sampler
from lightning_modules.errors import UserInputError, check_range

SAMPLE_RATE = 16_000
TASKS = ("pitch", "speed", "gender", "volume")
VALUES = {"pitch": ("low", "high"), "speed": ("slow", "fast"), "gender": ("male", "female"),
          "volume": ("quiet", "loud")}
ESPEAK_CONTROLS = {"pitch": {"low": 20, "high": 80}, "speed": {"slow": 110, "fast": 230},
                   "gender": {"male": "m3", "female": "f3"}, "volume": {"quiet": 25, "loud": 180}}
CLAIMS = {
    ("pitch", "low"): ["i am speaking in a very deep low voice", "my voice is low and deep today",
                       "listen to how low my voice sounds", "this is my deepest bass voice",
                       "i always talk with a low pitch"],
    ("pitch", "high"): ["i am speaking in a very high squeaky voice", "my voice is high and thin today",
                        "listen to how high my voice sounds", "this is my highest little voice",
                        "i always talk with a high pitch"],
    ("speed", "slow"): ["i am talking really slowly right now", "i speak slowly and calmly",
                        "listen to me talk so slowly", "my words come out very slowly",
                        "i am taking my time and speaking slowly"],
    ("speed", "fast"): ["i am talking really fast right now", "i speak quickly and in a rush",
                        "listen to me talk so fast", "my words come out very quickly",
                        "i am in a hurry and speaking fast"],
    ("gender", "male"): ["i am a man and proud of it", "as a father i love my sons", "i am just a regular guy",
                         "speaking as a husband and a dad", "i am a gentleman from the city"],
    ("gender", "female"): ["i am a woman and proud of it", "as a mother i love my daughters",
                           "i am just a regular girl", "speaking as a wife and a mom", "i am a lady from the city"],
    ("volume", "quiet"): ["i am whispering very quietly now", "i speak softly so nobody hears",
                          "this is my quietest voice", "i am keeping my voice down", "i talk in a soft hush"],
    ("volume", "loud"): ["i am shouting very loudly now", "i speak loudly so everybody hears",
                         "this is my loudest voice", "i am raising my voice", "i talk in a booming yell"],
}
NEUTRAL = ["the weather report says rain tomorrow", "the train leaves the station at noon",
           "please close the door behind you", "we planted tomatoes in the garden",
           "the library opens early on monday", "my cousin bought a new bicycle",
           "the soup needs a little more salt", "they painted the kitchen walls green",
           "the meeting was moved to thursday", "a cat is sleeping on the chair"]
SENTENCES = [s for key in CLAIMS for s in CLAIMS[key]] + NEUTRAL     # content classes (50)
QUESTIONS = {"pitch": ["is the pitch of the voice high or low", "what pitch does the speaker use"],
             "speed": ["how fast is the speaker talking", "what is the speaking rate"],
             "gender": ["what is the gender of the speaker", "is the speaker male or female"],
             "volume": ["how loud is the speaker", "what is the loudness of the voice"]}
SPECIALS = ("<pad>", "<unk>", "<options>")
PAD, UNK, OPTIONS = 0, 1, 2
NUM_OPTIONS = 4


# ============================================================================================ synthesis
def espeak_binary() -> str | None:
    """Path of espeak-ng (or espeak), None when neither is installed."""
    return shutil.which("espeak-ng") or shutil.which("espeak")


_VERSIONS: dict[str, str] = {}


def _espeak_version(binary: str) -> str:
    if binary not in _VERSIONS:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        _VERSIONS[binary] = out.stdout.split("Data at")[0].strip()
    return _VERSIONS[binary]


def default_cache_dir() -> str:
    return os.environ.get("ICML26_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "icml26",
                                                       "paralinguistic_speech"))


def read_wav(path: str, where: str = "") -> np.ndarray:
    """A 16 kHz PCM wav as float32 mono in [-1, 1]; a missing/unreadable file or another rate is a UserInputError."""
    prefix = f"{where}: " if where else ""
    if not os.path.isfile(path):
        raise UserInputError(f"{prefix}audio file '{path}' does not exist. Audio paths are relative to data_dir.")
    try:
        with wave.open(path, "rb") as handle:
            rate, channels, width = handle.getframerate(), handle.getnchannels(), handle.getsampwidth()
            frames = handle.readframes(handle.getnframes())
    except (wave.Error, EOFError, OSError) as err:
        raise UserInputError(f"{prefix}'{path}' is not a readable PCM wav file ({err}). Convert it, e.g. "
                             f"`sox in.xxx -r 16000 -c 1 -b 16 out.wav`.") from None
    if rate != SAMPLE_RATE:
        raise UserInputError(f"{prefix}'{path}' is sampled at {rate} Hz but the model expects {SAMPLE_RATE} Hz. "
                             f"Resample it first, e.g. `sox in.wav -r {SAMPLE_RATE} out.wav`.")
    dtypes = {1: np.uint8, 2: np.int16, 4: np.int32}
    if width not in dtypes:
        raise UserInputError(f"{prefix}'{path}' has {8 * width}-bit samples; write 16-bit PCM.")
    audio = np.frombuffer(frames, dtype=dtypes[width]).astype(np.float32)
    audio = (audio - 128.0) / 128.0 if width == 1 else audio / float(2 ** (8 * width - 1))
    return audio.reshape(-1, channels).mean(axis=1) if channels > 1 else audio


def synthesise(text: str, pitch: str, speed: str, gender: str, volume: str, cache_dir: str) -> np.ndarray:
    """One espeak-ng clip at 16 kHz (float32), cached under ``cache_dir`` by version and parameters."""
    binary = espeak_binary()
    if binary is None:
        raise UserInputError("espeak-ng is not installed, so the embedded speech cannot be synthesised. Install it "
                             "(`apt-get install espeak-ng`, `brew install espeak-ng`) or give data_dir.")
    controls = [f"-ven-us+{ESPEAK_CONTROLS['gender'][gender]}", f"-p{ESPEAK_CONTROLS['pitch'][pitch]}",
                f"-s{ESPEAK_CONTROLS['speed'][speed]}", f"-a{ESPEAK_CONTROLS['volume'][volume]}"]
    key = hashlib.sha1("|".join([_espeak_version(binary), *controls, text]).encode()).hexdigest()
    path = os.path.join(cache_dir, f"{key}.npy")
    if os.path.isfile(path):
        return np.load(path)
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "clip.wav")
        subprocess.run([binary, *controls, "-w", raw, text], check=True, capture_output=True)
        with wave.open(raw, "rb") as handle:
            rate = handle.getframerate()
            audio = np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16).astype(np.float32)
    audio /= 32768.0
    if rate != SAMPLE_RATE:
        from math import gcd

        from scipy.signal import resample_poly
        g = gcd(SAMPLE_RATE, rate)
        audio = resample_poly(audio, SAMPLE_RATE // g, rate // g).astype(np.float32)
    partial = f"{path}.{os.getpid()}.tmp.npy"
    np.save(partial, audio)
    os.replace(partial, path)  # atomic: concurrent runs never read half a file
    return audio


# ============================================================================================ vocabulary
def option_token(text: str) -> str:
    return f"<{text}>"


def build_vocabulary(questions: list[str], options: list[str]) -> dict[str, int]:
    words = {w for q in [*questions, *(q for qs in QUESTIONS.values() for q in qs)] for w in q.split()}
    opts = {option_token(o) for o in [*options, *(v for vs in VALUES.values() for v in vs)]}
    return {token: i for i, token in enumerate([*SPECIALS, *sorted(words), *sorted(opts)])}


def encode_prompt(vocab: dict[str, int], question: str, options: list[str]) -> list[int]:
    return ([vocab.get(w, UNK) for w in question.split()] + [OPTIONS]
            + [vocab[option_token(o)] for o in options])


# ============================================================================================ examples
def generate_items(size: int, seed: int, congruent_fraction: float, incongruent_fraction: float,
                   tasks: tuple[str, ...]) -> list[dict]:
    """Question records of the embedded set (no audio yet): deterministic from ``seed``."""
    rng = np.random.default_rng(seed)
    all_values = [(t, v) for t in TASKS for v in VALUES[t]]
    items = []
    for _ in range(size):
        attributes = {t: VALUES[t][int(rng.integers(2))] for t in TASKS}
        task = tasks[int(rng.integers(len(tasks)))]
        truth = attributes[task]
        other = VALUES[task][1 - VALUES[task].index(truth)]
        draw = rng.random()
        if draw < congruent_fraction:
            kind, claimed = "congruent", truth
        elif draw < congruent_fraction + incongruent_fraction:
            kind, claimed = "incongruent", other
        else:
            kind, claimed = "neutral", None
        sentence = (NEUTRAL[int(rng.integers(len(NEUTRAL)))] if claimed is None
                    else CLAIMS[task, claimed][int(rng.integers(5))])
        distractors = [v for t, v in all_values if t != task]
        picked = [distractors[i] for i in rng.choice(len(distractors), NUM_OPTIONS - 2, replace=False)]
        options = [*VALUES[task], *picked]
        options = [options[i] for i in rng.permutation(NUM_OPTIONS)]
        question = QUESTIONS[task][int(rng.integers(len(QUESTIONS[task])))]
        items.append({"task": task, "question": question, "options": options, "label": options.index(truth),
                      "adv_label": -1 if claimed is None else options.index(claimed), "kind": kind,
                      "sentence": sentence, "attributes": attributes})
    return items


def _label_index(value, options: list[str], field: str, where: str) -> int:
    letters = [chr(ord("A") + i) for i in range(len(options))]
    if isinstance(value, str) and value in options:
        return options.index(value)
    if isinstance(value, str) and value.strip().upper().rstrip(".)") in letters:
        return letters.index(value.strip().upper().rstrip(".)"))
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(options):
        return value
    raise UserInputError(f"{where}: {field}={value!r} is not among the options {options} (give the option text or "
                         f"its letter {letters[0]}..{letters[-1]}).")


def read_question_file(path: str, data_dir: str, data_format: str) -> list[dict]:
    """Records of one ``{train,val,test}.jsonl`` (see the module docstring for both layouts)."""
    if not os.path.isfile(path):
        raise UserInputError(f"'{path}' is missing: data_dir must hold train.jsonl, val.jsonl and test.jsonl "
                             f"({data_format} layout, see datamodules/paralinguistic_speech.py).")
    label_field, adv_field = ("true_label", "adversarial_label") if data_format == "voxparadox" else ("label",
                                                                                                      "adv_label")
    required = ("task", "audio", "question", "options", label_field, adv_field) if data_format == "voxparadox" \
        else ("audio", "question", "options", label_field)
    records = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserInputError(f"{where}: not valid JSON ({err}).") from None
            missing = [k for k in required if k not in row]
            if missing:
                raise UserInputError(f"{where}: missing field(s) {missing}; a {data_format} line needs "
                                     f"{list(required)}.")
            options = row["options"]
            if isinstance(options, dict):
                options = [options[k] for k in sorted(options)]
            if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
                raise UserInputError(f"{where}: the question has no options ({row['options']!r}); give a non-empty "
                                     "list of option texts (or a mapping letter -> text).")
            if len(set(options)) != len(options):
                raise UserInputError(f"{where}: options {options} repeat a text.")
            adv = row.get(adv_field)
            records.append({"task": str(row.get("task", "unknown")), "question": str(row["question"]).lower(),
                            "options": options, "label": _label_index(row[label_field], options, label_field, where),
                            "adv_label": -1 if adv is None else _label_index(adv, options, adv_field, where),
                            "audio_path": os.path.join(data_dir, row["audio"]), "where": where})
    if not records:
        raise UserInputError(f"'{path}' holds no question.")
    return records


class SpokenQuestions(Dataset):
    """Examples: waveform, prompt ids, option ids, label, adversarial label, task id, attributes, content id."""

    def __init__(self, records: list[dict], audio: list[np.ndarray], vocab: dict[str, int],
                 task_names: list[str]) -> None:
        self.records, self.audio, self.vocab, self.task_names = records, audio, vocab, task_names

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict:
        r = self.records[i]
        attrs = r.get("attributes") or {}
        return {"waveform": torch.from_numpy(self.audio[i]),
                "prompt": torch.tensor(encode_prompt(self.vocab, r["question"], r["options"])),
                "options": torch.tensor([self.vocab[option_token(o)] for o in r["options"]]),
                "label": r["label"], "adv_label": r["adv_label"],
                "task": self.task_names.index(r["task"]) if r["task"] in self.task_names else -1,
                "attributes": torch.tensor([VALUES[t].index(attrs[t]) if t in attrs else -1 for t in TASKS]),
                "content": SENTENCES.index(r["sentence"]) if r.get("sentence") in SENTENCES else -1}


def collate_spoken_questions(examples: list[dict]) -> dict[str, torch.Tensor]:
    """Waveforms right-padded (``wave_lengths``), prompts LEFT-padded (``prompt_mask``), options padded with -1."""
    batch = len(examples)
    lengths = torch.tensor([len(e["waveform"]) for e in examples])
    waves = torch.zeros(batch, int(lengths.max()))
    prompt_len = max(len(e["prompt"]) for e in examples)
    prompts = torch.full((batch, prompt_len), PAD, dtype=torch.long)
    prompt_mask = torch.zeros(batch, prompt_len, dtype=torch.bool)
    num_options = max(len(e["options"]) for e in examples)
    options = torch.full((batch, num_options), -1, dtype=torch.long)
    for i, e in enumerate(examples):
        waves[i, :len(e["waveform"])] = e["waveform"]
        prompts[i, prompt_len - len(e["prompt"]):] = e["prompt"]
        prompt_mask[i, prompt_len - len(e["prompt"]):] = True
        options[i, :len(e["options"])] = e["options"]
    return {"waveform": waves, "wave_lengths": lengths, "prompt": prompts, "prompt_mask": prompt_mask,
            "options": options, "label": torch.tensor([e["label"] for e in examples]),
            "adv_label": torch.tensor([e["adv_label"] for e in examples]),
            "task": torch.tensor([e["task"] for e in examples]),
            "attributes": torch.stack([e["attributes"] for e in examples]),
            "content": torch.tensor([e["content"] for e in examples])}


class ParalinguisticSpeechDataModule(LightningDataModule):
    """Spoken paralinguistic multiple-choice questions (see the module docstring).

    Args:
        data_dir: folder with ``{train,val,test}.jsonl`` and the audio; None = the embedded espeak-ng set.
        data_format: ``jsonl`` (generic) or ``voxparadox`` (field names of a VoxParadox item).
        tasks: tasks of the embedded set (subset of pitch, speed, gender, volume).
        num_train, num_val, num_test: embedded split sizes (questions; clips are shared between them).
        congruent_fraction: share of train/val questions whose sentence asserts the true value.
        incongruent_fraction: share of train/val questions whose sentence asserts the other value (the rest is
            neutral text). The test split is always 100% incongruent (adversarial).
        seed: generation seed (train, val and test use derived streams).
        batch_size, num_workers: loaders.
        cache_dir: synthesised clips (default ``$ICML26_CACHE`` or ``~/.cache/icml26/paralinguistic_speech``).
    """

    sample_rate = SAMPLE_RATE

    def __init__(self, data_dir: str | None = None, data_format: Literal["jsonl", "voxparadox"] = "jsonl",
                 tasks: list[str] | None = None, num_train: int = 1200, num_val: int = 240, num_test: int = 400,
                 congruent_fraction: float = 0.85, incongruent_fraction: float = 0.0, seed: int = 0,
                 batch_size: int = 32, num_workers: int = 0, cache_dir: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tasks = tuple(tasks) if tasks is not None else TASKS
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise UserInputError(f"tasks={list(self.tasks)}: choose a non-empty subset of {list(TASKS)}.")
        check_range("congruent_fraction", congruent_fraction, 0.0, 1.0)
        check_range("incongruent_fraction", incongruent_fraction, 0.0, 1.0 - congruent_fraction)
        for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test),
                            ("batch_size", batch_size)):
            check_range(name, value, low=1)
        if data_dir is not None and not os.path.isdir(data_dir):
            raise UserInputError(f"data_dir '{data_dir}' is not a folder; it must hold train.jsonl, val.jsonl and "
                                 "test.jsonl with the audio (or leave data_dir unset for the embedded espeak-ng set).")
        self.data_dir, self.data_format = data_dir, data_format
        self.cache_dir = cache_dir or default_cache_dir()
        self.task_names = list(TASKS)
        self.splits: dict[str, SpokenQuestions] = {}
        self.vocab: dict[str, int] | None = None
        self.vocab_size: int | None = None
        self.num_content_classes = len(SENTENCES)

    def _embedded(self) -> dict[str, list[dict]]:
        hp = self.hparams
        sizes = {"train": (hp.num_train, hp.congruent_fraction, hp.incongruent_fraction),
                 "val": (hp.num_val, hp.congruent_fraction, hp.incongruent_fraction),
                 "test": (hp.num_test, 0.0, 1.0)}
        return {split: generate_items(size, hp.seed * 1009 + stream, c, i, self.tasks)
                for stream, (split, (size, c, i)) in enumerate(sizes.items())}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        if self.data_dir is None:
            records = self._embedded()
            audio = {split: [synthesise(r["sentence"], r["attributes"]["pitch"], r["attributes"]["speed"],
                                        r["attributes"]["gender"], r["attributes"]["volume"], self.cache_dir)
                             for r in rs] for split, rs in records.items()}
        else:
            records = {split: read_question_file(os.path.join(self.data_dir, f"{split}.jsonl"), self.data_dir,
                                                 self.data_format) for split in ("train", "val", "test")}
            audio = {split: [read_wav(r["audio_path"], r["where"]) for r in rs] for split, rs in records.items()}
            self.task_names = sorted({r["task"] for rs in records.values() for r in rs})
        self.vocab = build_vocabulary([r["question"] for rs in records.values() for r in rs],
                                      [o for rs in records.values() for r in rs for o in r["options"]])
        self.vocab_size = len(self.vocab)
        self.splits = {split: SpokenQuestions(records[split], audio[split], self.vocab, self.task_names)
                       for split in records}

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        # epoch-seeded shuffling (exact resume: the order of epoch e depends only on seed and e); evaluation is
        # sharded without padding duplicates under DDP
        dataset = self.splits[split]
        sampler = (training_sampler(len(dataset), self.hparams.seed, self.trainer) if shuffle
                   else evaluation_sampler(dataset, self.trainer))
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler,
                          collate_fn=collate_spoken_questions, num_workers=self.hparams.num_workers,
                          persistent_workers=self.hparams.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


__all__ = ["ParalinguisticSpeechDataModule", "SpokenQuestions", "collate_spoken_questions", "read_wav",
           "read_question_file", "synthesise", "espeak_binary", "generate_items", "TASKS", "VALUES", "SENTENCES"]
