"""Spoken multiple-choice questions about HOW something is said (pitch, speed, gender, volume) whose transcript
asserts an answer: the data family of VoxParadox (Pang, Chaubey & Soleymani, "Do Audio LLMs Listen or Read?
Analyzing and Mitigating Paralinguistic Failures with VoxParadox", arXiv 2605.27772). One file: the embedded
speech and the VoxParadox reader produce the same question records, and keeping them together keeps them alike.

Embedded default: speech synthesised offline with espeak-ng, called in-process from the ``espeakng-loader`` wheel
(`datamodules.espeak`; the system ``espeak-ng`` binary only where that wheel is absent). Every clip has all four
attributes, drawn uniformly and forced by espeak-ng controls (command-line spelling):

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
to 16 kHz with a polyphase filter) and cached as ``.npy`` under ``cache_dir`` keyed by the espeak-ng version, the
four controls and the text (not by back-end), so different seeds share clips. Different espeak-ng versions give
different samples (the wheel's 1.52.0 against Debian 12's 1.51: see `datamodules.espeak`), so results are
bit-identical only at the same version.

Each example also carries ``content`` (the sentence id, 50 classes): the content-only pre-training target of the
encoder (`lightning_modules.pclm.audio_language_model.SpeechContentPretraining`) and ``attributes`` (the four values,
-1 when unknown) for the per-layer probes (`callbacks.layer_probing.LayerProbing`).

Files, two layouts (``data_format``); audio is PCM wav read with the stdlib ``wave`` module:

* ``data_format: jsonl`` (generic): ``data_dir`` holds ``{train,val,test}.jsonl``, one question per line
  ``{"audio", "question", "options": [...], "label"}`` with optional ``task`` and ``adv_label`` (labels: an option
  text or its letter), audio paths relative to ``data_dir``, 16 kHz mono (other rates are refused).
* ``data_format: voxparadox``: ``data_dir`` is the VoxParadox release as published on the Hugging Face Hub
  (dataset ``IHP-Lab/VoxParadox``, e.g. ``huggingface-cli download IHP-Lab/VoxParadox --repo-type dataset
  --local-dir data/VoxParadox``): a test set only (2,000 questions, 10 tasks), read from its ``metadata.jsonl``,
  one question per line with the fields the dataset card lists: ``id``, ``task_name``, ``question``,
  ``choice_a`` .. ``choice_d``, ``answer_gt`` (the acoustic answer) and ``adversarial_labels`` (the answer(s) the
  transcript asserts), plus the audio file. The release is an audio-folder dataset, whose ``metadata.jsonl`` names
  each clip in ``file_name``, relative to the folder of ``metadata.jsonl``; ``audio_path`` (the field of the
  authors' question-generation script, JiachengPang/speech_tts ``post_processing_mcqs.py``) is read where
  ``file_name`` is absent. What was not visible when this was written: the file itself (its exact audio field,
  sub-folder layout, file type and sampling rate), so ``file_name`` follows the audio-folder format rather than a
  seen row; clips at another rate than 16 kHz are resampled to 16 kHz (polyphase filter, as the embedded clips).
  Reading: the options are the choices that are present in letter order (a choice that is JSON null, empty or the
  string ``"null"``, the placeholder of the authors' script for two-option tasks, is absent); ``answer_gt`` and
  every adversarial label are an option text (also matched ignoring case, repeated spaces and a final ``.``, ``!``
  or ``?``, as the authors' ``create_manifest.py`` matches answers) or a choice letter (``B``, ``(B)``,
  ``choice_b``); ``adversarial_labels`` is a list, or one string (several joined by ``|`` or ``,`` are split when
  the whole string is no option; the project page shows two adversarial labels for a vocal-range question). Each
  record keeps its ``id`` and all its adversarial labels: ALA counts a prediction that equals any of them
  (`lightning_modules.pclm.audio_language_model.OptionAgreement`), and predictions carry the ``id`` and the chosen
  option's text. A row without a field, an answer or adversarial label that is no choice, an adversarial label
  equal to ``answer_gt`` (the release's labels are disjoint by construction), a repeated ``id`` and unreadable
  audio are each one `UserInputError` naming ``metadata.jsonl``, the line and the field.
  The release has no training data: ``fit`` and ``validate`` read YOUR questions from ``train_dir``, which must
  hold ``train.jsonl`` and ``val.jsonl`` in the generic layout above (audio relative to ``train_dir``, 16 kHz), e.g.
  ``{"audio": "clips/0001.wav", "question": "What is the speaker's gender?", "options": ["Female", "Male"],
  "label": "Male", "task": "gender_prediction", "adv_label": "Female"}``; without them ``fit`` / ``validate`` stop
  with one error naming this layout (``test`` and ``predict`` read the release alone). With the default word
  vocabulary the token ids come from every file read, so test with the same ``train_dir`` as the training run
  (a ``tokenizer_path`` tokenizer does not depend on the files).

A label that is not among the options, a question without options, missing or unreadable audio and (generic
layout) a sampling rate other than 16 kHz are each one `UserInputError` naming the file and line.

Tokens, two ways (the model scores one logit per option either way):

* default (``tokenizer_path: null``): words are tokenised on whitespace into a vocabulary built from the embedded
  questions plus every question of the files (ids are a property of the text, not a statistic of a split); the
  prompt is ``<question words> <options> <opt1> <opt2> ...`` and each option text is ONE token ``<option text>``.
  The quick configs and the experiment use this.
* ``tokenizer_path``: the tokenizer of a local transformers folder (e.g. ``models/Qwen2-Audio-7B-Instruct``; loaded
  at ``setup`` with ``AutoTokenizer.from_pretrained(..., local_files_only=True)``, nothing is downloaded). Each
  question is rendered as a multiple-choice question with lettered options, the paper's MCQ format (Sec. 3)::

      <question>
      A. <option 1>
      B. <option 2>
      ...
      Answer:

  and, when the tokenizer has a chat template and ``use_chat_template`` is on, put into one user turn of that
  template with the generation prompt appended (as `datamodules.verifiable_tasks` renders chat prompts). The
  option ids are the tokens of the option LETTERS as the tokenizer writes them where the answer starts: `` A``,
  `` B``, ... after ``Answer:`` (plain text), ``A``, ``B``, ... right after the chat template's generation prompt.
  Each letter must be exactly one token that does not merge with the end of the prompt; both are checked at
  ``setup`` (one `UserInputError` otherwise). The paper parses generated answers; scoring the letter logits is
  this collection's documented choice. Prompts are left-padded with the tokenizer's pad id (eos when it has no
  pad token); ``vocab_size`` is ``len(tokenizer)``, which the model checks against its embedding rows. The
  question keeps its case here (the word vocabulary lower-cases it).

Length: one data family read top to bottom (the embedded spoken questions, the release's JSONL layout and
VoxParadox's metadata, the prompt tokenisation the model checks); speech synthesis lives in `datamodules/espeak.py`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import wave
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from datamodules import espeak
from datamodules.sampling import evaluation_sampler, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range, one_line

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
def default_cache_dir() -> str:
    return os.environ.get("ICML26_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "icml26",
                                                       "paralinguistic_speech"))


def read_wav(path: str, where: str = "", resample: bool = False) -> np.ndarray:
    """A 16 kHz PCM wav as float32 mono in [-1, 1]; a missing/unreadable file or another rate is a UserInputError
    (``resample``: another rate is resampled to 16 kHz with a polyphase filter instead)."""
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
    if rate != SAMPLE_RATE and not resample:
        raise UserInputError(f"{prefix}'{path}' is sampled at {rate} Hz but the model expects {SAMPLE_RATE} Hz. "
                             f"Resample it first, e.g. `sox in.wav -r {SAMPLE_RATE} out.wav`.")
    dtypes = {1: np.uint8, 2: np.int16, 4: np.int32}
    if width not in dtypes:
        raise UserInputError(f"{prefix}'{path}' has {8 * width}-bit samples; write 16-bit PCM.")
    audio = np.frombuffer(frames, dtype=dtypes[width]).astype(np.float32)
    audio = (audio - 128.0) / 128.0 if width == 1 else audio / float(2 ** (8 * width - 1))
    audio = audio.reshape(-1, channels).mean(axis=1) if channels > 1 else audio
    if rate != SAMPLE_RATE:
        from math import gcd

        from scipy.signal import resample_poly
        g = gcd(SAMPLE_RATE, rate)
        audio = resample_poly(audio, SAMPLE_RATE // g, rate // g).astype(np.float32)
    return audio


def synthesise(text: str, pitch: str, speed: str, gender: str, volume: str, cache_dir: str) -> np.ndarray:
    """One espeak-ng clip at 16 kHz (float32), cached under ``cache_dir`` by espeak-ng version and parameters."""
    if espeak.backend() is None:
        raise UserInputError("espeak-ng is not available, so the embedded speech cannot be synthesised. Install the "
                             "espeakng-loader wheel (`pip install espeakng-loader`, one of this package's "
                             "requirements) or give data_dir.")
    voice, rate = f"en-us+{ESPEAK_CONTROLS['gender'][gender]}", ESPEAK_CONTROLS["speed"][speed]
    pitch_value, amplitude = ESPEAK_CONTROLS["pitch"][pitch], ESPEAK_CONTROLS["volume"][volume]
    # the key names the version, the command-line controls and the text, never the back-end (at one version both
    # back-ends give the same samples)
    controls = [f"-v{voice}", f"-p{pitch_value}", f"-s{rate}", f"-a{amplitude}"]
    key = hashlib.sha1("|".join([f"espeak-ng {espeak.version()}", *controls, text]).encode()).hexdigest()
    path = os.path.join(cache_dir, f"{key}.npy")
    if os.path.isfile(path):
        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:  # a cache file damaged or replaced after it was written
            raise UserInputError(f"the speech cache file '{path}' is not a readable .npy array ({type(err).__name__}: "
                                 f"{one_line(err)}); delete it (or the whole cache_dir) and it is synthesised "
                                 "again.") from None
    os.makedirs(cache_dir, exist_ok=True)
    audio, rate_hz = espeak.speak(text, voice=voice, rate=rate, pitch=pitch_value, amplitude=amplitude)
    if rate_hz != SAMPLE_RATE:
        from math import gcd

        from scipy.signal import resample_poly
        g = gcd(SAMPLE_RATE, rate_hz)
        audio = resample_poly(audio, SAMPLE_RATE // g, rate_hz // g).astype(np.float32)
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


class WordVocabulary:
    """The default tokens: a word vocabulary, one token per option text (see the module docstring)."""

    pad_id = PAD

    def __init__(self, questions: list[str], options: list[str]) -> None:
        self.vocab = build_vocabulary(questions, options)
        self.vocab_size = len(self.vocab)

    def prompt_ids(self, record: dict) -> list[int]:
        return encode_prompt(self.vocab, record["question"], record["options"])

    def option_ids(self, options: list[str]) -> list[int]:
        return [self.vocab[option_token(o)] for o in options]


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def render_question(question: str, options: list[str]) -> str:
    """The MCQ text with lettered options: ``<question>\nA. <opt1>\nB. <opt2>\n...\nAnswer:``."""
    return "\n".join([question, *(f"{LETTERS[i]}. {o}" for i, o in enumerate(options)), "Answer:"])


class QuestionTokenizer:
    """A local transformers tokenizer behind `WordVocabulary`'s interface: lettered-MCQ prompts (chat template
    when it has one and ``use_chat_template``) and the option letters' token ids (see the module docstring)."""

    def __init__(self, path: str, use_chat_template: bool = True) -> None:
        fix = ("point tokenizer_path at a local folder written by save_pretrained (for the paper configs: the "
               "Qwen2-Audio-7B-Instruct folder, whose tokenizer.json / vocab.json / merges.txt / tokenizer_config.json "
               "sit at its top level), or leave it unset for the embedded word vocabulary")
        if not os.path.isdir(path):
            raise UserInputError(f"tokenizer_path '{path}' is not a folder; {fix}.")
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as err:  # transformers raises OSError, ValueError, KeyError, ... for a bad folder
            raise UserInputError(f"tokenizer_path '{path}': no tokenizer could be loaded from it "
                                 f"({type(err).__name__}: {str(err)[:300]}); {fix}.") from None
        tok = self.tokenizer
        self.path = path
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if self.pad_id is None:
            raise UserInputError(f"the tokenizer at '{path}' has neither a pad nor an eos token; add a pad token "
                                 "(tokenizer.add_special_tokens({'pad_token': ...}) then save_pretrained).")
        self.bos_id = tok.bos_token_id
        self.vocab_size = len(tok)
        self.use_chat_template = use_chat_template and bool(getattr(tok, "chat_template", None))
        # where the answer starts: " A" after "Answer:", "A" right after a chat template's generation prompt
        self.answer_prefix = "" if self.use_chat_template else " "
        self.letter_ids: list[int] = []

    def _encode(self, text: str) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]     # BOS first when the tokenizer has one (chat templates may write it)
        return ids

    def prompt_text(self, question: str, options: list[str]) -> str:
        text = render_question(question, options)
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return text

    def prompt_ids(self, record: dict) -> list[int]:
        return self._encode(self.prompt_text(record.get("text", record["question"]), record["options"]))

    def option_ids(self, options: list[str]) -> list[int]:
        return self.letter_ids[:len(options)]

    def check_letters(self, num_options: int, sample: dict) -> None:
        """Token id of each option letter; every letter must be ONE token, distinct, and stay one token after the
        prompt of ``sample`` (the prompt's end is the same for every question). Raises `UserInputError`."""
        if num_options > len(LETTERS):
            raise UserInputError(f"a question has {num_options} options; lettered options go up to {len(LETTERS)}.")
        ids = []
        for letter in LETTERS[:num_options]:
            answer = self.answer_prefix + letter
            pieces = self.tokenizer.encode(answer, add_special_tokens=False)
            if len(pieces) != 1:
                raise UserInputError(
                    f"the tokenizer at '{self.path}' writes the option letter {answer!r} as {len(pieces)} tokens "
                    f"{self.tokenizer.convert_ids_to_tokens(pieces)}, but the model scores each option by ONE "
                    f"token's logit; use a tokenizer with single-token letters (the LM's own tokenizer), or fewer "
                    f"options (at most {LETTERS.index(letter)} here).")
            ids.append(pieces[0])
        prompt = self.prompt_ids(sample)
        text = self.prompt_text(sample.get("text", sample["question"]), sample["options"])
        for letter, token in zip(LETTERS[:num_options], ids):
            if self._encode(text + self.answer_prefix + letter) != [*prompt, token]:
                raise UserInputError(
                    f"the tokenizer at '{self.path}' merges the answer {self.answer_prefix + letter!r} with the end "
                    f"of the prompt ({sample.get('where', 'a question')}), so its single-token id is not what follows "
                    f"the prompt; set use_chat_template={not self.use_chat_template} or use the LM's own tokenizer.")
        if len(set(ids)) != len(ids):
            raise UserInputError(f"the tokenizer at '{self.path}' gives two option letters the same id {ids}.")
        self.letter_ids = ids


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


