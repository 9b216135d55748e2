"""Concept embedding models: CEM, evi-CEM and EC-CEM ("Evidential Copula Concept Embedding Models", ICML 2026).

Paper: "Evidential Copula Concept Embedding Models" (ICML 2026; no arXiv id, no code). Only its abstract is public:
CEMs treat concepts as independent; EC-CEM "decouples the marginal concept distributions from their dependency
structure" (Sklar / copulas), "integrates Copula theory with evidential deep learning" and trains "two objectives
that aim at classification and concept modeling simultaneously". Everything about EC-CEM below beyond that is a
RECONSTRUCTION, and every reconstructed choice is a config option:

* ``CEM`` follows the official code of Espinosa Zarlenga et al., "Concept Embedding Models" (NeurIPS 2022):
  per-concept context ``ctx_i = LeakyReLU(W_i h)`` split into a positive and a negative embedding
  (``c_i^+ = ctx_i[:m]``, ``c_i^- = ctx_i[m:]``), a shared scoring head ``p_i = sigmoid(w^T ctx_i + b)``, the
  probability-mixed bottleneck ``c_hat_i = p_i c_i^+ + (1 - p_i) c_i^-``, a linear or MLP concept-to-task head and
  the loss ``task_loss_weight * CE(y) + concept_loss_weight * BCE(p, c)`` (BCE weighted per concept by the
  training split's ``n_neg / n_pos`` as ``BCELoss(weight=...)`` in the code, or on the positive term only).
  RandInt training interventions replace ``p_i`` by the true ``c_i`` with probability 0.25; the code draws the
  mask once per batch and tiles it over the samples (``intervention_mask: batch``; ``sample`` is the option).
* ``EviCEM`` follows Gao et al., "Evidential Concept Embedding Models" (MICCAI 2024, arXiv 2406.19130, code
  obiyoag/evi-CEM): Beta evidence per concept ``alpha_i = g(w_a^T ctx_i) + 1``, ``beta_i = g(w_b^T ctx_i) + 1``
  (shared heads, N(0, 1) init), ``p_i = alpha_i / (alpha_i + beta_i)``, uncertainty ``u_i = 2 / (alpha_i + beta_i)``,
  the expected BCE under the Beta ``psi(a + b) - c psi(a) - (1 - c) psi(b)`` and the misleading-evidence KL
  ``KL(Beta(1, x) || Beta(1, 1)) = log x + (1 - x) / x`` (x = beta if c = 1 else alpha), annealed by
  ``min(1, epoch / annealing_epochs)``. The evidence activation ``g`` is ``evidence_activation``: the evi-CEM
  code uses ``relu`` (``torch.relu(self.alpha_gen(context)) + 1`` in ``models/evi_clm.py``); our default is
  ``softplus``, one of the evidence functions of evidential deep learning (Sensoy et al., NeurIPS 2018, use ReLU,
  softplus or exp). Why not ReLU: the heads are shared by all concepts, and when ``w_a^T ctx_i <= 0`` for every
  input of one concept (it happens within the first epochs on some seeds of XOR and Dot), ``alpha_i = 1`` for good
  and nothing reaches that pre-activation again, so ``p_i <= 0.5`` and the concept is always predicted 0 (a dead
  ReLU; the task survives through the embeddings). Softplus and exp keep a gradient for negative pre-activations;
  ``exp`` is clamped at ``EXP_EVIDENCE_MAX`` so the evidence stays finite.
* ``ECCEM`` (reconstruction) = evi-CEM marginals + a Gaussian copula over the binary concepts with one global
  correlation matrix ``R = D^-1/2 (L L^T + eps I) D^-1/2`` (free lower-triangular ``L``: positive definite, unit
  diagonal). Latent ``z ~ N(0, R)`` and ``c_i = 1 <=> z_i <= Phi^-1(p_i)``, so ``P(c_i = 1, c_j = 1) =
  Phi_2(Phi^-1(p_i), Phi^-1(p_j); rho_ij)``. The concept-modelling objective adds the pairwise composite negative
  log-likelihood ``-mean_{i<j} log P(c_i, c_j)`` (weight ``copula_loss_weight``; scales to CUB's 112 concepts,
  where the exact 2^k likelihood is intractable); ``Phi_2`` is Plackett's integral by Gauss-Legendre quadrature,
  differentiable in p and rho. At intervention time the non-intervened concepts are updated by the conditional
  copula given the intervened values (``copula_update: moment_matched``: each intervened ``z_j`` is a truncated
  normal; the other latents are conditioned on the intervened block by Gaussian conditioning with the truncated
  means, adding the truncated variances pushed through the regression; ``none`` switches it off). Reconstructed
  options: ``copula_loss_weight``, ``copula_marginal_grad`` (whether the copula term also trains the marginals),
  ``copula_in_training_interventions`` (RandInt uses the copula update too), ``copula_update``, ``quadrature_nodes``.

Evaluation (val/test, torchmetrics, DDP-exact): task accuracy, mean concept accuracy, concept AUROC and concept ECE
(15 bins) over all (example, concept) entries. Test-time interventions are the `callbacks.concept_interventions`
callback, which uses ``concept_outputs`` / ``intervene`` / ``task_logits`` and ``concept_uncertainty`` below.
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
import timm
import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule, load_matching_weights, read_checkpoint
from lightning_modules.shared.data_contract import ConceptData
from lightning_modules.shared.errors import UserInputError, check_range

PROB_EPS = 1e-4   # probabilities are clamped to [eps, 1 - eps] before Phi^-1
EVIDENCE_ACTIVATIONS = ("softplus", "exp", "relu")
EXP_EVIDENCE_MAX = 10.0   # exp evidence: pre-activations clamped here (evidence <= e^10 ~ 2.2e4), so it never overflows


# ============================================================================================ normal helpers
def normal_cdf(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def normal_icdf(p: Tensor) -> Tensor:
    return math.sqrt(2.0) * torch.erfinv(2.0 * p - 1.0)


def normal_pdf(x: Tensor) -> Tensor:
    return torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def bivariate_normal_cdf(h: Tensor, k: Tensor, rho: Tensor, nodes: int = 32) -> Tensor:
    """Phi_2(h, k; rho) by Plackett's identity, Phi(h) Phi(k) + 1/(2 pi) int_0^rho exp(-(h^2 - 2rhk + k^2) /
    (2(1 - r^2))) / sqrt(1 - r^2) dr, with ``nodes``-point Gauss-Legendre quadrature on [0, rho] (broadcasts)."""
    t, w = np.polynomial.legendre.leggauss(nodes)
    t, w = (torch.as_tensor(a, dtype=h.dtype, device=h.device) for a in (t, w))
    h, k, rho = torch.broadcast_tensors(h, k, rho)
    r = rho.unsqueeze(-1) * (t + 1.0) / 2.0
    one_minus = 1.0 - r * r
    hh, kk = h.unsqueeze(-1), k.unsqueeze(-1)
    integrand = torch.exp(-(hh * hh - 2.0 * r * hh * kk + kk * kk) / (2.0 * one_minus)) / one_minus.sqrt()
    integral = (integrand * w).sum(-1) * rho / 2.0
    return normal_cdf(h) * normal_cdf(k) + integral / (2.0 * math.pi)


def pairwise_log_likelihood(probs: Tensor, concepts: Tensor, correlation: Tensor, nodes: int = 32) -> Tensor:
    """Composite log-likelihood sum_{i<j} log P(c_i, c_j) of binary concepts [B, k] under Bernoulli marginals
    ``probs`` [B, k] coupled by a Gaussian copula with ``correlation`` [k, k]; returns [B]."""
    k = probs.shape[-1]
    i, j = torch.triu_indices(k, k, offset=1, device=probs.device)
    p = probs.clamp(PROB_EPS, 1 - PROB_EPS)
    h = normal_icdf(p)
    p11 = bivariate_normal_cdf(h[:, i], h[:, j], correlation[i, j], nodes)
    pi, pj, ci, cj = p[:, i], p[:, j], concepts[:, i], concepts[:, j]
    cell = (ci * cj * p11 + ci * (1 - cj) * (pi - p11) + (1 - ci) * cj * (pj - p11)
            + (1 - ci) * (1 - cj) * (1 - pi - pj + p11))
    return cell.clamp_min(1e-8).log().sum(-1)


def truncated_normal_moments(h: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance of z ~ N(0, 1) given z <= h (``upper`` = 1) or z > h (``upper`` = 0)."""
    phi, cdf = normal_pdf(h), normal_cdf(h).clamp(1e-6, 1 - 1e-6)
    lam_below, lam_above = phi / cdf, phi / (1 - cdf)           # inverse Mills ratios
    mean = upper * -lam_below + (1 - upper) * lam_above
    var = upper * (1 - h * lam_below - lam_below ** 2) + (1 - upper) * (1 + h * lam_above - lam_above ** 2)
    return mean, var.clamp_min(1e-6)


