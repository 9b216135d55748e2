"""HiDe: training-free zoom-in for multimodal LLMs.

Paper: "HiDe: Rethinking the Zoom-IN Method in High Resolution MLLMs via Hierarchical Decoupling" (Liu, Hu, Zou,
Wu, Xu, Zheng; arXiv 2510.00054, ICML 2026). Official code: github.com/Tennine2077/HiDe (``Hide/Qwen2.5/
inference.py``, ``Get_box.py``, ``utiles.py``). The algorithm's math lives in `lightning_modules.hide.hide_zoom`.

Method (three model calls per question, nothing trained):

1. **Entities** (TAD part 1): the MLLM is prompted, text only, to list the question's entities in a canonical form
   ("noun with <value> <type>", possessives as "Y of X", relations split), wrapped in ``<FINAL_OUTPUT>``.
2. **Attention** (TAD part 2): one forward on [image(s), "Search the following entities in the images: " +
   entities]; the attention probabilities of ONE decoder layer (``select_layer``, counted from 1 as in the code:
   15 = ``layers[14]`` of Qwen2.5-VL-7B), head-averaged, rows = text tokens after the last image, keys = each
   image's visual tokens on its (merged) token grid. The first ``prior_tokens`` rows (the fixed prefix) estimate
   a noise prior that is subtracted from every entity token's smoothed map (Gaussian ``sigma``), the rest is
   thresholded at ``threshold`` and cut into 8-connected components -> boxes.
3. **Answer** (LPD): overlapping boxes are merged and the image is compacted with relative positions kept; the
   model answers from [original image(s), compact image(s)] + question + "Answer with the option's letter".

Evaluation protocol: exact match of the predicted option letter, accuracy per category and overall
(`CategoryAccuracy`, a torchmetrics metric summed over processes); ``box_iou``: mean over questions with known
target boxes of the best IoU of HiDe's (merged, pixel) boxes with each target.

Backbones (``backbone``, an injected ``nn.Module`` with the interface ``num_layers``, ``prepare()``,
``extract_entities``, ``attention_maps``, ``answer``): `QwenVLBackbone` (a transformers Qwen2.5-VL from a local
folder) and `lightning_modules.hide.toy_mllm.ToyMLLMBackbone` (the CPU experiment's toy MLLM, loaded from a ``ToyMLLM``
checkpoint through ``init_from``: both modules keep the network under ``backbone.``).

Differences from the release (documented choices):

* The attention of the selected layer is recomputed from that layer's input by a forward hook (q/k projections,
  the layer's own rotary cos/sin, causal softmax, only the text query rows, a few heads at a time), so the model
  itself runs with any attention implementation (SDPA/flash). The release swaps in its own modelling file
  (``modeling_qwen2_5_vl_re_infer.py``) to do the same; a test checks the hook against eager ``output_attentions``.
* No entities extracted: the release's fallback calls its box function with an extra argument and crashes; here
  the question is answered from the original image(s) alone (no zoom), counted in ``no_zoom_rate``.
* The compact canvas is filled with ``fill`` (0: black, which is what a transparent RGBA pixel becomes after
  ``convert("RGB")``); the release saves a transparent PNG and lets the processor convert it.
* The entity-extraction prompt is our own wording of the paper's rules (the release's prompt is not copied).
* Layer, sigma, threshold and the prior/tail token counts are configuration (the release hard-codes them per
  backbone: Qwen2.5-VL 15 / 3 / 0.7, 8 prior tokens, the last 4 tokens dropped).
* ``fit`` with this module continues to train the toy backbone on its answer loss (the harness requires a fit;
  HiDe itself has no parameters); with the Qwen backbone ``fit`` is refused.
"""
from __future__ import annotations

import logging
import os
import re

import numpy as np
import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric

from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.errors import UserInputError, check_range, one_line
from lightning_modules.hide.hide_zoom import best_iou, compact_image, merge_boxes, scale_boxes, tad_boxes

log = logging.getLogger(__name__)
LETTERS = "ABCDEFGH"
SEARCH_PREFIX = "Search the following entities in the images: "
ANSWER_SUFFIX = "\nAnswer with the option's letter from the given choices directly."
ENTITY_PROMPT = (
    "List the entities (objects) that the question below refers to, so that they can be searched for in an image. "
    "Rules: write attributes as 'noun with <value> <type>' (type: color, size or material), e.g. 'cup with red "
    "color'; write possessives 'X's Y' as 'Y of X'; keep a phrase that describes an object attached to it (e.g. "
    "'man in a shirt with green color'); list objects that are only related by position separately (e.g. 'dog, "
    "scooter'); use lower case; separate entities by commas; put the final list between <FINAL_OUTPUT> and "
    "</FINAL_OUTPUT>.\nQuestion: ")