def read_question_file(path: str, data_dir: str, data_format: str = "jsonl") -> list[dict]:
    """Records of one generic ``{train,val,test}.jsonl`` (module docstring), audio paths relative to ``data_dir``.
    The VoxParadox release is read by `read_voxparadox_release`."""
    if data_format != "jsonl":
        raise UserInputError(f"read_question_file reads the generic jsonl layout, not data_format={data_format!r}; "
                             "the VoxParadox release is read by read_voxparadox_release.")
    if not os.path.isfile(path):
        raise UserInputError(f"'{path}' is missing: data_dir must hold train.jsonl, val.jsonl and test.jsonl "
                             f"(jsonl layout, see datamodules/paralinguistic_speech.py).")
    required = ("audio", "question", "options", "label")
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
                raise UserInputError(f"{where}: missing field(s) {missing}; a jsonl line needs {list(required)}.")
            options = row["options"]
            if isinstance(options, dict):
                options = [options[k] for k in sorted(options)]
            if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
                raise UserInputError(f"{where}: the question has no options ({row['options']!r}); give a non-empty "
                                     "list of option texts (or a mapping letter -> text).")
            if len(set(options)) != len(options):
                raise UserInputError(f"{where}: options {options} repeat a text.")
            adv = row.get("adv_label")
            records.append({"task": str(row.get("task", "unknown")), "question": str(row["question"]).lower(),
                            "text": str(row["question"]),
                            "options": options, "label": _label_index(row["label"], options, "label", where),
                            "adv_label": -1 if adv is None else _label_index(adv, options, "adv_label", where),
                            "audio_path": os.path.join(data_dir, row["audio"]), "where": where})
    if not records:
        raise UserInputError(f"'{path}' holds no question.")
    return records


