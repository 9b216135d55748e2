"""Evaluation of slide-to-expression models: the test metrics and the LightningModule base they share.

Shared by RNA-FM (`lightning_modules.rna_fm.rna_fm.RNAFM`, arXiv 2605.11622) and its two regression baselines
(`lightning_modules.rna_fm.expression_regressors`). The protocol is stated in full in ``rna_fm``'s module docstring
("Evaluation protocol"); in short, all metrics are computed on the test split from standardised tensors, and
model selection and the top-k gene lists only ever see the validation split:

* ``pearson`` / ``pearson_1sample``: mean over genes of the per-gene Pearson r across slides;
* ``top{k}``: mean test r of the k genes with the highest validation r;
* ``rmse`` (log2(x+1) units), ``n_significant`` (r > 0 and Benjamini-Hochberg q < ``fdr_alpha``);
* ``coverage`` (exact-level rank interval of K samples), ``energy`` (1-D energy distance per gene), ``crps``
  (fair sample CRPS), and their ``*_bimodal`` / ``*_unimodal`` parts when the data mark bimodal genes.

`SlideExpressionModule` builds its network in ``setup`` from the attached datamodule (the
`lightning_modules.shared.data_contract.SlideExpressionData` contract: gene count, pathways, feature shape, gene
statistics, bimodal genes), stores that structure in the checkpoint, and runs the protocol above.

Evaluation does not depend on the number of processes: every slide's noise (its flow-matching loss draws and its
samples) comes from generators seeded by (``sample_seed``, the slide's global ``index``)
(`lightning_modules.shared.example_rng.ExampleGenerators`), and the metrics are computed once per epoch from all
ranks' slides, each counted once (`lightning_modules.shared.example_rng.gather_examples`), so 2 processes report
one process's numbers.
"""
from __future__ import annotations

from typing import Sequence

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import SlideExpressionData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExampleGenerators, distributed, gather_examples

STRUCTURE_KEY = "slide_expression_structure"
LOSS_STREAM, SAMPLE_STREAM = 0, 1  # random streams of a slide: its evaluation-loss draws and its samples
VAL_R_KEY = "validation_gene_pearson"


# ============================================================================================ metrics
def per_gene_pearson(pred: Tensor, target: Tensor) -> Tensor:
    """Pearson r across slides for every gene ([N, G] -> [G]); 0 where either side is constant.

    Equal to torchmetrics' ``PearsonCorrCoef(num_outputs=G)`` except for a constant gene, where torchmetrics
    returns NaN: one collapsed gene would turn the gene mean, the top-k ranking and the BH test into NaN.
    """
    p = pred.double() - pred.double().mean(0)
    y = target.double() - target.double().mean(0)
    denom = p.norm(dim=0) * y.norm(dim=0)
    return torch.where(denom > 0, (p * y).sum(0) / denom.clamp(min=1e-300), torch.zeros_like(denom))


def pearson_pvalues(r: Tensor, n: int) -> Tensor:
    """Two-sided p of H0: rho = 0 (Student t with n - 2 dof): p = I_{1 - r^2}((n - 2)/2, 1/2)."""
    from scipy.special import betainc

    if n < 3:
        raise UserInputError(f"Pearson p-values need at least 3 slides (got {n}).")
    x = (1.0 - r.double().clamp(-1, 1) ** 2).cpu().numpy()
    return torch.as_tensor(betainc((n - 2) / 2.0, 0.5, x), dtype=torch.float64)


def benjamini_hochberg(p: Tensor) -> Tensor:
    """BH q-values: q_(i) = min_{j >= i} p_(j) m / j, clipped at 1 (statsmodels' fdr_bh)."""
    m = p.numel()
    order = torch.argsort(p)
    scaled = p[order] * m / torch.arange(1, m + 1, dtype=p.dtype, device=p.device)
    q_sorted = torch.flip(torch.cummin(torch.flip(scaled, [0]), 0).values, [0]).clamp(max=1.0)
    q = torch.empty_like(q_sorted)
    q[order] = q_sorted
    return q