class CategoryAccuracy(Metric):
    """Accuracy per category and overall (correct / total counts, summed over processes)."""

    full_state_update = False

    def __init__(self, categories: list[str]) -> None:
        super().__init__()
        self.categories = list(categories)
        self.add_state("correct", torch.zeros(len(self.categories) + 1, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(len(self.categories) + 1, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, correct: list[bool], categories: list[str]) -> None:
        for ok, category in zip(correct, categories):
            index = self.categories.index(category) if category in self.categories else len(self.categories)
            self.correct[index] += int(ok)
            self.total[index] += 1

    def compute(self) -> dict[str, Tensor]:
        out = {"accuracy": self.correct.sum().float() / self.total.sum().clamp(min=1)}
        for i, name in enumerate(self.categories):
            if self.total[i] > 0:
                out[f"accuracy_{name}"] = self.correct[i].float() / self.total[i]
        return out


def parse_letter(text: str, num_options: int) -> int:
    """The option index of a generated answer ("B", "(B) cat", "The answer is B."); -1 when none is found."""
    text = text.strip()
    valid = LETTERS[:num_options]
    match = re.match(r"^\(?([A-H])\b", text)
    if match and match.group(1) in valid:
        return valid.index(match.group(1))
    found = re.findall(r"\b([A-H])\b", text)
    return valid.index(found[-1]) if found and found[-1] in valid else -1


def parse_entities(text: str) -> list[str]:
    """Entities from the extraction pass: the text inside <FINAL_OUTPUT>...</FINAL_OUTPUT> (else the whole
    output), split at commas, stripped, lower case, empties dropped."""
    match = re.search(r"<FINAL_OUTPUT>(.*?)(</FINAL_OUTPUT>|$)", text, flags=re.S)
    body = match.group(1) if match else text
    return [e.strip().lower() for e in body.replace("\n", ",").split(",") if e.strip()]


class HiDe(PaperModule):
    """HiDe evaluation (``validate`` / ``test`` / ``predict``) of a multimodal backbone.

    Args:
        backbone: `QwenVLBackbone` or `lightning_modules.hide.toy_mllm.ToyMLLMBackbone`.
        select_layer: decoder layer whose attention is read, counted from 1 (Qwen2.5-VL-7B: 15).
        sigma: Gaussian smoothing of the attention maps (token-grid units; Qwen2.5-VL: 3).
        threshold: on the purified, normalised map (Qwen2.5-VL: 0.7).
        top_n: keep at most this many components per token (the release: 100, effectively all).
        fill: value of the compact canvas outside the boxes (0 = black).
        categories: category names reported separately (others count only in the overall accuracy).
        optimizer / lr_scheduler / init_from / init_from_trusted: see `PaperModule` (``init_from``: a ToyMLLM
            checkpoint for the toy backbone).
    """

    def __init__(self, backbone: nn.Module, select_layer: int = 15, sigma: float = 3.0, threshold: float = 0.7,
                 top_n: int = 100, fill: int = 0, categories: list[str] = ("colour", "position"),
                 optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None, init_from: str | None = None,
                 init_from_trusted: bool = False) -> None:
        super().__init__(optimizer, lr_scheduler, init_from, init_from_trusted)
        self.save_hyperparameters()
        check_range("sigma", sigma, 0)
        check_range("threshold", threshold, 0, 1, low_inclusive=False)
        if select_layer < 1:
            raise UserInputError(f"select_layer={select_layer} is counted from 1 (the first decoder layer is 1).")
        if top_n < 1:
            raise UserInputError(f"top_n={top_n} must be >= 1.")
        self.backbone = backbone
        self.select_layer, self.sigma, self.threshold, self.top_n, self.fill = \
            select_layer, sigma, threshold, top_n, fill
        self.metrics = nn.ModuleDict({stage: CategoryAccuracy(list(categories)) for stage in ("val", "test")})
        self.box_iou = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})
        self.no_zoom = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})

    def setup(self, stage: str) -> None:
        self.check_backbone()  # first: the Qwen backbone's weights exist only once it is loaded
        super().setup(stage)  # init_from (a ToyMLLM checkpoint), in every stage: test/predict score those weights

    def check_backbone(self) -> None:
        """Load the backbone (Qwen: from its folder) and check ``select_layer`` against its depth."""
        self.backbone.prepare()
        depth = self.backbone.num_layers
        if self.select_layer > depth:
            raise UserInputError(f"select_layer={self.select_layer} is beyond the model's depth: it has {depth} "
                                 f"decoder layers (counted from 1). Use 1..{depth}.")

    # ------------------------------------------------------------------------------------------ the method
    def zoom(self, images: list[Tensor], question: str) -> dict:
        """TAD + LPD for one question: entities, boxes (merged, pixels, per image), compact images."""
        entities = self.backbone.extract_entities(question)
        out = {"entities": entities, "boxes": [[] for _ in images], "compact": []}
        if not entities:
            return out
        maps, prior, entity_rows = self.backbone.attention_maps(images, question, entities, self.select_layer - 1)
        boxes = tad_boxes(maps, prior, entity_rows, self.sigma, self.threshold, self.top_n)
        for i, (image, normalised) in enumerate(zip(images, boxes)):
            pixels = scale_boxes(normalised, image.shape[0], image.shape[1])
            if pixels:
                canvas, _, _ = compact_image(image.cpu().numpy(), pixels, fill=self.fill)
                out["boxes"][i] = merge_boxes(pixels)
                out["compact"].append(torch.from_numpy(canvas).to(image.device))
        return out

    def answer_example(self, example: dict) -> dict:
        """HiDe's answer to one example dict (images, question, options): the option index and the zoom."""
        images = list(example["images"])
        zoomed = self.zoom(images, example["question"])
        prediction = self.backbone.answer(images + zoomed["compact"], example["question"], list(example["options"]))
        return {"prediction": prediction, **zoomed}

    # ------------------------------------------------------------------------------------------ Lightning
    def training_step(self, batch: list[dict], batch_idx: int) -> Tensor:
        if not hasattr(self.backbone, "training_loss"):
            raise UserInputError("HiDe is training-free: run `test`, `validate` or `predict` with this backbone "
                                 "(fit only continues training the toy MLLM backbone).")
        loss, correct = self.backbone.training_loss(batch)
        self.log("train/loss", loss, batch_size=len(batch))
        return loss

    def _evaluate(self, batch: list[dict], stage: str) -> None:
        results = [self.answer_example(e) for e in batch]
        self.metrics[stage].update([r["prediction"] == e["answer"] for r, e in zip(results, batch)],
                                   [e["category"] for e in batch])
        for r, e in zip(results, batch):
            self.no_zoom[stage].update(float(not r["compact"]))
            if e.get("target_boxes"):
                boxes = r["boxes"][0]
                self.box_iou[stage].update(float(np.mean([best_iou(boxes, t) for t in e["target_boxes"]])))
        self.log(f"{stage}/no_zoom_rate", self.no_zoom[stage], batch_size=len(batch))
        if self.box_iou[stage].update_count:
            self.log(f"{stage}/box_iou", self.box_iou[stage], batch_size=len(batch))

    def _log_accuracy(self, stage: str) -> None:
        for name, value in self.metrics[stage].compute().items():
            self.log(f"{stage}/{name}", value)
        self.metrics[stage].reset()

    def validation_step(self, batch: list[dict], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_accuracy("val")

    def test_step(self, batch: list[dict], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_accuracy("test")

    def predict_step(self, batch: list[dict], batch_idx: int) -> dict[str, Tensor]:
        results = [self.answer_example(e) for e in batch]
        return {"prediction": torch.tensor([r["prediction"] for r in results]),
                "answer": torch.tensor([e["answer"] for e in batch]),
                "num_boxes": torch.tensor([sum(len(b) for b in r["boxes"]) for r in results])}


# ============================================================================================ Qwen2.5-VL
class QwenVLBackbone(nn.Module):
    """A transformers Qwen2.5-VL (or Qwen2-VL) checkpoint from a local folder, behind HiDe's interface.

    The folder holds what ``save_pretrained`` writes for the model, its tokenizer and its image processor (a
    Hugging Face snapshot of ``Qwen/Qwen2.5-VL-7B-Instruct``). Nothing is downloaded. The prompt follows the
    Qwen chat format (system "You are a helpful assistant.", user turn with ``<|vision_start|><|image_pad|>...
    <|vision_end|>`` per image, then the text; generation prompt ``<|im_start|>assistant\\n``).

    Args:
        model_path: local folder.
        min_pixels / max_pixels: the image processor's pixel limits (the release: 256*28*28 and 16384*28*28).
        prior_tokens: text tokens after the last image that form the noise prior (the release: 8, the fixed
            "Search the following entities in the images:" prefix under the Qwen tokenizer).
        tail_tokens: text tokens at the end that are not entity tokens (the release drops 4).
        entity_max_new_tokens / answer_max_new_tokens: greedy generation lengths.
        head_chunk: attention heads recomputed at a time in the attention pass (memory).
        dtype: weights' dtype ("auto", "bfloat16", "float32").
    """

    def __init__(self, model_path: str, min_pixels: int = 256 * 28 * 28, max_pixels: int = 16384 * 28 * 28,
                 prior_tokens: int = 8, tail_tokens: int = 4, entity_max_new_tokens: int = 1024,
                 answer_max_new_tokens: int = 16, head_chunk: int = 4, dtype: str = "auto") -> None:
        super().__init__()
        if min_pixels <= 0 or max_pixels < min_pixels:
            raise UserInputError(f"pixel limits min_pixels={min_pixels}, max_pixels={max_pixels}: need "
                                 "0 < min_pixels <= max_pixels.")
        if prior_tokens < 1 or tail_tokens < 0:
            raise UserInputError(f"prior_tokens={prior_tokens} must be >= 1 and tail_tokens={tail_tokens} >= 0.")
        self.model_path, self.min_pixels, self.max_pixels = model_path, min_pixels, max_pixels
        self.prior_tokens, self.tail_tokens, self.head_chunk, self.dtype = prior_tokens, tail_tokens, head_chunk, dtype
        self.entity_max_new_tokens, self.answer_max_new_tokens = entity_max_new_tokens, answer_max_new_tokens
        self.model: nn.Module | None = None
        self.tokenizer = None
        self.image_processor = None

    # ------------------------------------------------------------------------------------------ loading
    def prepare(self) -> None:
        if self.model is not None:
            return
        from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        path = os.path.expanduser(self.model_path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UserInputError(f"model_path '{self.model_path}' has no config.json: point it to a local folder "
                                 "with a Qwen2.5-VL checkpoint (save_pretrained output). Nothing is downloaded.")
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        except (ValueError, OSError, KeyError) as err:
            raise UserInputError(f"model_path '{self.model_path}': its config.json is not a transformers model "
                                 f"config ({one_line(err)}).") from None
        try:
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=self.dtype, local_files_only=True)
        except (ValueError, OSError, KeyError) as err:
            raise UserInputError(f"model_path '{self.model_path}' ({config.model_type}) cannot be loaded as an "
                                 f"image-text-to-text model: {one_line(err)}") from None
        layers = self._decoder_layers(model)
        if layers is None or not all(hasattr(getattr(layer, "self_attn", None), "q_proj") and
                                     hasattr(layer.self_attn, "k_proj") for layer in layers):
            raise UserInputError(f"model_path '{self.model_path}' ({config.model_type}): its decoder layers expose "
                                 "no self-attention with q_proj/k_proj, so HiDe cannot read attention weights. "
                                 "Use a Qwen2-VL / Qwen2.5-VL checkpoint.")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        vocab = self.tokenizer.get_vocab()
        missing = [t for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|im_start|>", "<|im_end|>")
                   if t not in vocab]
        if missing:
            raise UserInputError(f"the tokenizer in '{self.model_path}' lacks the Qwen-VL tokens {missing}.")
        self.image_processor = AutoImageProcessor.from_pretrained(
            path, size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}, local_files_only=True)
        model.requires_grad_(False).eval()
        self.model = model
        self.vision_start, self.vision_end = vocab["<|vision_start|>"], vocab["<|vision_end|>"]

    @staticmethod
    def _decoder_layers(model: nn.Module):
        for owner in (getattr(getattr(model, "model", None), "language_model", None), getattr(model, "model", None)):
            layers = getattr(owner, "layers", None)
            if isinstance(layers, nn.ModuleList):
                return layers
        return None

    @property
    def num_layers(self) -> int:
        self.prepare()
        return len(self._decoder_layers(self.model))

    # ------------------------------------------------------------------------------------------ prompts
    def _inputs(self, images: list[Tensor], text: str) -> dict[str, Tensor]:
        from PIL import Image

        device = next(self.model.parameters()).device
        prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        batch = {}
        if images:
            pil = [Image.fromarray(im.cpu().numpy().astype(np.uint8)) for im in images]
            vision = self.image_processor(images=pil, return_tensors="pt")
            merge = getattr(self.image_processor, "merge_size", 2)
            for thw in vision["image_grid_thw"]:
                count = int(thw.prod()) // merge ** 2
                prompt += "<|vision_start|>" + "<|image_pad|>" * count + "<|vision_end|>"
            batch = {"pixel_values": vision["pixel_values"].to(device),
                     "image_grid_thw": vision["image_grid_thw"].to(device)}
        prompt += text + "<|im_end|>\n<|im_start|>assistant\n"
        ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
        batch.update(input_ids=ids, attention_mask=torch.ones_like(ids))
        if images:
            image_id = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
            batch["mm_token_type_ids"] = (ids == image_id).long()
        return batch

    @torch.no_grad()
    def _generate(self, images: list[Tensor], text: str, max_new_tokens: int) -> str:
        inputs = self._inputs(images, text)
        out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return self.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    # ------------------------------------------------------------------------------------------ interface
    def extract_entities(self, question: str) -> list[str]:
        self.prepare()
        return parse_entities(self._generate([], ENTITY_PROMPT + question, self.entity_max_new_tokens))

    @torch.no_grad()
    def attention_maps(self, images: list[Tensor], question: str, entities: list[str], layer: int
                       ) -> tuple[list[np.ndarray], list[int], list[int]]:
        """Pass B: the head-mean attention of decoder ``layer`` (0-based) from every text token after the last
        image to each image's visual tokens, one ``[text tokens, h/merge, w/merge]`` map per image."""
        self.prepare()
        inputs = self._inputs(images, SEARCH_PREFIX + ", ".join(entities))
        captured = {}
        attention = self._decoder_layers(self.model)[layer].self_attn

        def hook(module, args, kwargs):
            captured["hidden"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            captured["rope"] = kwargs["position_embeddings"]

        handle = attention.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            self.model(**inputs, use_cache=False)
        finally:
            handle.remove()
        ids = inputs["input_ids"][0]
        ends = (ids == self.vision_end).nonzero().flatten()
        first_text = int(ends[-1]) + 1
        rows = torch.arange(first_text, len(ids), device=ids.device)
        probs = self.layer_attention(attention, captured["hidden"], captured["rope"], rows)   # [rows, S]
        merge = getattr(self.image_processor, "merge_size", 2)
        starts = (ids == self.vision_start).nonzero().flatten()
        maps = []
        for (t, h, w), start in zip(inputs["image_grid_thw"].tolist(), starts.tolist()):
            count = t * (h // merge) * (w // merge)
            block = probs[:, start + 1:start + 1 + count].float().reshape(len(rows), t, h // merge, w // merge)
            maps.append(block.mean(1).cpu().numpy())
        n = len(rows)
        prior = list(range(min(self.prior_tokens, n)))
        entity = list(range(self.prior_tokens, max(self.prior_tokens, n - self.tail_tokens)))
        return maps, prior, entity

    def layer_attention(self, attention: nn.Module, hidden: Tensor, rope: tuple[Tensor, Tensor], rows: Tensor
                        ) -> Tensor:
        """Softmax(q k^T / sqrt(d) + causal mask) of the query ``rows`` only, averaged over heads: ``[rows, S]``."""
        cos, sin = rope
        config = attention.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", heads)
        head_dim = getattr(attention, "head_dim", config.hidden_size // heads)
        seq = hidden.shape[1]
        q = attention.q_proj(hidden[:, rows]).view(1, len(rows), heads, head_dim).transpose(1, 2)
        k = attention.k_proj(hidden).view(1, seq, kv_heads, head_dim).transpose(1, 2)
        q = q * cos[:, rows].unsqueeze(1) + _rotate_half(q) * sin[:, rows].unsqueeze(1)
        k = k * cos.unsqueeze(1) + _rotate_half(k) * sin.unsqueeze(1)
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        causal = torch.arange(seq, device=hidden.device)[None] > rows[:, None]        # [rows, S] future keys
        total = torch.zeros(len(rows), seq, dtype=torch.float32, device=hidden.device)
        scale = getattr(attention, "scaling", head_dim ** -0.5)
        for h0 in range(0, heads, max(1, self.head_chunk)):
            scores = (q[0, h0:h0 + self.head_chunk].float() @ k[0, h0:h0 + self.head_chunk].float().transpose(-1, -2))
            scores = (scores * scale).masked_fill(causal[None], float("-inf"))
            total += scores.softmax(-1).sum(0)
        return total / heads

    def answer(self, images: list[Tensor], question: str, options: list[str]) -> int:
        self.prepare()
        text = question + "".join(f"\n({LETTERS[i]}) {o}" for i, o in enumerate(options)) + ANSWER_SUFFIX
        return parse_letter(self._generate(images, text, self.answer_max_new_tokens), len(options))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