RELEASE_METADATA = "metadata.jsonl"
RELEASE_CHOICES = ("choice_a", "choice_b", "choice_c", "choice_d")
RELEASE_FIELDS = ("id", "task_name", "question", "answer_gt", "adversarial_labels")
RELEASE_AUDIO_FIELDS = ("file_name", "audio_path")     # audio-folder convention first, the authors' script second
ABSENT_CHOICES = (None, "", "null")


def _normalised(text: str) -> str:
    return " ".join(text.split()).rstrip(".!?").lower()


def _release_choice(value, choices: dict[str, str], options: list[str], field: str, where: str) -> int:
    """Index in ``options`` of a release label: an option text (exact, then ignoring case, repeated spaces and a
    final . ! ?) or a choice letter (``B``, ``(B)``, ``B.``, ``choice_b``)."""
    if isinstance(value, str):
        if value in options:
            return options.index(value)
        matches = [i for i, o in enumerate(options) if _normalised(o) == _normalised(value)]
        if len(matches) == 1:
            return matches[0]
        key = value.strip().lower()
        key = key[len("choice_"):] if key.startswith("choice_") else key.strip("(). :")
        if len(key) == 1 and f"choice_{key}" in RELEASE_CHOICES:
            if f"choice_{key}" not in choices:
                raise UserInputError(f"{where}: {field}={value!r} names choice_{key}, which this question does not "
                                     f"have (its choices: {list(choices)}).")
            return options.index(choices[f"choice_{key}"])
    raise UserInputError(f"{where}: {field}={value!r} is not one of the question's choices {options} (give an option "
                         f"text or a choice letter A..{chr(ord('A') + len(RELEASE_CHOICES) - 1)}).")


