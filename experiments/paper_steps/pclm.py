"""PCLM's four paper configs (arXiv 2605.27772; Qwen2-Audio-7B-Instruct): last-layer SFT -> PCLM stage 1 -> stage 2
(LLM unfrozen) -> DPO, each starting from the previous one's checkpoint. Test and predict read the VoxParadox
release as published (``IHP-Lab/VoxParadox``: an audio-folder dataset, ``metadata.jsonl`` with ``file_name`` and
the release's fields ``id, task_name, question, choice_a..choice_d, answer_gt, adversarial_labels``); training reads
paralinguistic MCQs in the generic JSONL layout (``train.jsonl`` / ``val.jsonl``; the release has no training
split). The model is the published architecture at fewer layers with random weights (note)."""
from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np

from experiments.paper_steps import Case
from experiments.paper_steps._hf_standins import (QWEN2_AUDIO_SPECIALS, architecture, done, mark_done,
                                                  qwen2_tokenizer, save_random)

LM_LAYERS, AUDIO_LAYERS = 1, 5
RATE = 16_000
FORMAT = ("VoxParadox release (IHP-Lab/VoxParadox audio folder): metadata.jsonl (file_name, id, task_name, "
          "question, choice_a..choice_d with \"null\" for absent choices, answer_gt, adversarial_labels) + "
          "16 kHz mono 16-bit PCM wav clips of 2-6 s, 4 questions; training: train.jsonl / val.jsonl (generic "
          "layout: audio, question, options, label, task, adv_label), 8 + 2 questions")
# (task_name, question, choices, answer_gt, adversarial_labels, seconds): the release's tasks and fields
QUESTIONS = [
    ("gender_prediction", "What is the gender of the speaker?", ["Male", "Female", "null", "null"], "Female",
     ["Male"], 3.2),
    ("age_prediction", "What is the age group of the speaker?", ["Child", "Adult", "Senior", "Teenager"], "Senior",
     ["Child"], 4.6),
    ("emotion_recognition", "Which emotion does the speaker's voice convey?", ["Happy", "Sad", "Angry", "Neutral"],
     "Sad", ["Happy"], 5.8),
    ("intonation_perception", "Is the speaker's intonation rising or falling at the end?",
     ["Rising", "Falling", "null", "null"], "Rising", ["Falling"], 2.1),
]


def write_wav(path: Path, seconds: float, seed: int) -> None:
    """A 16 kHz mono 16-bit PCM clip (a voiced-like harmonic tone in noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 110 + 40 * seed
    signal = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    signal = 0.2 * signal / np.abs(signal).max() + 0.01 * rng.normal(size=t.size)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(RATE)
        f.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())


def write_voxparadox(root: Path) -> Path:
    """The release's ``metadata.jsonl`` and clips (audio-folder layout: ``file_name`` relative to it)."""
    rows = []
    for i, (task, question, choices, answer, adversarial, seconds) in enumerate(QUESTIONS):
        name = f"audio/{task}_{i:04d}.wav"
        write_wav(root / name, seconds, i)
        rows.append({"file_name": name, "id": f"{task}_{i:04d}", "task_name": task, "question": question,
                     **{f"choice_{c}": text for c, text in zip("abcd", choices)}, "answer_gt": answer,
                     "adversarial_labels": adversarial})
    (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def write_training(root: Path) -> Path:
    """``train.jsonl`` / ``val.jsonl`` in the generic layout (audio relative to ``root``, 16 kHz)."""
    for split, count in (("train", 8), ("val", 2)):
        lines = []
        for i in range(count):
            task, question, choices, answer, adversarial, seconds = QUESTIONS[(i + (split == "val")) % 4]
            options = [c for c in choices if c != "null"]
            name = f"clips/{split}_{i:04d}.wav"
            write_wav(root / name, seconds, 10 + i + 5 * (split == "val"))
            lines.append({"audio": name, "question": question, "options": options, "label": answer, "task": task,
                          "adv_label": adversarial[0]})
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return root


def qwen2_audio_folder(folder: Path) -> Path:
    """``models/Qwen2-Audio-7B-Instruct`` (the full audio LLM, whose ``audio_tower`` the encoder takes), its
    language model saved on its own under ``language_model/`` (as the configs expect) and the stand-in tokenizer;
    random bfloat16 weights of the published architecture at `AUDIO_LAYERS` encoder and `LM_LAYERS` decoder
    layers."""
    target = folder / "models" / "Qwen2-Audio-7B-Instruct"
    if done(target):
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2AudioForConditionalGeneration

    values = architecture("Qwen2-Audio-7B-Instruct")
    values["audio_config"] = {**values["audio_config"], "encoder_layers": AUDIO_LAYERS}
    values["text_config"] = {**values["text_config"], "num_hidden_layers": LM_LAYERS}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    model = Qwen2AudioForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    save_random(model, target)
    with torch.device("meta"):  # the outer model's own LLM modules, saved as a causal LM of their own
        language_model = AutoModelForCausalLM.from_config(config.text_config)
    language_model.model, language_model.lm_head = model.model.language_model, model.lm_head
    save_random(language_model, target / "language_model")
    del model, language_model
    texts = [q[1] + "\n" + "\n".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(q[2])) + "\nAnswer:"
             for q in QUESTIONS]
    qwen2_tokenizer(target, texts, QWEN2_AUDIO_SPECIALS)
    mark_done(target)
    return target


