"""The emotion-hierarchy probe's paper config (arXiv 2507.10599, Sec. 3) on the official scenario-file layout
(github.com/phys-ai/Emotion-Hierarchy-LLMs ``data/hierarchy_prompts.txt``: one scenario per line), probing a
Llama-3.1-8B of the published widths with random weights (test -> predict; the probe is never trained)."""
from __future__ import annotations

from pathlib import Path

from experiments.paper_steps import Case
from experiments.paper_steps._hf_standins import (LAYERS_NOTE_TAIL, done, llama3_tokenizer, mark_done,
                                                  random_causal_lm)

LAYERS = 2
FORMAT = ("hierarchy_prompts.txt as the official repository ships it: one scenario per line (UTF-8 text, no "
          "label), 32 lines")
SUBJECTS = ("my best friend", "my sister", "a stranger", "my manager", "my neighbour", "an old classmate",
            "my partner", "the bus driver")
EVENTS = ("forgot my birthday after promising to call", "surprised me with tickets to the concert I wanted",
          "took credit for the project I finished", "came to the hospital when my father was ill",
          "laughed when I tripped on the stairs at the party", "wrote me a long letter after years of silence",
          "moved away without saying goodbye", "lent me money when I lost my job")


def scenarios(count: int = 32) -> list[str]:
    """``count`` one-sentence scenarios in the style of the official prompts (GPT-4o sentences of daily events)."""
    return [f"Yesterday {SUBJECTS[i % len(SUBJECTS)]} {EVENTS[(i * 3 + i // len(SUBJECTS)) % len(EVENTS)]}."
            for i in range(count)]


def llama_folder(folder: Path, name: str, texts: list[str], instruct: bool, whole_words: list[str] = ()) -> Path:
    """``models/<name>``: a Llama-3.1-8B of the published widths and vocabulary with `LAYERS` decoder layers
    (random bfloat16 weights) and the stand-in Llama-3 tokenizer (`experiments.paper_steps._hf_standins`)."""
    target = folder / "models" / name
    if not done(target):
        random_causal_lm(target, "Llama-3.1-8B", LAYERS)
        llama3_tokenizer(target, texts, instruct=instruct, whole_words=whole_words)
        mark_done(target)
    return target


def write(folder: Path) -> list[str]:
    from datamodules.emotion_corpus import shaver_words

    words = shaver_words()[0]
    lines = scenarios()
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "hierarchy_prompts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    prompt = " The emotion in this sentence is"
    model = llama_folder(folder, "Llama-3.1-8B", [s + prompt for s in lines], instruct=False, whole_words=words)
    return [f"--data.init_args.scenario_file={data / 'hierarchy_prompts.txt'}",
            f"--data.init_args.tokenizer_path={model}", f"--model.init_args.policy.init_args.path={model}"]


NOTE = (f"Llama-3.1-8B at {LAYERS} of its 32 decoder layers{LAYERS_NOTE_TAIL}; the 135 Shaver words single "
        "tokens of the stand-in; 32 scenarios (one batch of 32 as configured)")

CASES = {
    "configs/emotion_hierarchy/paper.yaml": Case(
        write, note=NOTE, inference_only=True, release_format=FORMAT,
        test_args=("--data.init_args.eval_batch_size=8",)),
}