def interval_coverage(samples: Tensor, target: Tensor, level: float = 0.9) -> Tensor:
    """Per-gene fraction of slides whose target lies in the rank interval [x_(j), x_(K+1-j)] of K samples.

    samples [N, K, G], target [N, G]. j = (K + 1)(1 - level) / 2 must be a whole number >= 1, which makes the
    interval's coverage exactly ``level`` for a perfect sampler (exchangeability), e.g. K = 19 for 0.9.
    """
    k = samples.shape[1]
    j = (k + 1) * (1 - level) / 2
    if j < 1 - 1e-9 or abs(j - round(j)) > 1e-6:
        raise UserInputError(f"{k} samples cannot form a rank interval of exact level {level}: need (K + 1)(1 - "
                             f"level)/2 to be a whole number >= 1 (e.g. K = 19 for 0.9, K = 39 for 0.95).")
    j = int(round(j))
    ordered = samples.sort(dim=1).values
    lo, hi = ordered[:, j - 1], ordered[:, k - j]
    return ((target >= lo) & (target <= hi)).double().mean(0)


def energy_distance_1d(u: Tensor, v: Tensor) -> Tensor:
    """Per-column 1-D energy distance sqrt(2 int (F_u - F_v)^2 dx) (scipy.stats.energy_distance), [n, G] -> [G]."""
    n_u, n_v = u.shape[0], v.shape[0]
    values = torch.cat([u, v], 0).double().T  # [G, n]
    ordered, idx = values.sort(dim=1)
    from_u = (idx < n_u).double()
    cdf_u = from_u.cumsum(1)[:, :-1] / n_u
    cdf_v = (1 - from_u).cumsum(1)[:, :-1] / n_v
    return (2 * ((cdf_u - cdf_v) ** 2 * ordered.diff(dim=1)).sum(1)).sqrt()


def sample_crps(samples: Tensor, target: Tensor) -> Tensor:
    """Per-gene mean over slides of the fair CRPS E|X - y| - E|X - X'| / 2 from K samples ([N, K, G] -> [G]).

    E|X - X'| uses the K(K - 1) distinct pairs (sorted form: sum_{k,l} |x_k - x_l| = 2 sum_i (2i - K - 1) x_(i)).
    torchmetrics' ``ContinuousRankedProbabilityScore`` divides by K^2 instead (the CRPS of the K-point empirical
    law, which overstates the CRPS by an amount that depends on K) and returns one scalar, not one per gene.
    """
    k = samples.shape[1]
    s = samples.double()
    first = (s - target.double().unsqueeze(1)).abs().mean(1)
    if k < 2:
        return first.mean(0)
    ordered = s.sort(dim=1).values
    weights = (2 * torch.arange(1, k + 1, dtype=s.dtype, device=s.device) - k - 1).view(1, k, 1)
    pair_mean = 2 * (weights * ordered).sum(1) / (k * (k - 1))
    return (first - 0.5 * pair_mean).mean(0)


def top_k_genes(gene_r: Tensor, ks: Sequence[int]) -> dict[int, Tensor]:
    """Indices of the k genes with the highest r (NaN-free input), per k (capped at G)."""
    order = torch.argsort(gene_r, descending=True)
    return {k: order[:min(k, gene_r.numel())] for k in ks}


