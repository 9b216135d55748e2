"""A toy multimodal LLM for HiDe's CPU experiment (arXiv 2510.00054 evaluates Qwen2.5-VL / InternVL3; this is a
stand-in with the same interface, small enough to train on a CPU in a minute).

``ToyMLLMBackbone``: each image is letterboxed to a square and resized to ``resolution`` px, cut into
``patch_size`` patches (one token each, a linear embedding plus a 2-D sinusoidal code of the patch centre in [0, 1]
and a learned image-index embedding, so any resolution gives valid positions), followed by a separator token; up to
``max_images`` images, then the question's word tokens (a fixed vocabulary). A causal pre-LN transformer
(``depth`` layers, ``heads`` heads, width ``dim``) reads the sequence, and an answer head over the option letters
reads the state of the last question token (the position where an autoregressive MLLM would start its answer).
Causal attention means the image tokens never see the question: the question tokens have to look for the target,
which is what HiDe reads from their attention. Batches are left-padded (padding keys masked).

The HiDe interface (used by `lightning_modules.hide.hide.HiDe`): ``extract_entities`` (the question's words naming
objects and attributes: a rule, where HiDe prompts the MLLM), ``attention_maps`` (one forward on [image(s),
question] with the head-averaged attention of one layer, rows = question tokens, one ``[tokens, g, g]`` map per
image; prior tokens = the question's non-entity words, the role the fixed "Search the following entities" prefix
plays for Qwen), ``answer`` (option index), ``training_loss`` (cross-entropy of the answer).

``ToyMLLM`` trains it (Adam, cross-entropy over the valid options) on the embedded high-resolution generator's
mixture of single images and [image, crop] pairs (`datamodules.high_resolution_vqa`); validation accuracy on single
full images. ``train.py predict`` writes its answer to every question (one JSONL row: id, category, question,
options, the predicted and the true option text, ``correct`` and the option probabilities), on the full image only,
as validated.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.errors import UserInputError

VOCABULARY = ["<pad>", "<sep>", "what", "colour", "is", "the", "square", "left", "or", "right", "of", "red",
              "green", "blue", "yellow"]
ENTITY_WORDS = {"square", "red", "green", "blue", "yellow"}
PAD, SEP = 0, 1
KIND_PAD, KIND_IMAGE, KIND_SEP, KIND_TEXT = 0, 1, 2, 3


def letterbox(image: Tensor, resolution: int) -> Tensor:
    """uint8/float ``[H, W, 3]`` -> float ``[3, resolution, resolution]`` in [0, 1]: padded (black, centred) to a
    square, then resized with antialiasing (area-like when shrinking, bilinear when enlarging)."""
    x = image.permute(2, 0, 1).float() / 255.0 if image.dtype == torch.uint8 else image.permute(2, 0, 1).float()
    _, h, w = x.shape
    side = max(h, w)
    top, left = (side - h) // 2, (side - w) // 2
    x = F.pad(x, (left, side - w - left, top, side - h - top))
    return F.interpolate(x[None], size=(resolution, resolution), mode="bilinear", antialias=True,
                         align_corners=False)[0]


def sinusoid_2d(u: Tensor, v: Tensor, dim: int) -> Tensor:
    """``[N, dim]`` sin/cos features of coordinates ``u, v`` in [0, 1] (dim/4 geometric frequencies each)."""
    freqs = torch.exp(torch.linspace(0, math.log(64.0), dim // 4)) * math.pi
    parts = [f(c[:, None] * freqs) for c in (u, v) for f in (torch.sin, torch.cos)]
    return torch.cat(parts, dim=1)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor, mask: Tensor, need_probs: bool = False) -> tuple[Tensor, Tensor | None]:
        """``mask[b, i, j]``: query i may attend key j. The probabilities are formed explicitly only when asked
        (HiDe's attention pass); otherwise the fused kernel computes the same attention."""
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        probs = None
        if need_probs:
            scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
            probs = scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1)
            mixed = probs @ v
        else:
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + self.out(mixed.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x)), probs


