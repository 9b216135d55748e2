"""Sequential recommenders (SASRec, GRU4Rec) trained by next-item prediction, with full-ranking evaluation.

Used by RSIR, "Can Recommender Systems Teach Themselves? A Recursive Self-Improving Framework with Fidelity
Control" (arXiv 2602.15659); the recursion itself is `callbacks.rsir`.

**Model.** A backbone maps a left-padded item window (B, L) to hidden states (B, L, d); the score of item j at
position t is ``h_t . E_j`` with the item embedding table E tied to the input embeddings (SASRec). Backbones by
name: ``sasrec`` (causal self-attention, pre-LayerNorm blocks, learned absolute positions aligned to the right
end of the window, a final LayerNorm; attention never reads padding keys) and ``gru4rec`` (embedding -> GRU ->
linear to d; the weaker model of the weak-to-strong experiment).

**Losses** (all positions with a non-pad target, mean over them):
``full_softmax``: cross-entropy over all items 1..N (the pad column is excluded);
``sampled_softmax`` (the RSIR release, 256 negatives): per position ``logsumexp([s_pos, s_neg_1..M]) - s_pos``
with M negatives drawn uniformly *with replacement* from the items that are not in the row's input sequence and
not pad, no logQ correction. Deviation: the row's target items are also excluded (the release excludes only the
input items, so the last position's positive could be drawn as its own negative).

**Evaluation protocol.** ``eval_protocol: full`` (RSIR, default): every item 1..N is scored, the items of the
user's history window and the pad column are set to -inf, and the 0-based rank of the target is the number of
items scoring strictly higher (ties counted in the target's favour); Recall@K (= HR@K) and NDCG@K from
`LeaveOneOutMetrics`, logged as ``val/ndcg@10``, ``test/recall@20`` etc. ``eval_protocol: sampled`` is the
original SASRec protocol, logged under ``val_sampled100/...`` so it cannot be mistaken for full ranking: the
target is ranked against ``num_eval_negatives`` items drawn uniformly without replacement from the items outside
the history and target (`sample_eval_negatives`). Each user's negatives come from a generator of its own, seeded by
(``eval_seed``, the user's row index in its split) (`lightning_modules.shared.example_rng.ExampleGenerators`), and
the metrics are computed once per epoch from every rank's per-user ranks with the sampler's padding copies dropped
(`gather_examples`), so 1 and 2 processes report the same numbers. ``predict_step`` returns the
top-``predict_top_k`` item ids per user with the same masking.

Design note: the backbone is chosen by name plus sizes (not an injected ``nn.Module``), so that
``load_from_checkpoint`` rebuilds it from plain hyper-parameters and ``num_items`` is one checked value.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import SequenceData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExampleGenerators, draw_uniform, gather_examples
from lightning_modules.shared.ranking_metrics import (LeaveOneOutMetrics, leave_one_out_ranks, mask_known_items,
                                                      sampled_ranks)

BACKBONES = ("sasrec", "gru4rec")
LOSSES = ("full_softmax", "sampled_softmax")
STREAM_EVAL_NEGATIVES = 0  # `ExampleGenerators` stream of the sampled-protocol negatives


# ===================================================================================== backbones
class SASRecBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(dim, dim))
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = dropout

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=self.attn_dropout if self.training else 0.0)
        x = x + self.dropout(self.out(att.transpose(1, 2).reshape(b, n, d)))
        return x + self.dropout(self.ffn(self.norm2(x)))


class SASRec(nn.Module):
    """Causal transformer over a left-padded window (pre-LN, learned positions, tied item embeddings)."""

    def __init__(self, num_items: int, dim: int = 64, num_blocks: int = 2, num_heads: int = 1,
                 dropout: float = 0.2, max_len: int = 50) -> None:
        super().__init__()
        if dim % num_heads:
            raise UserInputError(f"hidden_dim={dim} must be divisible by num_heads={num_heads}.")
        self.item_embedding = nn.Embedding(num_items + 1, dim, padding_idx=0)
        self.position_embedding = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(SASRecBlock(dim, num_heads, dropout) for _ in range(num_blocks))
        self.norm, self.dropout, self.max_len, self.dim = nn.LayerNorm(dim), nn.Dropout(dropout), max_len, dim
        nn.init.normal_(self.item_embedding.weight, std=dim ** -0.5)
        with torch.no_grad():
            self.item_embedding.weight[0].zero_()

    def forward(self, items: Tensor) -> Tensor:
        n = items.shape[1]
        if n > self.max_len:
            raise UserInputError(f"a window of {n} items is longer than the model's max_len={self.max_len}.")
        valid = items != 0
        positions = torch.arange(self.max_len - n, self.max_len, device=items.device)
        x = self.item_embedding(items) * math.sqrt(self.dim) + self.position_embedding(positions)
        x = self.dropout(x) * valid.unsqueeze(-1)
        causal = torch.ones(n, n, dtype=torch.bool, device=items.device).tril()
        mask = causal & valid.unsqueeze(1)                                   # (B, n, n): key must be real
        mask = (mask | torch.eye(n, dtype=torch.bool, device=items.device)).unsqueeze(1)  # pad rows see self
        for block in self.blocks:
            x = block(x, mask) * valid.unsqueeze(-1)
        return self.norm(x)


class GRU4Rec(nn.Module):
    """Embedding -> GRU -> linear to the item-embedding size (tied output). Pad positions feed zero vectors."""

    def __init__(self, num_items: int, dim: int = 64, num_layers: int = 1, dropout: float = 0.2,
                 max_len: int = 50) -> None:
        super().__init__()
        self.item_embedding = nn.Embedding(num_items + 1, dim, padding_idx=0)
        self.gru = nn.GRU(dim, dim, num_layers=num_layers, batch_first=True)
        self.proj, self.dropout, self.max_len = nn.Linear(dim, dim), nn.Dropout(dropout), max_len

    def forward(self, items: Tensor) -> Tensor:
        hidden, _ = self.gru(self.dropout(self.item_embedding(items)))
        return self.proj(hidden)


def build_backbone(name: str, num_items: int, hidden_dim: int, num_blocks: int, num_heads: int,
                   dropout: float, max_len: int) -> nn.Module:
    if name == "sasrec":
        return SASRec(num_items, hidden_dim, num_blocks, num_heads, dropout, max_len)
    if name == "gru4rec":
        return GRU4Rec(num_items, hidden_dim, num_blocks, dropout, max_len)
    raise UserInputError(f"backbone={name!r} is unknown: choose one of {', '.join(BACKBONES)}.")


# ======================================================================================= losses
def full_softmax_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy over items 1..N at every position with target != 0. logits (B, L, N+1)."""
    logits = logits.clone()
    logits[..., 0] = float("-inf")
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0)