def expression_metrics(point: Tensor, samples: Tensor, target: Tensor, gene_std: Tensor,
                       chosen: dict[int, Tensor] | None = None, bimodal: Tensor | None = None,
                       level: float = 0.9, fdr_alpha: float = 0.05) -> tuple[dict[str, float], Tensor]:
    """All test metrics from standardised tensors: point [N, G], samples [N, K, G], target [N, G].

    ``gene_std`` [G] converts RMSE to log units; ``chosen`` maps k to validation-chosen gene indices.
    Returns (metrics, per-gene r of the point prediction).
    """
    gene_r = per_gene_pearson(point, target)
    metrics = {"pearson": gene_r.mean().item(),
               "pearson_1sample": per_gene_pearson(samples[:, 0], target).mean().item(),
               "rmse": (((point - target) ** 2).mean(0).sqrt() * gene_std.to(point)).mean().item()}
    q = benjamini_hochberg(pearson_pvalues(gene_r, target.shape[0]))
    metrics["n_significant"] = float(((q < fdr_alpha) & (gene_r.cpu() > 0)).sum())
    for k, genes in (chosen or {}).items():
        metrics[f"top{k}"] = gene_r[genes.to(gene_r.device)].mean().item()
    if samples.shape[1] > 1:
        per_gene = {"coverage": interval_coverage(samples, target, level),
                    "energy": energy_distance_1d(samples.reshape(-1, samples.shape[-1]), target),
                    "crps": sample_crps(samples, target)}
        for name, values in per_gene.items():
            metrics[name] = values.mean().item()
            if bimodal is not None and bool(bimodal.any()) and not bool(bimodal.all()):
                mask = bimodal.to(values.device)
                metrics[f"{name}_bimodal"] = values[mask].mean().item()
                metrics[f"{name}_unimodal"] = values[~mask].mean().item()
    return metrics, gene_r