class ToyMLLMBackbone(nn.Module):
    """Patch tokens of up to ``max_images`` images + separators + question words -> option logits."""

    def __init__(self, resolution: int = 64, patch_size: int = 8, dim: int = 64, depth: int = 3, heads: int = 4,
                 max_images: int = 2, max_text: int = 16, max_options: int = 4) -> None:
        super().__init__()
        if resolution % patch_size:
            raise UserInputError(f"resolution={resolution} must be a multiple of patch_size={patch_size}.")
        if dim % 4 or dim % heads:
            raise UserInputError(f"dim={dim} must be divisible by 4 and by heads={heads}.")
        self.resolution, self.patch_size, self.dim, self.depth = resolution, patch_size, dim, depth
        self.max_images, self.max_text, self.max_options = max_images, max_text, max_options
        self.patch = nn.Linear(3 * patch_size * patch_size, dim)
        self.image_index = nn.Embedding(max_images, dim)
        self.words = nn.Embedding(len(VOCABULARY), dim)
        self.text_position = nn.Embedding(max_text, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, max_options)

    # ------------------------------------------------------------------------------------------ inputs
    def tokenize(self, question: str) -> list[int]:
        words = question.lower().replace("?", " ").split()
        unknown = [w for w in words if w not in VOCABULARY]
        if unknown:
            raise UserInputError(f"the toy MLLM knows only the words {VOCABULARY[2:]}; question {question!r} has "
                                 f"{unknown}. It answers the embedded synthetic questions only.")
        if not words or len(words) > self.max_text:
            raise UserInputError(f"question {question!r} has {len(words)} words; "
                                 f"the toy MLLM takes 1..{self.max_text}.")
        return [VOCABULARY.index(w) for w in words]

    def _sequence(self, images: list[Tensor], question: str, resolution: int | None) -> dict[str, Tensor]:
        if not 1 <= len(images) <= self.max_images:
            raise UserInputError(f"the toy MLLM takes 1..{self.max_images} images, got {len(images)}.")
        res = resolution or self.resolution
        if res % self.patch_size:
            raise UserInputError(f"resolution {res} is not a multiple of patch_size={self.patch_size}.")
        g, p = res // self.patch_size, self.patch_size
        device = self.patch.weight.device
        centres = (torch.arange(g, dtype=torch.float32) + 0.5) / g
        v, u = torch.meshgrid(centres, centres, indexing="ij")
        pos = sinusoid_2d(u.flatten(), v.flatten(), self.dim).to(device)
        parts, kinds, spans = [], [], []
        for i, image in enumerate(images):
            x = letterbox(image.to(device), res)                                      # [3, res, res]
            patches = x.view(3, g, p, g, p).permute(1, 3, 0, 2, 4).reshape(g * g, 3 * p * p)
            start = sum(len(t) for t in parts)
            parts.append(self.patch(patches) + pos + self.image_index.weight[i])
            parts.append(self.words.weight[SEP][None])
            kinds += [KIND_IMAGE] * (g * g) + [KIND_SEP]
            spans.append((start, start + g * g, g))
        ids = torch.tensor(self.tokenize(question), device=device)
        parts.append(self.words(ids) + self.text_position.weight[:len(ids)])
        kinds += [KIND_TEXT] * len(ids)
        return {"x": torch.cat(parts), "kinds": torch.tensor(kinds, device=device), "spans": spans,
                "text_start": len(kinds) - len(ids), "text_ids": ids}

    def forward_sequences(self, sequences: list[dict], capture_layer: int | None = None
                          ) -> tuple[Tensor, Tensor | None, list[int]]:
        """Left-padded batch forward: (last-token states [B, dim], head-mean attention of ``capture_layer``
        (0-based) [B, S, S] or None, left offsets)."""
        length = max(len(s["kinds"]) for s in sequences)
        device = self.patch.weight.device
        x = torch.zeros(len(sequences), length, self.dim, device=device)
        valid = torch.zeros(len(sequences), length, dtype=torch.bool, device=device)
        offsets = []
        for b, s in enumerate(sequences):
            off = length - len(s["kinds"])
            x[b, off:] = s["x"]
            valid[b, off:] = True
            offsets.append(off)
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        mask = (causal[None] & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=device)[None]
        captured = None
        for index, block in enumerate(self.blocks):
            x, probs = block(x, mask, need_probs=index == capture_layer)
            if index == capture_layer:
                captured = probs.mean(1)
        return self.norm(x[:, -1]), captured, offsets

    def logits(self, examples: list[tuple[list[Tensor], str, int]], resolution: int | None = None) -> Tensor:
        """Option logits ``[B, max_options]`` (invalid options -inf) for (images, question, number of options)."""
        for _, _, n in examples:
            if not 2 <= n <= self.max_options:
                raise UserInputError(f"the toy MLLM answers 2..{self.max_options} options, got {n}.")
        states, _, _ = self.forward_sequences([self._sequence(im, q, resolution) for im, q, _ in examples])
        logits = self.head(states)
        valid = torch.arange(self.max_options, device=logits.device)[None] < torch.tensor(
            [n for _, _, n in examples], device=logits.device)[:, None]
        return logits.masked_fill(~valid, float("-inf"))

    # ------------------------------------------------------------------------------------------ HiDe interface
    @property
    def num_layers(self) -> int:
        return self.depth

    def prepare(self) -> None:
        """Nothing to load (the Qwen backbone loads its weights here)."""

    def extract_entities(self, question: str) -> list[str]:
        return [w for w in question.lower().split() if w in ENTITY_WORDS]

    @torch.no_grad()
    def attention_maps(self, images: list[Tensor], question: str, entities: list[str], layer: int
                       ) -> tuple[list[np.ndarray], list[int], list[int]]:
        """One forward on [images, question]; ``layer`` 0-based. Returns one ``[question tokens, g, g]`` map per
        image (head-mean attention of each question token over the image's patch tokens), prior and entity rows."""
        seq = self._sequence(images, question, None)
        _, probs, offsets = self.forward_sequences([seq], capture_layer=layer)
        rows = probs[0, offsets[0] + seq["text_start"]:]                    # [T, S]
        maps = [rows[:, offsets[0] + a:offsets[0] + b].reshape(len(rows), g, g).float().cpu().numpy()
                for a, b, g in seq["spans"]]
        words = [VOCABULARY[i] for i in seq["text_ids"].tolist()]
        wanted = set(entities)
        entity = [k for k, w in enumerate(words) if w in wanted]
        prior = [k for k, w in enumerate(words) if w not in wanted]
        return maps, prior, entity

    @torch.no_grad()
    def answer(self, images: list[Tensor], question: str, options: list[str], resolution: int | None = None) -> int:
        return int(self.logits([(images, question, len(options))], resolution).argmax(-1))

    def training_loss(self, batch: list[dict]) -> tuple[Tensor, Tensor]:
        """(mean cross-entropy, per-example correctness) of a batch of example dicts."""
        logits = self.logits([(e["images"], e["question"], len(e["options"])) for e in batch])
        target = torch.tensor([e["answer"] for e in batch], device=logits.device)
        return F.cross_entropy(logits, target), (logits.argmax(-1) == target).float()