def _release_adversarial(value, choices: dict[str, str], options: list[str], where: str) -> list[int]:
    """Indices of ``adversarial_labels``: a list of labels, or one string (labels joined by | or , are split when
    the whole string is no choice)."""
    field = "adversarial_labels"
    if isinstance(value, str):
        try:
            return [_release_choice(value, choices, options, field, where)]
        except UserInputError:
            separator = "|" if "|" in value else ","
            value = [part.strip() for part in value.split(separator)] if separator in value else [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise UserInputError(f"{where}: {field}={value!r} must name at least one option (a list of option texts or "
                             "letters, or one string).")
    indices = [_release_choice(v, choices, options, field, where) for v in value]
    return sorted(set(indices))


def read_voxparadox_release(data_dir: str) -> list[dict]:
    """Test records of the VoxParadox release in ``data_dir`` (its ``metadata.jsonl``; module docstring)."""
    path = os.path.join(data_dir, RELEASE_METADATA)
    if not os.path.isfile(path):
        raise UserInputError(f"'{path}' is missing: with data_format=voxparadox, data_dir must be the VoxParadox "
                             f"release folder (metadata.jsonl next to the audio it names), e.g. `huggingface-cli "
                             f"download IHP-Lab/VoxParadox --repo-type dataset --local-dir {data_dir}`.")
    records, seen = [], {}
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserInputError(f"{where}: not valid JSON ({err}).") from None
            if not isinstance(row, dict):
                raise UserInputError(f"{where}: a line must be one JSON object (a question), not {type(row).__name__}.")
            audio_field = next((k for k in RELEASE_AUDIO_FIELDS if k in row), None)
            missing = [k for k in RELEASE_FIELDS if k not in row] + ([] if audio_field else ["file_name"])
            if missing:
                raise UserInputError(f"{where}: missing field(s) {missing}; a VoxParadox row needs "
                                     f"{[*RELEASE_FIELDS, *RELEASE_CHOICES, 'file_name']}.")
            for field in ("id", "task_name", "question", audio_field):
                if not isinstance(row[field], str) or not row[field].strip():
                    raise UserInputError(f"{where}: field {field}={row[field]!r} must be a non-empty string.")
            choices = {k: row[k] for k in RELEASE_CHOICES if row.get(k) not in ABSENT_CHOICES}
            bad = [k for k, v in choices.items() if not isinstance(v, str)]
            if bad:
                raise UserInputError(f"{where}: field {bad[0]}={choices[bad[0]]!r} must be an option text (or null).")
            options = list(choices.values())
            if len(options) < 2:
                raise UserInputError(f"{where}: fields {list(RELEASE_CHOICES)} give {len(options)} option(s) "
                                     f"{options}; a question needs at least two.")
            if len(set(options)) != len(options):
                raise UserInputError(f"{where}: fields {list(RELEASE_CHOICES)} repeat an option text {options}.")
            label = _release_choice(row["answer_gt"], choices, options, "answer_gt", where)
            adversarial = _release_adversarial(row["adversarial_labels"], choices, options, where)
            if label in adversarial:
                raise UserInputError(f"{where}: field adversarial_labels={row['adversarial_labels']!r} contains the "
                                     f"answer_gt {options[label]!r}; the labels the transcript asserts must differ "
                                     "from the acoustic answer.")
            if row["id"] in seen:
                raise UserInputError(f"{where}: field id={row['id']!r} repeats the id of line {seen[row['id']]}.")
            seen[row["id"]] = number
            records.append({"task": row["task_name"], "question": row["question"].lower(), "text": row["question"],
                            "options": options, "label": label, "adv_label": adversarial[0],
                            "adv_labels": adversarial, "id": row["id"],
                            "audio_path": os.path.join(data_dir, row[audio_field]),
                            "where": f"{where}, field {audio_field}"})
    if not records:
        raise UserInputError(f"'{path}' holds no question.")
    return records


class SpokenQuestions(Dataset):
    """Examples: waveform, prompt ids, option ids, label, adversarial label(s), task id, attributes, content id (and
    for the VoxParadox release the question's ``id`` and option texts)."""

    def __init__(self, records: list[dict], audio: list[np.ndarray], tokens: WordVocabulary | QuestionTokenizer,
                 task_names: list[str]) -> None:
        self.records, self.audio, self.tokens, self.task_names = records, audio, tokens, task_names

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict:
        r = self.records[i]
        attrs = r.get("attributes") or {}
        example = {"waveform": torch.from_numpy(self.audio[i]),
                   "prompt": torch.tensor(self.tokens.prompt_ids(r)),
                   "options": torch.tensor(self.tokens.option_ids(r["options"])),
                   "label": r["label"], "adv_label": r["adv_label"],
                   "task": self.task_names.index(r["task"]) if r["task"] in self.task_names else -1,
                   "attributes": torch.tensor([VALUES[t].index(attrs[t]) if t in attrs else -1 for t in TASKS]),
                   "content": SENTENCES.index(r["sentence"]) if r.get("sentence") in SENTENCES else -1}
        if "adv_labels" in r:                                  # the release: every adversarial label, id, texts
            example.update(adv_labels=r["adv_labels"], id=r["id"], option_texts=r["options"])
        return example


def collate_spoken_questions(examples: list[dict], pad_id: int = PAD) -> dict[str, torch.Tensor]:
    """Waveforms right-padded (``wave_lengths``), prompts LEFT-padded with ``pad_id`` (``prompt_mask``), options
    padded with -1; ``adv_options`` [B, K] marks every option the transcript asserts (``adv_labels`` where an
    example has them, else ``adv_label`` when >= 0). Release examples add ``id`` and ``option_texts`` (lists)."""
    batch = len(examples)
    lengths = torch.tensor([len(e["waveform"]) for e in examples])
    waves = torch.zeros(batch, int(lengths.max()))
    prompt_len = max(len(e["prompt"]) for e in examples)
    prompts = torch.full((batch, prompt_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(batch, prompt_len, dtype=torch.bool)
    num_options = max(len(e["options"]) for e in examples)
    options = torch.full((batch, num_options), -1, dtype=torch.long)
    adv_options = torch.zeros(batch, num_options, dtype=torch.bool)
    for i, e in enumerate(examples):
        waves[i, :len(e["waveform"])] = e["waveform"]
        prompts[i, prompt_len - len(e["prompt"]):] = e["prompt"]
        prompt_mask[i, prompt_len - len(e["prompt"]):] = True
        options[i, :len(e["options"])] = e["options"]
        adv_options[i, e.get("adv_labels", [e["adv_label"]] if e["adv_label"] >= 0 else [])] = True
    out = {"waveform": waves, "wave_lengths": lengths, "prompt": prompts, "prompt_mask": prompt_mask,
           "options": options, "label": torch.tensor([e["label"] for e in examples]),
           "adv_label": torch.tensor([e["adv_label"] for e in examples]), "adv_options": adv_options,
           "task": torch.tensor([e["task"] for e in examples]),
           "attributes": torch.stack([e["attributes"] for e in examples]),
           "content": torch.tensor([e["content"] for e in examples])}
    if all("id" in e for e in examples):
        out.update(id=[e["id"] for e in examples], option_texts=[e["option_texts"] for e in examples])
    return out


class ParalinguisticSpeechDataModule(LightningDataModule):
    """Spoken paralinguistic multiple-choice questions (see the module docstring).

    Args:
        data_dir: ``jsonl``: folder with ``{train,val,test}.jsonl`` and the audio; ``voxparadox``: the VoxParadox
            release folder (``metadata.jsonl`` and the audio it names); None = the embedded espeak-ng set.
        data_format: ``jsonl`` (generic layout) or ``voxparadox`` (the release as published; module docstring).
        tasks: tasks of the embedded set (subset of pitch, speed, gender, volume).
        num_train, num_val, num_test: embedded split sizes (questions; clips are shared between them).
        congruent_fraction: share of train/val questions whose sentence asserts the true value.
        incongruent_fraction: share of train/val questions whose sentence asserts the other value (the rest is
            neutral text). The test split is always 100% incongruent (adversarial).
        seed: generation seed (train, val and test use derived streams).
        batch_size, num_workers: loaders.
        cache_dir: synthesised clips (default ``$ICML26_CACHE`` or ``~/.cache/icml26/paralinguistic_speech``).
        tokenizer_path: local transformers folder whose tokenizer renders and tokenises the questions as lettered
            MCQs (options scored by their letter tokens); None = the embedded word vocabulary (module docstring).
        use_chat_template: with ``tokenizer_path``, put each question into the tokenizer's chat template (one user
            turn plus the generation prompt) when it has one.
        train_dir: with ``data_format: voxparadox``, the folder of YOUR training questions, ``train.jsonl`` and
            ``val.jsonl`` in the generic layout (audio relative to it); needed by ``fit`` and ``validate``, read in
            every stage when given (the release is the test split only).
    """

    sample_rate = SAMPLE_RATE

    def __init__(self, data_dir: str | None = None, data_format: Literal["jsonl", "voxparadox"] = "jsonl",
                 tasks: list[str] | None = None, num_train: int = 1200, num_val: int = 240, num_test: int = 400,
                 congruent_fraction: float = 0.85, incongruent_fraction: float = 0.0, seed: int = 0,
                 batch_size: int = 32, num_workers: int = 0, cache_dir: str | None = None,
                 tokenizer_path: str | None = None, use_chat_template: bool = True,
                 train_dir: str | None = None) -> None:
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
        if data_format not in ("jsonl", "voxparadox"):
            raise UserInputError(f"data_format={data_format!r}: choose jsonl (generic layout) or voxparadox (the "
                                 "VoxParadox release).")
        if data_format == "voxparadox" and data_dir is None:
            raise UserInputError("data_format=voxparadox needs data_dir: the VoxParadox release folder (metadata.jsonl "
                                 "and its audio), e.g. `huggingface-cli download IHP-Lab/VoxParadox --repo-type "
                                 "dataset --local-dir data/VoxParadox`.")
        if data_dir is not None and not os.path.isdir(data_dir):
            holds = ("metadata.jsonl and the audio of the VoxParadox release" if data_format == "voxparadox" else
                     "train.jsonl, val.jsonl and test.jsonl with the audio")
            raise UserInputError(f"data_dir '{data_dir}' is not a folder; it must hold {holds} (or leave data_dir "
                                 "unset for the embedded espeak-ng set).")
        if train_dir is not None and data_format != "voxparadox":
            raise UserInputError(f"train_dir='{train_dir}' is read only with data_format=voxparadox; with "
                                 f"data_format={data_format} put train.jsonl and val.jsonl into data_dir.")
        if train_dir is not None and not os.path.isdir(train_dir):
            raise UserInputError(f"train_dir '{train_dir}' is not a folder; {self._training_layout()}")
        self.data_dir, self.data_format, self.train_dir = data_dir, data_format, train_dir
        self.cache_dir = cache_dir or default_cache_dir()
        self.task_names = list(TASKS)
        self.splits: dict[str, SpokenQuestions] = {}
        self.tokenizer_path = tokenizer_path
        self.tokens: WordVocabulary | QuestionTokenizer | None = None   # built in setup (the tokenizer lazily)
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
        elif self.data_format == "voxparadox":
            records = self._training_files(stage)
            records["test"] = read_voxparadox_release(self.data_dir)
            audio = {split: [read_wav(r["audio_path"], r["where"], resample=split == "test") for r in rs]
                     for split, rs in records.items()}
            self.task_names = sorted({r["task"] for rs in records.values() for r in rs})
        else:
            records = {split: read_question_file(os.path.join(self.data_dir, f"{split}.jsonl"), self.data_dir,
                                                 self.data_format) for split in ("train", "val", "test")}
            audio = {split: [read_wav(r["audio_path"], r["where"]) for r in rs] for split, rs in records.items()}
            self.task_names = sorted({r["task"] for rs in records.values() for r in rs})
        if self.tokenizer_path is None:
            self.tokens = WordVocabulary([r["question"] for rs in records.values() for r in rs],
                                         [o for rs in records.values() for r in rs for o in r["options"]])
            self.vocab = self.tokens.vocab
        else:
            self.tokens = QuestionTokenizer(self.tokenizer_path, self.hparams.use_chat_template)
            self.tokens.check_letters(max(len(r["options"]) for rs in records.values() for r in rs),
                                      (records.get("train") or records["test"])[0])
        self.vocab_size = self.tokens.vocab_size
        self.splits = {split: SpokenQuestions(records[split], audio[split], self.tokens, self.task_names)
                       for split in records}

    def _training_layout(self) -> str:
        return ("the VoxParadox release (data_dir) is a test set only, so fit and validate read your own questions: "
                "set train_dir to a folder holding train.jsonl and val.jsonl, one question per line {\"audio\": "
                "<wav path relative to train_dir, 16 kHz>, \"question\": ..., \"options\": [...], \"label\": <option "
                "text or letter>, optional \"task\" and \"adv_label\"} (docs/pclm.md, Data).")

    def _training_files(self, stage: str | None) -> dict[str, list[dict]]:
        """The user's train/val questions (``train_dir``); missing ones stop ``fit`` / ``validate``."""
        if self.train_dir is None:
            if stage in ("fit", "validate"):
                raise UserInputError(f"data_format=voxparadox, stage {stage}: no train_dir; "
                                     f"{self._training_layout()}")
            return {}
        missing = [f"{split}.jsonl" for split in ("train", "val")
                   if not os.path.isfile(os.path.join(self.train_dir, f"{split}.jsonl"))]
        if missing:
            raise UserInputError(f"train_dir '{self.train_dir}' lacks {' and '.join(missing)}; "
                                 f"{self._training_layout()}")
        return {split: read_question_file(os.path.join(self.train_dir, f"{split}.jsonl"), self.train_dir)
                for split in ("train", "val")}

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        # epoch-seeded shuffling (exact resume: the order of epoch e depends only on seed and e); evaluation is
        # sharded without padding duplicates under DDP
        if split not in self.splits:
            raise UserInputError(f"data_format=voxparadox: there is no {split} split; {self._training_layout()}")
        dataset = self.splits[split]
        sampler = (training_sampler(len(dataset), self.hparams.seed, self.trainer) if shuffle
                   else evaluation_sampler(dataset, self.trainer))
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler,
                          collate_fn=functools.partial(collate_spoken_questions, pad_id=self.tokens.pad_id),
                          num_workers=self.hparams.num_workers,
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
           "QuestionTokenizer", "WordVocabulary", "render_question",
           "read_question_file", "read_voxparadox_release", "synthesise", "generate_items", "TASKS", "VALUES",
           "SENTENCES"]
