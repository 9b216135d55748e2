"""HiDe's paper config (arXiv 2510.00054, Table 1: Qwen2.5-VL-7B-Instruct on V* Bench; training-free, so test ->
predict) on V* Bench's release layout (``craigwu/vstar_bench``: ``test_questions.jsonl`` at the top, the images in
``direct_attributes/`` and ``relative_position/`` with each image's annotation ``.json`` beside it), with a
Qwen2.5-VL-7B-Instruct of the published widths and random weights."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.paper_steps import Case
from experiments.paper_steps._hf_standins import (QWEN25_VL_SPECIALS, architecture, done, mark_done,
                                                  qwen2_tokenizer, save_random)

TEXT_LAYERS, VISION_LAYERS = 2, 2
SIZE = (2246, 1500)  # width x height of a typical V* image (SA-1B photographs, 2,246 x 1,500 pixels)
FORMAT = ("V* Bench (craigwu/vstar_bench): test_questions.jsonl (image, text with (A)-(D) option lines and the "
          "instruction, category, question_id, label) + direct_attributes/ and relative_position/ with sa_*.jpg "
          "(2246 x 1500 RGB JPEG) and the annotation sa_*.json (target_object, bbox [x, y, w, h], question, "
          "options) beside each; 2 questions")
QUESTIONS = [
    ("direct_attributes", "sa_4690", "What is the color of the woman's bag?", ["white", "black", "red", "green"],
     ["woman's bag"], [[1210, 640, 46, 58]]),
    ("relative_position", "sa_10071", "Is the dog on the left or right side of the bicycle?", ["left", "right"],
     ["dog", "bicycle"], [[300, 900, 80, 60], [1500, 820, 120, 90]]),
]
INSTRUCTION = "Answer with the option's letter from the given choices directly."


def write_vstar(root: Path) -> Path:
    """The V* Bench files of `QUESTIONS` under ``root`` (noise photographs; the annotation's correct option is
    first, as released; test_questions.jsonl gives the lettered question with the answer at (A))."""
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = []
    for number, (category, name, question, options, targets, boxes) in enumerate(QUESTIONS):
        folder = root / category
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{name}.jpg", quality=90)
        (folder / f"{name}.json").write_text(json.dumps({"target_object": targets, "bbox": boxes,
                                                         "question": question, "options": options}))
        letters = "\n".join(f"({'ABCD'[i]}) {text}" for i, text in enumerate(options))
        rows.append({"image": f"{category}/{name}.jpg", "text": f"{question}\n{letters}\n{INSTRUCTION}",
                     "category": category, "question_id": number, "label": "A"})
    (root / "test_questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def qwen_vl_folder(folder: Path) -> Path:
    """``models/Qwen2.5-VL-7B-Instruct``: the published architecture at `TEXT_LAYERS` decoder and `VISION_LAYERS`
    vision blocks (the last one full attention, as every 8th of the 32), random bfloat16 weights; the released
    image processor settings (Qwen2VLImageProcessor: patch 14, merge 2, temporal patch 2, CLIP mean and std) and
    the stand-in tokenizer with Qwen2's vocabulary size and special ids (``<|image_pad|>`` = 151655)."""
    target = folder / "models" / "Qwen2.5-VL-7B-Instruct"
    if done(target):
        return target
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, Qwen2VLImageProcessor

    values = architecture("Qwen2.5-VL-7B-Instruct")
    values["text_config"] = {**values["text_config"], "num_hidden_layers": TEXT_LAYERS}
    values["vision_config"] = {**values["vision_config"], "depth": VISION_LAYERS,
                               "fullatt_block_indexes": [VISION_LAYERS - 1]}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    save_random(AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16), target)
    Qwen2VLImageProcessor(min_pixels=256 * 28 * 28, max_pixels=12845056, patch_size=14, merge_size=2,
                          temporal_patch_size=2, image_mean=[0.48145466, 0.4578275, 0.40821073],
                          image_std=[0.26862954, 0.26130258, 0.27577711]).save_pretrained(str(target))
    from lightning_modules.hide import hide

    texts = [q[2] + " " + " ".join(q[3]) for q in QUESTIONS] + [getattr(hide, "ENTITY_PROMPT", "")]
    qwen2_tokenizer(target, texts, QWEN25_VL_SPECIALS)
    mark_done(target)
    return target


def write(folder: Path) -> list[str]:
    data = write_vstar(folder / "data" / "vstar_bench")
    model = qwen_vl_folder(folder)
    return [f"--data.init_args.data_dir={data}", f"--model.init_args.backbone.init_args.model_path={model}"]


ARGS = ("--model.init_args.select_layer=2", "--model.init_args.backbone.init_args.max_pixels=200704",
        "--model.init_args.backbone.init_args.entity_max_new_tokens=16",
        "--model.init_args.backbone.init_args.answer_max_new_tokens=4")
NOTE = (f"Qwen2.5-VL-7B-Instruct at {TEXT_LAYERS} of its 28 decoder layers (hidden 3584, 28 heads, 4 KV heads, FFN "
        f"18944, vocabulary 152,064) and {VISION_LAYERS} of its 32 vision blocks (width 1280, 16 heads, the last "
        "one full attention), random bfloat16 weights; attention read at layer 2 (published: 15 of 28); "
        "max_pixels 256*28*28 (published 16384*28*28: the 2246 x 1500 images are resized to about 256 visual "
        "tokens instead of about 4,300); entity generation 16 new tokens (published 1024), answer 4 (16); "
        "tokenizer: a byte-level BPE stand-in with Qwen2's vocabulary size and special-token ids (the released "
        "merges are not here); 1 question per stage (eval batch 1 as configured)")

CASES = {
    "configs/hide/paper.yaml": Case(write, args=ARGS, note=NOTE, inference_only=True, release_format=FORMAT),
}