class ToyMLLM(PaperModule):
    """Trains `ToyMLLMBackbone` on [image] / [image, crop] questions (HiDe then runs from its checkpoint).

    Args:
        backbone: the toy MLLM network.
        optimizer / lr_scheduler / init_from / init_from_trusted: see `PaperModule`.
    """

    def __init__(self, backbone: nn.Module, optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer, lr_scheduler, init_from, init_from_trusted)
        self.save_hyperparameters()
        self.backbone = backbone
        self.val_accuracy, self.test_accuracy = MeanMetric(), MeanMetric()

    def training_step(self, batch: list[dict], batch_idx: int) -> Tensor:
        loss, correct = self.backbone.training_loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        self.log("train/accuracy", correct.mean(), batch_size=len(batch))
        return loss

    def _evaluate(self, batch: list[dict], metric: MeanMetric, stage: str) -> None:
        loss, correct = self.backbone.training_loss([{**e, "images": e["images"][:1]} for e in batch])
        metric.update(correct)
        self.log(f"{stage}/accuracy", metric, prog_bar=True, batch_size=len(batch))

    def validation_step(self, batch: list[dict], batch_idx: int) -> None:
        self._evaluate(batch, self.val_accuracy, "val")

    def test_step(self, batch: list[dict], batch_idx: int) -> None:
        self._evaluate(batch, self.test_accuracy, "test")

    def predict_step(self, batch: list[dict], batch_idx: int) -> dict[str, Tensor]:
        logits = self.backbone.logits([(e["images"][:1], e["question"], len(e["options"])) for e in batch])
        return {"probs": logits.softmax(-1), "prediction": logits.argmax(-1)}

    def prediction_fields(self, outputs: dict[str, Tensor], batch: list[dict]) -> dict:
        """Per question: id, category, question, options, predicted and true option text, ``correct``, probs."""
        predicted = outputs["prediction"].tolist()
        answers = torch.tensor([e["answer"] for e in batch])
        return {"id": [str(e.get("id", "")) for e in batch], "category": [str(e["category"]) for e in batch],
                "question": [e["question"] for e in batch], "options": [list(e["options"]) for e in batch],
                "predicted": [e["options"][p] for e, p in zip(batch, predicted)],
                "answer": [e["options"][e["answer"]] for e in batch],
                "correct": (outputs["prediction"].cpu() == answers).long(), "probs": outputs["probs"]}
