"""Multi-RLCR's paper config (Qwen3-8B, K = 3 tagged candidates with confidences) on question / answer-set JSON
lines (``data/multi_answer/train.jsonl`` and ``test.jsonl``)."""
from __future__ import annotations

import json
from pathlib import Path

from experiments.paper_steps import Case
from experiments.paper_steps.grpo import qwen_model_folder

FORMAT = ("JSON lines {\"question\": str, \"answers\": [str, ...]} in multi_answer/train.jsonl and test.jsonl "
          "(questions with several acceptable answers); model folder "
          "(save_pretrained: config.json, model.safetensors, tokenizer.json, tokenizer_config.json)")
LAYERS = 1
QUESTIONS = [  # ambiguous questions with several acceptable answers (AmbigQA / HotpotQA-style)
    ("Who played the lead role in the film adaptation of the novel?", ["Tom Hanks", "Gary Sinise"]),
    ("Which city hosted the Olympic Games in 2000 and 2004?", ["Sydney", "Athens"]),
    ("What is a common cause of chest pain in a 45-year-old smoker?", ["angina", "myocardial infarction", "GERD"]),
    ("Name a prime number between 10 and 20.", ["11", "13", "17", "19"]),
    ("Which planet has rings?", ["Saturn", "Jupiter", "Uranus", "Neptune"]),
    ("Who won the Nobel Prize in Physics in 1903?", ["Marie Curie", "Pierre Curie", "Henri Becquerel"]),
    ("What is the capital of the country with two capitals, Bolivia?", ["Sucre", "La Paz"]),
    ("Which language is an official language of Switzerland?", ["German", "French", "Italian", "Romansh"]),
]


def multi_answer_files(folder: Path) -> list[str]:
    model = qwen_model_folder(folder / "models", "Qwen3-8B", LAYERS)
    data = folder / "data" / "multi_answer"
    data.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", QUESTIONS), ("test.jsonl", QUESTIONS[::-1][:4])):
        (data / name).write_text("".join(json.dumps({"question": q, "answers": a}) + "\n" for q, a in rows),
                                 encoding="utf-8")
    return [f"--data.init_args.data_path={data / 'train.jsonl'}",
            f"--data.init_args.val_data_path={data / 'test.jsonl'}",
            f"--data.init_args.tokenizer_path={model}",
            f"--model.init_args.policy.init_args.path={model}",
            "--data.init_args.num_workers=0"]


CASES = {
    "configs/multi_answer_rl/paper.yaml": Case(
        multi_answer_files, release_format=FORMAT,
        args=("--model.init_args.optimizer=torch.optim.SGD",
              "--trainer.val_check_interval=2", "--trainer.max_epochs=2",
              "--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2",
              "--model.init_args.rollouts_per_prompt=4", "--model.init_args.micro_batch_size=8",
              "--model.init_args.max_new_tokens=16"),
        note=(f"Qwen3-8B architecture with {LAYERS} of 36 layers (widths, heads, KV heads, head_dim, vocabulary "
              "unchanged), random weights, bf16-true as configured, stand-in byte-level BPE tokenizer with the "
              "released special-token ids and chat template; 2 prompts x G = 4 rollouts (published 6 per device x "
              "32) of 16 new tokens (published up to 1536); SGD without momentum instead of AdamW (weights, "
              "gradients and AdamW's two bf16 moment buffers of the 1.44G parameters, most of them in the 152k-row "
              "embedding and output head, take 11.5 GB before activations, over the 10 GiB budget); validation after "
              "step 2 (published every 100 rollout batches; the 8-row file has 4 batches); max_epochs 2 (published 1): "
              "the stopped fit's last.ckpt is saved as at its epoch's end, so under max_epochs 1 the resume could not "
              "take step 3"),
        test_args=("--data.init_args.batch_size=1", "--data.init_args.eval_batch_size=1",
                   "--model.init_args.rollouts_per_prompt=2", "--model.init_args.max_new_tokens=8")),
}
