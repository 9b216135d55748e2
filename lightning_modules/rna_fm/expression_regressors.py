"""The two regression baselines of RNA-FM (arXiv 2605.11622): HE2RNA-lite and a tRNAsformer-style transformer.

Both read the same cluster features as `lightning_modules.rna_fm.rna_fm.RNAFM` and train with MSE on standardised
log-expression:

* ``HE2RNARegressor`` (HE2RNA-lite): a per-cluster MLP (HE2RNA's 1x1 convolutions D -> hidden -> G), then for
  each gene the mean of its top-k cluster scores, k drawn from ``ks`` per training step and averaged over ``ks``
  in evaluation;
* ``TRNAsformerRegressor`` (tRNAsformer-style): a linear projection to ``dim``, a pre-norm transformer over the
  clusters, mean pooling, LayerNorm + Linear(dim -> G).

Their predictive distribution (for coverage, energy distance and CRPS) is Gaussian around the point prediction
with a per-gene residual std estimated on the validation split at every validation epoch (``residual_std``
buffer). Evaluation is RNA-FM's (`lightning_modules.rna_fm.expression_eval.SlideExpressionModule`). Both are
reduced re-implementations for comparison under one protocol, not the original HE2RNA / tRNAsformer code.
"""
from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import draw_normal
from lightning_modules.rna_fm.expression_eval import SlideExpressionModule


class ExpressionRegressor(SlideExpressionModule):
    """MSE regressor on standardised expression; Gaussian predictive distribution with validation residual std."""

    def build(self, structure: dict) -> None:
        self.register_buffer("residual_std", torch.ones(structure["num_genes"]))
        self.net = self.build_net(structure)

    def build_net(self, structure: dict) -> nn.Module:
        raise NotImplementedError

    def forward(self, features: Tensor) -> Tensor:
        return self.net(features)

    def loss(self, batch: dict[str, Tensor], generator=None, reduction: str = "mean") -> Tensor:
        prediction = self(self._check_batch(batch))
        if reduction == "mean":
            return F.mse_loss(prediction, batch["expression"])
        return ((prediction - batch["expression"]) ** 2).mean(1)

    def distribution(self, features: Tensor, k: int, generator) -> tuple[Tensor, Tensor]:
        point = self(features)
        noise = draw_normal((point.shape[0], k, point.shape[1]), generator, "cpu").to(point)
        return point, point.unsqueeze(1) + noise * self.residual_std

    def after_validation(self, point: Tensor, target: Tensor) -> None:
        if not self.trainer.sanity_checking:
            self.residual_std.copy_(((point - target) ** 2).mean(0).sqrt())


class HE2RNANet(nn.Module):
    """Per-cluster MLP to gene scores, then per gene the mean of the top-k clusters (k from ``ks``)."""

    def __init__(self, feature_dim: int, num_genes: int, hidden: int = 256, ks: Sequence[int] = (10,),
                 dropout: float = 0.25) -> None:
        super().__init__()
        self.ks = tuple(int(k) for k in ks)
        self.mlp = nn.Sequential(nn.Linear(feature_dim, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, num_genes))

    def forward(self, features: Tensor) -> Tensor:
        scores = self.mlp(features)  # [B, C, G] (1x1 convolutions = a shared per-cluster MLP)
        ordered = scores.sort(dim=1, descending=True).values
        if self.training:
            k = self.ks[int(torch.randint(len(self.ks), (1,)))]
            return ordered[:, :k].mean(1)
        return torch.stack([ordered[:, :k].mean(1) for k in self.ks]).mean(0)