# ============================================================================================ shared module
class SlideExpressionModule(PaperModule):
    """Data plumbing shared by RNA-FM and the regressors: sizes from the datamodule, statistics, evaluation.

    The network is built in ``setup`` from the attached `SlideExpressionDataModule` (gene count, pathways,
    feature shape); the structure is stored in the checkpoint so ``load_from_checkpoint`` rebuilds it.
    Subclasses implement ``build(structure)``, ``loss(batch, generator, reduction)`` and
    ``distribution(features, k, generator)``; in evaluation ``generator`` is an `ExampleGenerators` of the batch.
    """

    needs_pathways = False

    def __init__(self, eval_samples: int = 1, test_samples: int = 19, coverage_level: float = 0.9,
                 top_ks: Sequence[int] = (20, 100), fdr_alpha: float = 0.05, sample_seed: int = 42,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        check_range("eval_samples", eval_samples, 1)
        check_range("test_samples", test_samples, 1)
        check_range("coverage_level", coverage_level, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        check_range("fdr_alpha", fdr_alpha, 0.0, 1.0, low_inclusive=False)
        for k in top_ks:
            check_range("top_ks entry", k, 1)
        self.structure: dict | None = None
        self._built_from_args = False  # built in __init__ from the data sizes given as arguments (`build_from_sizes`)
        self._outputs: dict[str, list] = {}
        self.val_gene_r: Tensor | None = None
        self.test_metrics: dict[str, float] = {}

    # ----------------------------------------------------------------------------------------- structure
    def _build(self, structure: dict) -> None:
        if self.needs_pathways and not structure.get("groups"):
            raise UserInputError(f"{type(self).__name__} with pathway tokens needs pathways: give the datamodule a "
                                 "pathway_json (or set model.init_args.pathway_tokens=false).")
        self.structure = structure
        g = structure["num_genes"]
        self.register_buffer("gene_mean", torch.zeros(g))
        self.register_buffer("gene_std", torch.ones(g))
        self.build(structure)

    def build(self, structure: dict) -> None:
        raise NotImplementedError

    def build_from_sizes(self, data_sizes: dict[str, int] | None) -> None:
        """Build the network now when ``data_sizes`` = ``{num_genes, feature_dim, num_clusters}`` is given (a paper
        config states the published 20,820 genes and UNI's [100, 1024] cluster features), so that it exists before
        any data is attached; fit then checks the data against them and takes the gene statistics from it. None:
        built in setup from the data. (One dict argument: the datamodule's hparams already use these names.)"""
        if data_sizes is None:
            return
        keys = ("num_genes", "feature_dim", "num_clusters")
        if not isinstance(data_sizes, dict) or sorted(data_sizes) != sorted(keys):
            raise UserInputError(f"{type(self).__name__}: data_sizes={data_sizes!r} must give exactly num_genes, "
                                 "feature_dim and num_clusters (or be null: sizes then come from the data).")
        for name in keys:
            check_range(f"data_sizes.{name}", data_sizes[name], 1)
        given = {name: int(data_sizes[name]) for name in keys}
        self._build({**given, "groups": None})
        self._built_from_args = True

    def structure_from(self, datamodule) -> dict:
        pathways, background = datamodule.pathways, datamodule.background
        groups = None
        if pathways:
            groups = [list(map(int, p)) for p in pathways] + ([list(map(int, background))] if background else [])
        return {"num_genes": int(datamodule.num_genes), "feature_dim": int(datamodule.feature_dim),
                "num_clusters": int(datamodule.num_clusters), "groups": groups}

    def setup(self, stage: str) -> None:
        datamodule = self.attached_data(SlideExpressionData)
        if datamodule is not None:
            structure = self.structure_from(datamodule)
            built_here = self.structure is None
            if built_here:
                self._build(structure)
            elif any(self.structure[k] != structure[k] for k in ("num_genes", "feature_dim", "num_clusters")):
                fix = ("set model.init_args.data_sizes to the data's sizes (or remove it)"
                       if self._built_from_args else "use the data the checkpoint was trained on")
                raise UserInputError(
                    f"the model was built for {self.structure['num_genes']} genes and cluster features "
                    f"[{self.structure['num_clusters']}, {self.structure['feature_dim']}] but the data has "
                    f"{structure['num_genes']} genes and [{structure['num_clusters']}, {structure['feature_dim']}]: "
                    f"{fix}.")
            if stage == "fit" and (built_here or self._built_from_args):  # a resumed fit restores them afterwards
                self.gene_mean.copy_(torch.as_tensor(datamodule.gene_mean))
                self.gene_std.copy_(torch.as_tensor(datamodule.gene_std))
        elif self.structure is None:
            raise UserInputError(f"{type(self).__name__} needs a SlideExpressionDataModule (genes, pathways and "
                                 "feature shape come from the data), or a checkpoint to load.")
        super().setup(stage)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[STRUCTURE_KEY] = self.structure
        if self.val_gene_r is not None:  # the top-k gene lists of a later test-only run come from validation
            checkpoint[VAL_R_KEY] = self.val_gene_r.detach().cpu().clone()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Rebuild the network (``load_from_checkpoint`` calls this before ``load_state_dict``)."""
        super().on_load_checkpoint(checkpoint)
        if self.structure is None and checkpoint.get(STRUCTURE_KEY):
            self._build(checkpoint[STRUCTURE_KEY])
        if checkpoint.get(VAL_R_KEY) is not None:
            self.val_gene_r = checkpoint[VAL_R_KEY].float()

    # ----------------------------------------------------------------------------------------- interface
    def loss(self, batch: dict[str, Tensor], generator: torch.Generator | ExampleGenerators | None = None,
             reduction: str = "mean") -> Tensor:
        """Training loss of the batch: a scalar, or one value per slide [B] with ``reduction="none"``."""
        raise NotImplementedError

    def distribution(self, features: Tensor, k: int,
                     generator: torch.Generator | ExampleGenerators) -> tuple[Tensor, Tensor]:
        """(point prediction [B, G], k samples [B, k, G]), standardised."""
        raise NotImplementedError

    def _generators(self, batch: dict[str, Tensor], stream: int) -> ExampleGenerators:
        """One generator per slide of ``batch``, seeded by (``sample_seed``, stream, the slide's global index)."""
        if "index" not in batch:
            raise UserInputError("evaluation batches need an 'index' entry (each slide's position in its dataset, "
                                 "which seeds its samples): use SlideExpressionDataModule or add it to your batches.")
        return ExampleGenerators(int(self.hparams.sample_seed), batch["index"], stream)

    def _check_batch(self, batch: dict[str, Tensor]) -> Tensor:
        features = batch["features"]
        expected = (self.structure["num_clusters"], self.structure["feature_dim"])
        if features.dim() != 3 or tuple(features.shape[1:]) != expected:
            raise UserInputError(f"batch features have shape {tuple(features.shape)}; the model expects "
                                 f"[batch, {expected[0]}, {expected[1]}].")
        return features

    def to_log_space(self, standardised: Tensor) -> Tensor:
        return standardised * self.gene_std + self.gene_mean

    # ----------------------------------------------------------------------------------------- steps
    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["expression"].shape[0])
        return loss

    def _evaluate(self, stage: str, batch, batch_idx: int, k: int) -> None:
        features = self._check_batch(batch)
        loss = self.loss(batch, self._generators(batch, LOSS_STREAM), reduction="none")
        point, samples = self.distribution(features, k, self._generators(batch, SAMPLE_STREAM))
        self._outputs.setdefault(stage, []).append((batch["index"].to(point.device), point, samples,
                                                    batch["expression"], loss.detach()))

    def validation_step(self, batch, batch_idx):
        self._evaluate("val", batch, batch_idx, self.hparams.eval_samples)

    def test_step(self, batch, batch_idx):
        self._evaluate("test", batch, batch_idx, self.hparams.test_samples)

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> Tensor:
        """Point prediction in log2(x+1) units, [B, G] (RNA-FM: mean of ``eval_samples`` samples)."""
        features = self._check_batch(batch)
        point, _ = self.distribution(features, self.hparams.eval_samples, self._generators(batch, SAMPLE_STREAM))
        return self.to_log_space(point)

    def prediction_fields(self, outputs: Tensor, batch: dict) -> dict:
        """The predicted expression of each slide, named by its slide id (written as a genes x slides CSV)."""
        slide_ids = self.data(SlideExpressionData).slide_ids
        index = batch["index"].tolist()
        return {"id": [slide_ids[i] for i in index] if slide_ids is not None else [str(i) for i in index],
                "expression": outputs}

    def _gathered(self, stage: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(point, samples, target, loss) of every slide of the epoch on all ranks, once each, in index order."""
        outputs = self._outputs.pop(stage, [])
        if outputs:
            index, point, samples, target, loss = (torch.cat([o[i] for o in outputs]) for i in range(5))
        else:  # a rank without slides (fewer slides than ranks) still takes part in the gather
            g = self.structure["num_genes"]
            k = self.hparams.eval_samples if stage == "val" else self.hparams.test_samples
            index, loss = torch.zeros(0, dtype=torch.long, device=self.device), torch.zeros(0, device=self.device)
            point, target = torch.zeros(0, g, device=self.device), torch.zeros(0, g, device=self.device)
            samples = torch.zeros(0, k, g, device=self.device)
        _, point, samples, target, loss = gather_examples(index, point, samples, target, loss)
        return point, samples, target, loss

    def on_validation_epoch_end(self) -> None:
        if "val" not in self._outputs and not distributed():
            return
        point, samples, target, loss = self._gathered("val")
        # every rank holds all slides, so each value is the same on every rank (sync_dist averages equal values)
        self.log("val/loss", loss.mean(), sync_dist=True)
        self.val_gene_r = per_gene_pearson(point, target).float()
        self.log("val/pearson", self.val_gene_r.mean(), sync_dist=True)
        self.log("val/rmse", (((point - target) ** 2).mean(0).sqrt() * self.gene_std).mean(), sync_dist=True)
        self.after_validation(point, target)

    def after_validation(self, point: Tensor, target: Tensor) -> None:
        """Hook (regressors estimate their residual std here)."""

    def bimodal_genes(self) -> Tensor | None:
        mask = self.data(SlideExpressionData).bimodal_genes
        return None if mask is None else torch.as_tensor(mask, dtype=torch.bool)

    def on_test_epoch_end(self) -> None:
        if "test" not in self._outputs and not distributed():
            return
        point, samples, target, loss = self._gathered("test")
        chosen = top_k_genes(self.val_gene_r, self.hparams.top_ks) if self.val_gene_r is not None else None
        metrics, _ = expression_metrics(point, samples, target, self.gene_std, chosen, self.bimodal_genes(),
                                        self.hparams.coverage_level, self.hparams.fdr_alpha)
        self.test_metrics = metrics
        self.log("test/loss", loss.mean(), sync_dist=True)
        for name, value in metrics.items():
            self.log(f"test/{name}", value, sync_dist=True)