def conditional_concept_probs(probs: Tensor, mask: Tensor, values: Tensor, correlation: Tensor) -> Tensor:
    """P(c_i = 1 | intervened concepts) for every non-intervened i under the Gaussian copula (moment matched).

    Latents of the intervened set J are truncated normals (mean m_J, variances v_J). With A = R_{iJ} R_JJ^-1,
    z_i | J ~ N(A m_J, 1 - A R_Ji + A diag(v_J) A^T) and p_i' = Phi((h_i - mean) / sd). Intervened entries get their
    value; ``mask`` [B, k] (1 = intervened), ``values`` [B, k]. Batched over examples (each has its own J)."""
    mask = mask.to(probs.dtype)
    h = normal_icdf(probs.clamp(PROB_EPS, 1 - PROB_EPS))
    mean_j, var_j = truncated_normal_moments(h, values)
    eye = torch.eye(probs.shape[-1], dtype=probs.dtype, device=probs.device)
    block = correlation * mask[:, :, None] * mask[:, None, :] + eye * (1 - mask)[:, None, :]   # R_JJ (+ I elsewhere)
    cross = correlation * mask[:, None, :]                                                    # R_{iJ}
    regress = torch.linalg.solve(block, cross.transpose(1, 2)).transpose(1, 2)                # A = R_iJ R_JJ^-1
    mean = (regress * (mean_j * mask)[:, None, :]).sum(-1)
    var = 1 - (regress * cross).sum(-1) + (regress ** 2 * (var_j * mask)[:, None, :]).sum(-1)
    updated = normal_cdf((h - mean) / var.clamp_min(1e-6).sqrt())
    return torch.where(mask.bool(), values.to(probs.dtype), updated)