def sample_negatives(inputs: Tensor, target: Tensor, num_items: int, num_negatives: int) -> Tensor:
    """(B, L, M) uniform negatives with replacement, excluding pad and every item of the row's input/target."""
    b, n = inputs.shape
    allowed = torch.ones(b, num_items + 1, device=inputs.device)
    rows = torch.arange(b, device=inputs.device).view(-1, 1)
    allowed[rows.expand_as(inputs), inputs] = 0
    allowed[rows.expand_as(target), target] = 0
    allowed[:, 0] = 0
    empty = allowed.sum(1) == 0
    if empty.any():  # a row that covers every item: fall back to any non-pad item
        allowed[empty, 1:] = 1
    return torch.multinomial(allowed, n * num_negatives, replacement=True).view(b, n, num_negatives)


def sampled_softmax_loss(hidden: Tensor, item_embedding: Tensor, inputs: Tensor, target: Tensor,
                         num_negatives: int) -> Tensor:
    """RSIR's sampled softmax: mean over valid positions of logsumexp([pos, negs]) - pos."""
    negatives = sample_negatives(inputs, target, item_embedding.shape[0] - 1, num_negatives)
    positive = (hidden * item_embedding[target]).sum(-1, keepdim=True)              # (B, L, 1)
    negative = torch.einsum("bld,blmd->blm", hidden, item_embedding[negatives])     # (B, L, M)
    loss = torch.logsumexp(torch.cat([positive, negative], -1), -1) - positive.squeeze(-1)
    valid = target != 0
    return (loss * valid).sum() / valid.sum().clamp_min(1)