class HE2RNARegressor(ExpressionRegressor):
    """HE2RNA-lite baseline. Args: hidden_dim, ks (top-k cluster pooling sizes), dropout; evaluation as RNA-FM;
    data_sizes: optional ``{num_genes, feature_dim, num_clusters}`` to build the network at construction
    (`SlideExpressionModule.build_from_sizes`)."""

    def __init__(self, hidden_dim: int = 256, ks: Sequence[int] = (10,), dropout: float = 0.25,
                 eval_samples: int = 1, test_samples: int = 19, coverage_level: float = 0.9,
                 top_ks: Sequence[int] = (20, 100), fdr_alpha: float = 0.05, sample_seed: int = 42,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False,
                 data_sizes: dict[str, int] | None = None) -> None:
        super().__init__(eval_samples=eval_samples, test_samples=test_samples, coverage_level=coverage_level,
                         top_ks=top_ks, fdr_alpha=fdr_alpha, sample_seed=sample_seed, optimizer=optimizer,
                         lr_scheduler=lr_scheduler, init_from=init_from, init_from_trusted=init_from_trusted)
        check_range("hidden_dim", hidden_dim, 1)
        check_range("dropout", dropout, 0.0, 1.0, high_inclusive=False)
        if not ks:
            raise UserInputError("ks must list at least one top-k size.")
        for k in ks:
            check_range("ks entry", k, 1)
        self.save_hyperparameters()
        self.build_from_sizes(data_sizes)

    def build_net(self, structure: dict) -> nn.Module:
        if max(self.hparams.ks) > structure["num_clusters"]:
            raise UserInputError(f"ks={list(self.hparams.ks)} exceeds the {structure['num_clusters']} clusters.")
        return HE2RNANet(structure["feature_dim"], structure["num_genes"], self.hparams.hidden_dim, self.hparams.ks,
                         self.hparams.dropout)


class TRNAsformerNet(nn.Module):
    """Linear(D -> dim), pre-norm transformer over clusters, mean pool, LayerNorm + Linear(dim -> G)."""

    def __init__(self, feature_dim: int, num_clusters: int, num_genes: int, dim: int = 256, depth: int = 2,
                 heads: int = 4, mlp_dim: int = 512, dropout: float = 0.1, cluster_position: str = "none") -> None:
        super().__init__()
        self.project = nn.Linear(feature_dim, dim) if dim != feature_dim else nn.Identity()
        self.position = nn.Parameter(torch.zeros(1, num_clusters, dim)) if cluster_position == "learned" else None
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, mlp_dim, dropout, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_genes))

    def forward(self, features: Tensor) -> Tensor:
        x = self.project(features)
        if self.position is not None:
            x = x + self.position
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


class TRNAsformerRegressor(ExpressionRegressor):
    """tRNAsformer-style baseline. Args: dim, depth, num_heads, mlp_dim, dropout, cluster_position;
    data_sizes: optional ``{num_genes, feature_dim, num_clusters}`` to build the network at construction
    (`SlideExpressionModule.build_from_sizes`)."""

    def __init__(self, dim: int = 256, depth: int = 2, num_heads: int = 4, mlp_dim: int = 512, dropout: float = 0.1,
                 cluster_position: Literal["none", "learned"] = "none", eval_samples: int = 1,
                 test_samples: int = 19, coverage_level: float = 0.9, top_ks: Sequence[int] = (20, 100),
                 fdr_alpha: float = 0.05, sample_seed: int = 42, optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None, init_from: str | None = None,
                 init_from_trusted: bool = False, data_sizes: dict[str, int] | None = None) -> None:
        super().__init__(eval_samples=eval_samples, test_samples=test_samples, coverage_level=coverage_level,
                         top_ks=top_ks, fdr_alpha=fdr_alpha, sample_seed=sample_seed, optimizer=optimizer,
                         lr_scheduler=lr_scheduler, init_from=init_from, init_from_trusted=init_from_trusted)
        for name, value in (("dim", dim), ("num_heads", num_heads), ("mlp_dim", mlp_dim)):
            check_range(name, value, 1)
        check_range("depth", depth, 0)
        check_range("dropout", dropout, 0.0, 1.0, high_inclusive=False)
        if dim % num_heads:
            raise UserInputError(f"dim={dim} is not divisible by num_heads={num_heads}.")
        if cluster_position not in ("none", "learned"):
            raise UserInputError(f"cluster_position={cluster_position!r}: choose 'none' or 'learned'.")
        self.save_hyperparameters()
        self.build_from_sizes(data_sizes)

    def build_net(self, structure: dict) -> nn.Module:
        hp = self.hparams
        return TRNAsformerNet(structure["feature_dim"], structure["num_clusters"], structure["num_genes"], hp.dim,
                              hp.depth, hp.num_heads, hp.mlp_dim, hp.dropout, hp.cluster_position)