def write(folder: Path) -> list[str]:
    release = write_voxparadox(folder / "data" / "VoxParadox")
    training = write_training(folder / "data" / "paralinguistic_mcq")
    model = qwen2_audio_folder(folder)
    return ["--data.init_args.data_format=voxparadox", f"--data.init_args.data_dir={release}",
            f"--data.init_args.train_dir={training}", f"--data.init_args.tokenizer_path={model}",
            "--data.init_args.num_workers=0", f"--model.init_args.encoder.init_args.path={model}",
            f"--model.init_args.language_model.init_args.path={model / 'language_model'}"]


SIZE = ("--data.init_args.batch_size=2", "--model.init_args.language_model.init_args.dtype=bfloat16",
        "--trainer.max_epochs=-1", "--trainer.val_check_interval=2")
PCLM_LAYERS = ("--model.init_args.pclm_layers=[1, 2, 3, 4, 5]",)
BASE_NOTE = (f"Qwen2-Audio-7B-Instruct at {AUDIO_LAYERS} of its 32 encoder layers (d 1280, 20 heads, FFN 5120, 128 "
             f"mel bins, 30 s input) and {LM_LAYERS} of its 32 LLM layers (hidden 4096, 32 heads, FFN 11008, "
             "vocabulary 156,032), random bfloat16 weights (the LLM in bfloat16, published float32); batch 2 "
             "(published 8 per device); tokenizer: a byte-level BPE stand-in with Qwen2's vocabulary size and "
             "special-token ids (the released merges are not here); max_epochs lifted and validation every 2 "
             "batches (published: every 2,000 / 1,000) so that the step count ends each fit on 8 training questions")
MIX_NOTE = "; PCLM mixes hidden states [1, 2, 3, 4, 5] (published [5, 15, 25, 30, 32] of 32)"
ADAFACTOR = ("--model.init_args.optimizer=torch.optim.Adafactor",)
ADAFACTOR_NOTE = ("; optimizer Adafactor instead of AdamW (lr as configured): AdamW's two states of the 1.5 B "
                  "trainable LLM parameters would not fit the ~10 GiB of one CPU run")
TEST = ("--data.init_args.batch_size=1",)


def init_from(config_dir: str) -> str:
    return f"--model.init_args.init_from=runs/pclm/{config_dir}/checkpoints/latest/last.ckpt"


CASES = {
    "configs/pclm/sft_paper.yaml": Case(write, args=SIZE, note=BASE_NOTE, release_format=FORMAT, test_args=TEST),
    "configs/pclm/paper.yaml": Case(
        write, args=(*SIZE, *PCLM_LAYERS, init_from("paper_sft")), note=BASE_NOTE + MIX_NOTE,
        release_format=FORMAT, test_args=TEST, after=("configs/pclm/sft_paper.yaml",)),
    "configs/pclm/stage2_paper.yaml": Case(
        write, args=(*SIZE, *PCLM_LAYERS, *ADAFACTOR, init_from("paper")),
        note=BASE_NOTE + MIX_NOTE + ADAFACTOR_NOTE, release_format=FORMAT, test_args=TEST,
        after=("configs/pclm/paper.yaml",)),
    "configs/pclm/dpo_paper.yaml": Case(
        write, args=(*SIZE, *PCLM_LAYERS, *ADAFACTOR, init_from("paper_stage2")),
        note=BASE_NOTE + MIX_NOTE + ADAFACTOR_NOTE + " (batch 2 x 2 accumulated; published 4 x 2)",
        release_format=FORMAT, test_args=TEST, after=("configs/pclm/stage2_paper.yaml",),
        memory_gib=20),  # peak RSS 18.3 GiB, in the resume: policy, frozen reference, Adafactor state, mapped file
}