def sample_eval_negatives(allowed: Tensor, num: int, generator: torch.Generator | ExampleGenerators) -> Tensor:
    """(B, num) item ids per row, uniform without replacement among the row's ``allowed`` (B, N+1) items.

    The ``num`` allowed items with the largest i.i.d. U(0, 1) keys form a uniform subset without replacement
    (vectorised; the same distribution as ``torch.multinomial(allowed, num)``). With `ExampleGenerators` row b's
    keys come from example b's generator, so a user's negatives do not depend on the rest of its batch.
    """
    counts = allowed.sum(1)
    if bool((counts < num).any()):
        raise UserInputError(f"a user has only {int(counts.min())} items outside its history and target, fewer than "
                             f"num_eval_negatives={num}: lower model.init_args.num_eval_negatives.")
    keys = draw_uniform(allowed.shape, generator, device=allowed.device)
    return keys.masked_fill(~allowed, -1.0).topk(num, dim=1).indices


# ======================================================================================= module
class SequentialRecommender(PaperModule):
    """Next-item recommender with a named backbone (see the module docstring).

    Args:
        num_items: number of items N (ids 1..N, 0 = pad); must equal the datamodule's. ``null``: taken from
            the datamodule in ``setup`` (and stored in the checkpoint), for real data of unknown size.
        backbone: ``sasrec`` or ``gru4rec``. hidden_dim / num_blocks (GRU layers) / num_heads / dropout / max_len.
        loss: ``full_softmax`` or ``sampled_softmax`` (``num_negatives`` per position).
        eval_protocol: ``full`` (all items, history masked) or ``sampled`` (``num_eval_negatives``, labelled).
        ks: cutoffs of Recall@K / NDCG@K. predict_top_k: items returned per user by ``predict_step``.
        eval_seed: seed of the sampled-protocol negatives (a user's negatives are seeded by it and the user's row
            index, so they do not depend on the batch or the number of processes).
    """

    def __init__(self, num_items: int | None = 400, backbone: str = "sasrec", hidden_dim: int = 64, num_blocks: int = 2,
                 num_heads: int = 1, dropout: float = 0.2, max_len: int = 50,
                 loss: Literal["full_softmax", "sampled_softmax"] = "full_softmax", num_negatives: int = 256,
                 eval_protocol: Literal["full", "sampled"] = "full", num_eval_negatives: int = 100,
                 ks: Sequence[int] = (5, 10, 20), predict_top_k: int = 20, eval_seed: int = 0,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        if num_items is not None:
            check_range("num_items", num_items, 2)
            if eval_protocol == "sampled":
                check_range("num_eval_negatives", num_eval_negatives, 1, num_items - 1)
            check_range("predict_top_k", predict_top_k, 1, num_items)
        check_range("hidden_dim", hidden_dim, 1)
        check_range("num_blocks", num_blocks, 1)
        check_range("num_heads", num_heads, 1)
        check_range("dropout", dropout, 0.0, 1.0, high_inclusive=False)
        check_range("max_len", max_len, 1)
        check_range("num_negatives", num_negatives, 1)
        if loss not in LOSSES:
            raise UserInputError(f"loss={loss!r} is unknown: choose one of {', '.join(LOSSES)}.")
        if eval_protocol not in ("full", "sampled"):
            raise UserInputError(f"eval_protocol={eval_protocol!r} is unknown: choose 'full' or 'sampled'.")
        self.save_hyperparameters()
        ks = tuple(ks)
        self.backbone = None if num_items is None else self._build()
        self.ks = ks
        self._eval_rows: dict[str, list[tuple[Tensor, Tensor]]] = {"val": [], "test": []}
        self.metric_prefix = "" if eval_protocol == "full" else f"_sampled{num_eval_negatives}"

    def _build(self) -> nn.Module:
        h = self.hparams
        return build_backbone(h.backbone, h.num_items, h.hidden_dim, h.num_blocks, h.num_heads, h.dropout, h.max_len)

    def setup(self, stage: str) -> None:
        data_items = self.data(SequenceData).num_items
        if self.backbone is None:  # num_items: null = read from the data (stored in the checkpoint's hparams)
            if data_items is None:
                raise UserInputError("model.num_items is null but the datamodule has no num_items: set "
                                     "model.init_args.num_items.")
            self.hparams.num_items = data_items
            self.backbone = self._build()
        super().setup(stage)
        self.check_data_matches(SequenceData, {"num_items": self.hparams.num_items},
                                "model.num_items={model} but the data has {data} items: set model.init_args.num_items: "
                                "{data}.")
        data_len = self.data(SequenceData).max_len
        if data_len is not None and data_len > self.hparams.max_len:
            raise UserInputError(f"data.max_len={data_len} is longer than model.max_len={self.hparams.max_len}: set "
                                 "them equal.")

    # ------------------------------------------------------------------------------- scoring
    @property
    def item_embedding(self) -> Tensor:
        return self.backbone.item_embedding.weight

    def forward(self, items: Tensor) -> Tensor:
        """Hidden states (B, L, d) of a left-padded window."""
        return self.backbone(items)

    def score_next(self, items: Tensor) -> Tensor:
        """Scores (B, N+1) of every item (pad column included, unmasked) after the last position."""
        return self(items)[:, -1] @ self.item_embedding.T

    # ------------------------------------------------------------------------------- training
    def training_step(self, batch, batch_idx):
        inputs, target = batch
        hidden = self(inputs)
        if self.hparams.loss == "full_softmax":
            loss = full_softmax_loss(hidden @ self.item_embedding.T, target)
        else:
            loss = sampled_softmax_loss(hidden, self.item_embedding, inputs, target, self.hparams.num_negatives)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(inputs))
        return loss

    # ------------------------------------------------------------------------------- evaluation
    def masked_scores(self, history: Tensor) -> Tensor:
        scores = self.score_next(history)
        scores[:, 0] = float("-inf")
        return mask_known_items(scores, history)

    def _ranks(self, history: Tensor, target: Tensor, generator: torch.Generator | ExampleGenerators) -> Tensor:
        """0-based rank of each target: among all unmasked items (``full``) or its sampled negatives."""
        scores = self.masked_scores(history)
        if self.hparams.eval_protocol == "full":
            return leave_one_out_ranks(scores, target)
        allowed = torch.isfinite(scores)
        allowed.scatter_(1, target.view(-1, 1), False)
        negatives = sample_eval_negatives(allowed, self.hparams.num_eval_negatives, generator)
        return sampled_ranks(scores.gather(1, target.view(-1, 1)).squeeze(1), scores.gather(1, negatives))

    def _evaluate(self, batch, batch_idx: int, split: str) -> None:
        """Rank every user of the batch and keep (global index, rank) for the epoch's metrics.

        A ``(history, target)`` batch without an index (a hand-made loader) draws its negatives from one generator
        seeded by (``eval_seed``, batch index) and is counted as it comes (no padding copies can be dropped).
        """
        history, target = batch[0], batch[1]
        if len(batch) > 2:
            index = batch[2]
            generator = ExampleGenerators(self.hparams.eval_seed, index, STREAM_EVAL_NEGATIVES)
        else:
            world, rank = (self.trainer.world_size, self.trainer.global_rank) if self._trainer is not None else (1, 0)
            seen = sum(len(i) for i, _ in self._eval_rows[split])
            index = -1 - (seen + torch.arange(len(target), device=target.device)) * world - rank  # unique, < 0
            generator = torch.Generator().manual_seed(self.hparams.eval_seed * 1_000_003 + batch_idx)
        self._eval_rows[split].append((index.reshape(-1), self._ranks(history, target, generator)))

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "test")

    def on_validation_epoch_start(self) -> None:
        self._eval_rows["val"] = []

    def on_test_epoch_start(self) -> None:
        self._eval_rows["test"] = []

    def _log_metrics(self, split: str) -> None:
        """Recall@K / NDCG@K over every user once: all ranks' rows gathered, padding copies dropped."""
        rows, self._eval_rows[split] = self._eval_rows[split], []
        index = torch.cat([i for i, _ in rows]) if rows else torch.zeros(0, dtype=torch.long, device=self.device)
        ranks = torch.cat([r for _, r in rows]) if rows else torch.zeros(0, dtype=torch.long, device=self.device)
        _, ranks = gather_examples(index, ranks)
        metrics = LeaveOneOutMetrics(self.ks)
        metrics.update(ranks.cpu())
        values = LeaveOneOutMetrics.compute(metrics)  # the unwrapped compute: the rows are already every rank's
        self.log_dict({f"{split}{self.metric_prefix}/{k}": v for k, v in values.items()}, prog_bar=False,
                      sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
        history = batch[0]
        return self.masked_scores(history).topk(self.hparams.predict_top_k, dim=1).indices

    def prediction_fields(self, outputs, batch) -> dict:
        """The recommended item ids per sequence, best first (one CSV row per sequence)."""
        return {"top_items": outputs}