class GaussianCopula(nn.Module):
    """Global Gaussian copula over k concepts: R = D^-1/2 (L L^T + eps I) D^-1/2 with free lower-triangular L
    (initialised to the identity, so R starts at I)."""

    def __init__(self, num_concepts: int, jitter: float = 1e-4) -> None:
        super().__init__()
        self.jitter = jitter
        self.factor = nn.Parameter(torch.eye(num_concepts))
        self.register_buffer("lower", torch.tril(torch.ones(num_concepts, num_concepts)), persistent=False)

    def correlation(self) -> Tensor:
        factor = self.factor * self.lower
        cov = factor @ factor.T + self.jitter * torch.eye(len(factor), device=factor.device, dtype=factor.dtype)
        scale = cov.diagonal().rsqrt()
        return cov * scale[:, None] * scale[None, :]


# ============================================================================================ networks
def build_extractor(backbone: str, input_dim: int | None, hidden_dim: int, depth: int, in_channels: int
                    ) -> tuple[nn.Module, int]:
    """The input-to-latent network and its output size: ``mlp`` (CEM's synthetic extractor, Linear-LeakyReLU
    blocks ending in a Linear) or a timm model name (no classifier, never pretrained from the hub)."""
    if backbone == "mlp":
        if input_dim is None:
            raise UserInputError("backbone 'mlp' needs model.init_args.input_dim (the feature size of the data).")
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(depth - 1):
            layers += [nn.Linear(width, hidden_dim), nn.LeakyReLU()]
            width = hidden_dim
        layers.append(nn.Linear(width, hidden_dim))
        return nn.Sequential(nn.Flatten(), *layers), hidden_dim
    if not timm.is_model(backbone):
        raise UserInputError(f"backbone '{backbone}' is neither 'mlp' nor a timm model name "
                             f"(similar: {timm.list_models(f'*{backbone[:4]}*')[:6]}).")
    net = timm.create_model(backbone, pretrained=False, num_classes=0, in_chans=in_channels)
    return net, net.num_features


def build_c2y(in_features: int, hidden: list[int] | None, num_tasks: int) -> nn.Module:
    """Concept-to-task head: Linear when ``hidden`` is empty, else the code's MLP with LeakyReLU between layers."""
    units = [in_features, *(hidden or []), num_tasks]
    layers: list[nn.Module] = []
    for a, b in zip(units[:-1], units[1:]):
        layers += [nn.Linear(a, b), nn.LeakyReLU()]
    return nn.Sequential(*layers[:-1])


# ============================================================================================ CEM
class CEM(PaperModule):
    """Concept Embedding Model (see the module docstring). Batches are ``(x, y, c)``: inputs, task labels [B] and
    binary concepts [B, k].

    Args:
        num_concepts / num_tasks / input_dim: sizes; must match the data (checked in ``setup``).
        backbone: ``mlp`` or a timm name (``resnet34``); ``hidden_dim``/``depth`` size the mlp.
        backbone_weights: local file of backbone weights (a state_dict or Lightning checkpoint), loaded when fitting
            starts, matched by name and shape; timm models are never downloaded.
        in_channels: image channels for timm backbones.
        embedding_size: m, the size of each positive/negative concept embedding.
        c2y_hidden: hidden sizes of the concept-to-task MLP; empty or null = linear head.
        task_loss_weight / concept_loss_weight: loss weights.
        concept_weighting: ``none``; ``balanced``: per-concept weight n_neg/n_pos of the training split on the
            whole BCE (the code's ``BCELoss(weight=...)``); ``positive``: the same ratio on the positive term only.
        training_intervention_prob: RandInt probability (0.25 in the code; 0 switches it off).
        intervention_mask: ``batch`` (the code: one mask tiled over the batch) or ``sample``.
    """

    def __init__(self, num_concepts: int = 2, num_tasks: int = 2, input_dim: int | None = 2, backbone: str = "mlp",
                 hidden_dim: int = 128, depth: int = 3, backbone_weights: str | None = None, in_channels: int = 3,
                 embedding_size: int = 16, c2y_hidden: list[int] | None = None, task_loss_weight: float = 1.0,
                 concept_loss_weight: float = 1.0,
                 concept_weighting: Literal["none", "balanced", "positive"] = "none",
                 training_intervention_prob: float = 0.25,
                 intervention_mask: Literal["batch", "sample"] = "batch",
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        check_range("num_concepts", num_concepts, 1)
        check_range("num_tasks", num_tasks, 2)
        check_range("embedding_size", embedding_size, 1)
        check_range("hidden_dim", hidden_dim, 1)
        check_range("depth", depth, 1)
        check_range("training_intervention_prob", training_intervention_prob, 0.0, 1.0)
        check_range("task_loss_weight", task_loss_weight, 0.0)
        check_range("concept_loss_weight", concept_loss_weight, 0.0)
        if concept_weighting not in ("none", "balanced", "positive"):
            raise UserInputError(f"concept_weighting={concept_weighting!r}: choose none, balanced or positive.")
        if intervention_mask not in ("batch", "sample"):
            raise UserInputError(f"intervention_mask={intervention_mask!r}: choose batch or sample.")
        self.save_hyperparameters()
        k, m = num_concepts, embedding_size
        self.extractor, features = build_extractor(backbone, input_dim, hidden_dim, depth, in_channels)
        self.context = nn.Sequential(nn.Linear(features, k * 2 * m), nn.LeakyReLU())
        self.build_scoring_head(2 * m)
        self.c2y = build_c2y(k * m, c2y_hidden, num_tasks)
        self.register_buffer("concept_weight", torch.ones(k))
        self.register_buffer("concept_pos_weight", torch.ones(k))
        self._backbone_loaded = False
        self.val_metrics = self._metrics()
        self.test_metrics = self._metrics()

    def _metrics(self) -> nn.ModuleDict:
        return nn.ModuleDict({
            "task_acc": torchmetrics.classification.MulticlassAccuracy(self.hparams.num_tasks, average="micro"),
            "concept_acc": torchmetrics.classification.BinaryAccuracy(),
            "concept_auroc": torchmetrics.classification.BinaryAUROC(),
            "concept_ece": torchmetrics.classification.BinaryCalibrationError(n_bins=15),
            "loss": torchmetrics.MeanMetric()})

    # ------------------------------------------------------------------------------------------ set-up
    def setup(self, stage: str) -> None:
        hp = self.hparams
        sizes = {"num_concepts": hp.num_concepts, "num_tasks": hp.num_tasks}
        if hp.backbone == "mlp":
            sizes["input_dim"] = hp.input_dim
        self.check_data_matches(ConceptData, sizes, "model.{name}={model} but the data has {name}={data}: set "
                                                    "model.init_args.{name}: {data}.")
        restoring = self.checkpoint_being_restored()  # an exact resume restores the backbone after setup
        if stage == "fit" and hp.backbone_weights and not self._backbone_loaded and not restoring:
            state = read_checkpoint(hp.backbone_weights, what="backbone_weights")["state_dict"]
            load_matching_weights(self.extractor, state, source=f"backbone_weights '{hp.backbone_weights}'")
            self._backbone_loaded = True
        ratio = self.data(ConceptData).concept_imbalance
        if stage == "fit" and hp.concept_weighting != "none" and ratio is not None:
            target = self.concept_weight if hp.concept_weighting == "balanced" else self.concept_pos_weight
            target.copy_(torch.as_tensor(ratio, dtype=target.dtype))
        super().setup(stage)  # init_from

    # ------------------------------------------------------------------------------------------ model
    def build_scoring_head(self, width: int) -> None:
        self.scorer = nn.Linear(width, 1)   # shared across concepts (shared_prob_gen=True)

    def concept_outputs(self, x: Tensor) -> dict[str, Tensor]:
        """Context [B, k, 2m] and concept probabilities [B, k] (subclasses add their evidence)."""
        ctx = self.context(self.extractor(x)).view(len(x), self.hparams.num_concepts, -1)
        return {"context": ctx, "probs": torch.sigmoid(self.scorer(ctx).squeeze(-1))}

    def concept_uncertainty(self, out: dict[str, Tensor]) -> Tensor:
        """Per-concept uncertainty [B, k]; CEM has no evidence, so 1 - |2p - 1| (1 at p = 0.5, 0 at p in {0, 1})."""
        return 1 - (2 * out["probs"] - 1).abs()

    def intervene(self, out: dict[str, Tensor], mask: Tensor, concepts: Tensor, training: bool = False) -> Tensor:
        """Concept probabilities after setting the ``mask``ed concepts to ``concepts`` (CEM: nothing else moves)."""
        return torch.where(mask.bool(), concepts.to(out["probs"].dtype), out["probs"])

    def task_logits(self, out: dict[str, Tensor], probs: Tensor) -> Tensor:
        """Mixed bottleneck c_hat_i = p_i c_i^+ + (1 - p_i) c_i^- -> concept-to-task head."""
        m = self.hparams.embedding_size
        ctx = out["context"]
        mixed = probs.unsqueeze(-1) * ctx[..., :m] + (1 - probs.unsqueeze(-1)) * ctx[..., m:]
        return self.c2y(mixed.flatten(1))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out = self.concept_outputs(x)
        return self.task_logits(out, out["probs"]), out["probs"]

    # ------------------------------------------------------------------------------------------ losses
    def concept_losses(self, out: dict[str, Tensor], concepts: Tensor) -> dict[str, Tensor]:
        """Named concept terms (each already weighted by ``concept_loss_weight`` where the paper does so)."""
        p = out["probs"].clamp(1e-7, 1 - 1e-7)
        bce = -(self.concept_pos_weight * concepts * p.log() + (1 - concepts) * (1 - p).log())
        return {"concept": self.hparams.concept_loss_weight * (self.concept_weight * bce).mean()}

    def random_intervention_mask(self, concepts: Tensor) -> Tensor:
        """RandInt mask: Bernoulli(prob) per concept, one row tiled over the batch (the code) or one per example."""
        rows = 1 if self.hparams.intervention_mask == "batch" else len(concepts)
        prob = torch.full((rows, concepts.shape[1]), self.hparams.training_intervention_prob, device=concepts.device)
        return torch.bernoulli(prob).expand_as(concepts)

    def training_step(self, batch, batch_idx):
        x, y, c = batch
        out = self.concept_outputs(x)
        probs = out["probs"]
        if self.hparams.training_intervention_prob > 0:
            probs = self.intervene(out, self.random_intervention_mask(c), c, training=True)
        task = self.hparams.task_loss_weight * F.cross_entropy(self.task_logits(out, probs), y)
        terms = {"task": task, **self.concept_losses(out, c.float())}
        loss = sum(terms.values())
        for name, value in terms.items():
            self.log(f"train/{name}_loss", value)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _evaluate(self, batch, stage: str, metrics: nn.ModuleDict) -> None:
        x, y, c = batch
        out = self.concept_outputs(x)
        logits = self.task_logits(out, out["probs"])
        terms = self.concept_losses(out, c.float())
        # a batch's mean weighted by its size: the mean over every example, also when DDP shards the batches unevenly
        metrics["loss"](self.hparams.task_loss_weight * F.cross_entropy(logits, y) + sum(terms.values()), len(y))
        metrics["task_acc"](logits, y)
        flat_p, flat_c = out["probs"].flatten(), c.flatten().long()
        for name in ("concept_acc", "concept_auroc", "concept_ece"):
            metrics[name](flat_p, flat_c)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, prog_bar=name == "task_acc")

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test", self.test_metrics)

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        out = self.concept_outputs(x)
        return {"task_probs": self.task_logits(out, out["probs"]).softmax(-1), "concept_probabilities": out["probs"],
                "concept_uncertainty": self.concept_uncertainty(out)}

    def prediction_fields(self, outputs, batch) -> dict:
        """Task class probabilities (with the predicted class), concept probabilities and their uncertainty."""
        return dict(outputs)


# ============================================================================================ evi-CEM
def evidence(pre_activation: Tensor, activation: str) -> Tensor:
    """Non-negative evidence from a head's pre-activation: ``relu`` (the evi-CEM code), ``softplus`` or ``exp``
    (clamped at ``EXP_EVIDENCE_MAX``), the evidence functions of Sensoy et al. (NeurIPS 2018)."""
    if activation == "relu":
        return F.relu(pre_activation)
    if activation == "softplus":
        return F.softplus(pre_activation)
    return torch.exp(pre_activation.clamp(max=EXP_EVIDENCE_MAX))


class EviCEM(CEM):
    """Evidential CEM (see the module docstring). Extra args: ``annealing_epochs`` of the KL weight
    min(1, epoch / annealing_epochs) (0: weight 1 from the start), ``kl_weight`` (1 in the code) and
    ``evidence_activation``: ``softplus`` (default, our choice), ``exp`` or ``relu`` (the evi-CEM code's, which can
    leave a concept with no evidence for any input: see the module docstring)."""

    def __init__(self, *args, annealing_epochs: int = 10, kl_weight: float = 1.0,
                 evidence_activation: Literal["softplus", "exp", "relu"] = "softplus", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_range("annealing_epochs", annealing_epochs, 0)
        check_range("kl_weight", kl_weight, 0.0)
        if evidence_activation not in EVIDENCE_ACTIVATIONS:
            raise UserInputError(f"evidence_activation={evidence_activation!r}: choose softplus, exp or relu "
                                 "(relu is the evi-CEM code's).")
        self.save_hyperparameters()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint written before ``evidence_activation`` existed was trained with ReLU evidence: reading it
        with another activation would silently change every concept probability, so that is refused."""
        saved = checkpoint.get("hyper_parameters") or {}
        if "evidence_activation" not in saved and self.hparams.evidence_activation != "relu":
            raise UserInputError("this checkpoint predates evidence_activation and was trained with ReLU evidence: "
                                 "add --model.init_args.evidence_activation=relu to read it as it was trained.")
        super().on_load_checkpoint(checkpoint)

    def build_scoring_head(self, width: int) -> None:
        self.alpha_head, self.beta_head = nn.Linear(width, 1), nn.Linear(width, 1)
        for head in (self.alpha_head, self.beta_head):
            nn.init.normal_(head.weight, 0.0, 1.0)

    def concept_outputs(self, x: Tensor) -> dict[str, Tensor]:
        ctx = self.context(self.extractor(x)).view(len(x), self.hparams.num_concepts, -1)
        activation = self.hparams.evidence_activation
        alpha = evidence(self.alpha_head(ctx).squeeze(-1), activation) + 1
        beta = evidence(self.beta_head(ctx).squeeze(-1), activation) + 1
        return {"context": ctx, "alpha": alpha, "beta": beta, "probs": alpha / (alpha + beta)}

    def concept_uncertainty(self, out: dict[str, Tensor]) -> Tensor:
        """u_i = 2 / (alpha_i + beta_i) (1 with no evidence)."""
        return 2 / (out["alpha"] + out["beta"])

    def kl_annealing(self) -> float:
        epochs = self.hparams.annealing_epochs
        return 1.0 if epochs == 0 else min(1.0, self.current_epoch / epochs)

    def concept_losses(self, out: dict[str, Tensor], concepts: Tensor) -> dict[str, Tensor]:
        """Expected BCE under Beta(alpha, beta) + annealed KL of the misleading evidence to Beta(1, 1)."""
        alpha, beta = out["alpha"], out["beta"]
        expected_bce = (torch.digamma(alpha + beta) - self.concept_pos_weight * concepts * torch.digamma(alpha)
                        - (1 - concepts) * torch.digamma(beta))
        misleading = concepts * beta + (1 - concepts) * alpha
        kl = misleading.log() + (1 - misleading) / misleading
        weight = self.hparams.concept_loss_weight
        return {"concept": weight * (self.concept_weight * expected_bce).mean(),
                "kl": weight * self.hparams.kl_weight * self.kl_annealing() * kl.mean()}


# ============================================================================================ EC-CEM
class ECCEM(EviCEM):
    """Evidential Copula CEM (RECONSTRUCTION; see the module docstring). Extra args:

        copula_loss_weight: weight of the pairwise composite negative log-likelihood (mean over pairs).
        copula_marginal_grad: let the copula term train the marginal heads too (false: only R learns from it).
        copula_update: ``moment_matched`` conditional update of non-intervened concepts, or ``none``.
        copula_in_training_interventions: RandInt interventions during training also use the copula update.
        quadrature_nodes: Gauss-Legendre nodes of the bivariate normal CDF.
    """

    def __init__(self, *args, copula_loss_weight: float = 1.0, copula_marginal_grad: bool = True,
                 copula_update: Literal["moment_matched", "none"] = "moment_matched",
                 copula_in_training_interventions: bool = False, quadrature_nodes: int = 32, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_range("copula_loss_weight", copula_loss_weight, 0.0)
        check_range("quadrature_nodes", quadrature_nodes, 2)
        if copula_update not in ("moment_matched", "none"):
            raise UserInputError(f"copula_update={copula_update!r}: choose moment_matched or none.")
        if self.hparams.num_concepts < 2:
            raise UserInputError("EC-CEM couples concepts: num_concepts must be at least 2.")
        self.save_hyperparameters()
        self.copula = GaussianCopula(self.hparams.num_concepts)

    def correlation(self) -> Tensor:
        return self.copula.correlation()

    def concept_losses(self, out: dict[str, Tensor], concepts: Tensor) -> dict[str, Tensor]:
        terms = super().concept_losses(out, concepts)
        probs = out["probs"] if self.hparams.copula_marginal_grad else out["probs"].detach()
        pairs = max(1, concepts.shape[1] * (concepts.shape[1] - 1) // 2)
        nll = -pairwise_log_likelihood(probs, concepts, self.correlation(), self.hparams.quadrature_nodes) / pairs
        terms["copula"] = self.hparams.copula_loss_weight * nll.mean()
        return terms

    def intervene(self, out: dict[str, Tensor], mask: Tensor, concepts: Tensor, training: bool = False) -> Tensor:
        """Intervened concepts take their value; the others follow the conditional copula (``copula_update``)."""
        use_copula = self.hparams.copula_update != "none" and (not training or
                                                               self.hparams.copula_in_training_interventions)
        if not use_copula or not bool(mask.any()):
            return super().intervene(out, mask, concepts)
        mask = mask.expand_as(out["probs"])
        return conditional_concept_probs(out["probs"], mask, concepts.to(out["probs"].dtype), self.correlation())
