"""RNA-FM: a pathway-structured flow-matching model of bulk RNA-seq from whole-slide images, and two regressors.

Paper: "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction", Jianan Fan, Tianyi Wang,
Qiuyue Hu, Hang Chang, Heng Huang, Weidong Cai, ICML 2026 (arXiv 2605.11622). Official code:
github.com/YXSong000/RNA-FM (built on SEQUOIA's repository and SiT's ``transport/``). The paper's equations were
not readable; the method follows the official code as read for this collection's method card.

Method (``RNAFM``)
------------------
*Flow matching* (SiT's linear ICPlan = ``torchcfm.ConditionalFlowMatcher(sigma=0)``): x1 is the standardised
log-expression of a slide, x0 ~ N(0, I), t ~ U(0, 1)::

    x_t = (1 - t) x0 + t x1            (path)          u_t = x1 - x0       (target velocity)
    L = || v_theta(x_t, t, c) - u_t ||^2                                    (mean over genes and slides)

*Sampling*: Euler (or Heun) integration of dx/dt = v(x, t, c) from t = 0 (noise) to 1 (data) in
``sampling_steps`` equal steps (official: ``odeint(method="euler")`` on ``linspace(0, 1, 20)`` = 19 steps) with
classifier-free guidance ``v = v_u + s (v_c - v_u)`` (s = ``cfg_scale``, official 2.0); v_u uses the fixed random
"empty" condition (a [1, C, D] buffer). In training, the condition is replaced by the empty one with probability
``cfg_drop_prob`` (0.1) **per sample** (``cfg_drop: sample``; the official code drops the whole batch:
``cfg_drop: batch``).

*Condition* c = TimestepEmbedder(1000 t) + e_img, where e_img = MLP(D -> D -> H)(mean over clusters of a 2-layer
pre-norm transformer (dim D, FFN 4 D) over the slide's C cluster features).

*Pathway-structured velocity network*: one token per pathway p, token_p = MLP_p(x_t[genes_p]) (Linear(|p| -> H),
SiLU, Linear(H -> H), separate weights per pathway) + a learned pathway embedding, and one background token
for the genes in no pathway (or listed as UNMAPPED/UNCLASSIFIED). A ``PathwayGraphBlock`` (pre-LN multi-head
attention with an additive -1e4 bias between pathways that share **no** gene, self-loops kept; residual scaled
by a learnable alpha initialised to 0.1; then a 4H FFN) is followed by ``depth`` adaLN-Zero DiT blocks
conditioned on c (shift/scale/gate from a zero-initialised Linear(c), so every block is the identity at init).
Heads: per pathway an adaLN (own shift/scale from c) and a zero-initialised Linear(H -> |p|); the background
token has the same head over its genes. Outputs are scatter-added into the G-vector and divided by the number
of tokens that cover each gene (overlapping pathways are **averaged**). ``pathway_tokens: false`` is the
ablation with one flat token over all genes (no pathway structure, no background token).

Baselines (same features, MSE on standardised targets; section "Regressors" below)
---------------------------------------------------------------------------------
* ``HE2RNARegressor`` (HE2RNA-lite): per-cluster MLP (1x1 convolutions D -> hidden -> G), then for each gene the
  mean of its top-k cluster scores, k drawn from ``ks`` per training step and averaged over ``ks`` in eval.
* ``TRNAsformerRegressor`` (tRNAsformer-style): linear projection to ``dim``, a pre-norm transformer over the
  clusters, mean pooling, LayerNorm + Linear(dim -> G).
Their predictive distribution (for coverage and energy distance) is Gaussian around the point prediction with a
per-gene residual std estimated on the validation split at every validation epoch (``residual_std`` buffer).

Evaluation protocol (``test`` stage; ``expression_metrics``)
-----------------------------------------------------------
All on the test split; model selection and the top-k gene lists only ever see the validation split.
* ``pearson``: mean over genes of the per-gene Pearson r across slides of the point prediction (RNA-FM: mean of
  ``test_samples`` samples); ``pearson_1sample``: the same for one sample (the official protocol);
* ``top{k}``: mean test r of the k genes with the highest **validation** r (the official code ranks on test; the
  validation r of the last validation is stored in checkpoints, so ``train.py test --ckpt_path`` reports it);
* ``rmse``: mean over genes of the per-gene RMSE in log2(x+1) units;
* ``n_significant``: genes with r > 0 and Benjamini-Hochberg q < ``fdr_alpha`` (two-sided Pearson t-test p);
* ``coverage``: fraction of (slide, gene) targets inside the rank interval [x_(j), x_(K+1-j)] of K samples with
  j = (K + 1)(1 - level)/2 (K = 19, level 0.9: [min, max], which a perfect sampler covers with probability
  exactly 18/20 = 0.9); ``coverage_bimodal`` on the generator's bimodal genes when the data provide them;
* ``energy``: mean over genes of the 1-D energy distance sqrt(2 * int (F - G)^2) (scipy's convention) between
  the pooled samples of all test slides and the test targets, in standardised units: does the model reproduce
  the marginal (e.g. bimodal) distribution of each gene;
* ``crps``: mean over slides and genes of the fair sample CRPS E|X - y| - E|X - X'|/2 (standardised units), a
  proper score of each slide's conditional distribution (the energy score per gene);
* ``*_bimodal`` / ``*_unimodal``: the same on the generator's bimodal / other genes when the data mark them.

Deviations and reconstructions (configurable where they are choices)
-------------------------------------------------------------------
* Per-sample CFG dropout by default (official: per batch). Cluster slots get no position embedding by default
  (``cluster_position: none``): k-means labels are arbitrary per slide, so the official ``cluster_index_emb``
  is noise; ``learned`` restores it. The cluster transformer uses torch's ``TransformerEncoderLayer`` (GELU,
  dropout ``dropout``) rather than timm blocks.
* The background token joins the DiT blocks like a pathway token; in the graph block it is linked to the
  pathways whose genes it shares (none when the background set is disjoint from the pathways). One graph block
  is placed before the DiT blocks (the official order as read).
* Per-pathway weights are stored per size bucket (pathways padded to the bucket's largest size, buckets
  doubling in size), so the forward pass is a few batched einsums instead of a loop over 380 pathways; padded
  weights receive zero gradient and never influence the output.
* Prediction averages ``eval_samples`` samples (official: one sample, generator seed 42); noise is drawn from a
  CPU generator seeded with ``sample_seed + batch_idx`` so predictions are reproducible.
* EMA: use ``callbacks.ema.EMAWeights`` (configs); the official decay ramp (0.85 -> 0.999 over 10k steps) is
  replaced by that callback's ``warmup`` ramp.
* p-values use ``scipy.special.betainc`` (scipy comes with scikit-learn); the official code uses
  ``scipy.stats.pearsonr`` + statsmodels' BH, which the tests reproduce.
"""
from __future__ import annotations

import math
from typing import Callable, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.base import PaperModule
from lightning_modules.errors import UserInputError, check_range

STRUCTURE_KEY = "slide_expression_structure"
VAL_R_KEY = "validation_gene_pearson"
MASK_VALUE = -1e4


# ============================================================================================ flow matching
def _bt(t: Tensor, x: Tensor) -> Tensor:
    return t.reshape(-1, *([1] * (x.dim() - 1)))


def interpolate(x0: Tensor, x1: Tensor, t: Tensor) -> Tensor:
    """Straight path x_t = (1 - t) x0 + t x1 (t: [B])."""
    return (1 - _bt(t, x0)) * x0 + _bt(t, x0) * x1


def target_velocity(x0: Tensor, x1: Tensor) -> Tensor:
    """d x_t / dt of the straight path: x1 - x0."""
    return x1 - x0


def cfg_combine(v_cond: Tensor, v_uncond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance: v_u + s (v_c - v_u) (s = 1: conditional, s = 0: unconditional)."""
    return v_uncond + scale * (v_cond - v_uncond)


def integrate(velocity: Callable[[Tensor, Tensor], Tensor], x0: Tensor, steps: int,
              method: str = "euler") -> Tensor:
    """Integrate dx/dt = velocity(x, t) from t = 0 to 1 in ``steps`` equal steps (Euler or Heun)."""
    h = 1.0 / steps
    x = x0
    for i in range(steps):
        t = torch.full((x.shape[0],), i * h, device=x.device, dtype=x.dtype)
        v = velocity(x, t)
        if method == "heun":
            v_next = velocity(x + h * v, t + h)
            v = 0.5 * (v + v_next)
        x = x + h * v
    return x


# ============================================================================================ pathway structure
def shared_gene_adjacency(groups: Sequence[Sequence[int]], num_genes: int) -> Tensor:
    """Bool [P, P]: True where two groups share at least one gene (symmetric, diagonal True)."""
    member = torch.zeros(len(groups), num_genes)
    for p, genes in enumerate(groups):
        member[p, list(genes)] = 1.0
    adjacency = (member @ member.T) > 0
    return adjacency | torch.eye(len(groups), dtype=torch.bool)


def attention_bias(adjacency: Tensor, value: float = MASK_VALUE) -> Tensor:
    """Additive attention mask: 0 where connected, ``value`` (-1e4) elsewhere."""
    return torch.where(adjacency, 0.0, value)


def coverage_counts(groups: Sequence[Sequence[int]], num_genes: int) -> Tensor:
    """How many groups (tokens) cover every gene, [G] float."""
    counts = torch.zeros(num_genes)
    for genes in groups:
        counts[list(genes)] += 1.0
    return counts


class RaggedLayout(nn.Module):
    """Groups of different sizes bucketed by size (bucket b holds sizes in (2^(b-1), 2^b]), padded per bucket.

    ``genes{b}`` [P_b, L_b] gene index (pad 0), ``valid{b}`` [P_b, L_b] float mask, ``members{b}`` [P_b] the
    group ids of the bucket; ``order`` maps concatenated bucket outputs back to group order.
    """

    def __init__(self, groups: Sequence[Sequence[int]]) -> None:
        super().__init__()
        sizes = [len(g) for g in groups]
        if min(sizes) < 1:
            raise UserInputError("every pathway needs at least one gene.")
        bucket_of = [max(0, math.ceil(math.log2(s))) for s in sizes]
        self.buckets = sorted(set(bucket_of))
        self.sizes: list[int] = sizes
        concat = []
        for i, b in enumerate(self.buckets):
            members = [p for p in range(len(groups)) if bucket_of[p] == b]
            width = max(sizes[p] for p in members)
            genes = torch.zeros(len(members), width, dtype=torch.long)
            valid = torch.zeros(len(members), width)
            for row, p in enumerate(members):
                genes[row, :sizes[p]] = torch.as_tensor(list(groups[p]), dtype=torch.long)
                valid[row, :sizes[p]] = 1.0
            self.register_buffer(f"genes{i}", genes, persistent=False)
            self.register_buffer(f"valid{i}", valid, persistent=False)
            concat += members
        self.register_buffer("order", torch.argsort(torch.as_tensor(concat)), persistent=False)
        self.bucket_members = [[p for p in range(len(groups)) if bucket_of[p] == b] for b in self.buckets]

    def __len__(self) -> int:
        return len(self.buckets)

    def genes(self, i: int) -> Tensor:
        return getattr(self, f"genes{i}")

    def valid(self, i: int) -> Tensor:
        return getattr(self, f"valid{i}")


class PathwayTokenizer(nn.Module):
    """token_p = Linear(H -> H)(SiLU(Linear(|p| -> H)(x[genes_p]))) + embedding_p, batched per size bucket."""

    def __init__(self, layout: RaggedLayout, hidden: int) -> None:
        super().__init__()
        self.layout = layout
        self.w1, self.b1, self.w2, self.b2 = (nn.ParameterList() for _ in range(4))
        for i in range(len(layout)):
            genes, valid = layout.genes(i), layout.valid(i)
            fan_in = valid.sum(1, keepdim=True)[..., None]  # [P_b, 1, 1]
            bound = 1.0 / fan_in.sqrt()
            self.w1.append(nn.Parameter((torch.rand(*genes.shape, hidden) * 2 - 1) * bound * valid[..., None]))
            self.b1.append(nn.Parameter((torch.rand(genes.shape[0], hidden) * 2 - 1) * bound[..., 0]))
            self.w2.append(nn.Parameter((torch.rand(genes.shape[0], hidden, hidden) * 2 - 1) / math.sqrt(hidden)))
            self.b2.append(nn.Parameter(torch.zeros(genes.shape[0], hidden)))
        self.embedding = nn.Parameter(torch.randn(len(layout.sizes), hidden) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, G] -> tokens [B, P, H]."""
        out = []
        for i in range(len(self.layout)):
            xs = x[:, self.layout.genes(i)] * self.layout.valid(i)  # [B, P_b, L_b]
            h = F.silu(torch.einsum("bpl,plh->bph", xs, self.w1[i]) + self.b1[i])
            out.append(torch.einsum("bph,phk->bpk", h, self.w2[i]) + self.b2[i])
        return torch.cat(out, 1)[:, self.layout.order] + self.embedding


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN: x (1 + scale) + shift (shift/scale broadcast over tokens unless already per token)."""
    if shift.dim() == x.dim() - 1:
        shift, scale = shift.unsqueeze(1), scale.unsqueeze(1)
    return x * (1 + scale) + shift


class PathwayHeads(nn.Module):
    """Per-group adaLN + zero-init Linear(H -> |p|); outputs scattered to genes and averaged over overlaps."""

    def __init__(self, layout: RaggedLayout, groups: Sequence[Sequence[int]], num_genes: int, hidden: int) -> None:
        super().__init__()
        self.layout, self.num_genes = layout, num_genes
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        num_groups = len(groups)
        self.mod_w = nn.Parameter(torch.zeros(num_groups, hidden, 2 * hidden))  # per-group adaLN (zero init)
        self.mod_b = nn.Parameter(torch.zeros(num_groups, 2 * hidden))
        self.w, self.b = nn.ParameterList(), nn.ParameterList()
        for i in range(len(layout)):
            genes = layout.genes(i)
            self.w.append(nn.Parameter(torch.zeros(genes.shape[0], hidden, genes.shape[1])))
            self.b.append(nn.Parameter(torch.zeros(*genes.shape)))
        self.register_buffer("counts", coverage_counts(groups, num_genes).clamp(min=1.0), persistent=False)
        starts = np.cumsum([0] + [len(m) for m in layout.bucket_members])
        self.bucket_slices = [(int(starts[i]), int(starts[i + 1])) for i in range(len(layout))]
        self.register_buffer("concat_ids", torch.as_tensor(sum(layout.bucket_members, []), dtype=torch.long),
                             persistent=False)

    def forward(self, tokens: Tensor, c: Tensor) -> Tensor:
        """tokens [B, P, H], c [B, H] -> [B, G]."""
        shift, scale = (torch.einsum("bh,phk->bpk", F.silu(c), self.mod_w) + self.mod_b).chunk(2, dim=-1)
        y = modulate(self.norm(tokens), shift, scale)[:, self.concat_ids]  # bucket-concatenated order
        out = tokens.new_zeros(tokens.shape[0], self.num_genes)
        for i, (lo, hi) in enumerate(self.bucket_slices):
            values = (torch.einsum("bph,phl->bpl", y[:, lo:hi], self.w[i]) + self.b[i]) * self.layout.valid(i)
            index = self.layout.genes(i).reshape(-1)
            out = out.index_add(1, index, values.reshape(values.shape[0], -1))
        return out / self.counts


class TimestepEmbedder(nn.Module):
    """DiT's sinusoidal embedding of 1000 t (256 frequencies) followed by an MLP."""

    def __init__(self, hidden: int, frequency_dim: int = 256) -> None:
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        half = self.frequency_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = (1000.0 * t.float())[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(t.dtype))


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(b, n, h))


def _mlp(hidden: int, ratio: float = 4.0, dropout: float = 0.0) -> nn.Sequential:
    inner = int(hidden * ratio)
    return nn.Sequential(nn.Linear(hidden, inner), nn.GELU(approximate="tanh"), nn.Dropout(dropout),
                         nn.Linear(inner, hidden))


class AdaLNZeroBlock(nn.Module):
    """DiT block: x += g1 * Attn(adaLN(x)); x += g2 * MLP(adaLN(x)); (shift, scale, gate) x 2 from c, zero init."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = _mlp(hidden, mlp_ratio)
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))
        nn.init.zeros_(self.modulation[1].weight)
        nn.init.zeros_(self.modulation[1].bias)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c).unsqueeze(1).chunk(6, dim=-1)
        x = x + gate1 * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2))


class PathwayGraphBlock(nn.Module):
    """Pre-LN attention restricted to pathways sharing a gene (additive -1e4 bias), residual * alpha, then FFN."""

    def __init__(self, hidden: int, heads: int, bias: Tensor, alpha: float = 0.1, dropout: float = 0.1) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads, dropout)
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.ffn = _mlp(hidden, 4.0, dropout)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.alpha * self.drop(self.attn(self.norm1(x), self.bias))
        return x + self.drop(self.ffn(self.norm2(x)))


class ClusterEncoder(nn.Module):
    """Slide condition: pre-norm transformer over the C cluster features (dim D), mean pool, MLP(D -> D -> H)."""

    def __init__(self, feature_dim: int, num_clusters: int, hidden: int, layers: int = 2, heads: int = 4,
                 dropout: float = 0.1, cluster_position: str = "none") -> None:
        super().__init__()
        self.position = nn.Parameter(torch.zeros(1, num_clusters, feature_dim)) if cluster_position == "learned" \
            else None
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(feature_dim, heads, 4 * feature_dim, dropout, activation="gelu",
                                       batch_first=True, norm_first=True) for _ in range(layers))
        self.out = nn.Sequential(nn.Linear(feature_dim, feature_dim), nn.SiLU(), nn.Linear(feature_dim, hidden))

    def forward(self, features: Tensor) -> Tensor:
        x = features if self.position is None else features + self.position
        for layer in self.layers:
            x = layer(x)
        return self.out(x.mean(1))


class PathwayVelocityNet(nn.Module):
    """v_theta(x_t, t, slide features): pathway tokens -> graph block -> adaLN-Zero DiT blocks -> averaged heads."""

    def __init__(self, groups: Sequence[Sequence[int]], num_genes: int, feature_dim: int, num_clusters: int,
                 hidden: int = 256, depth: int = 7, heads: int = 8, graph_heads: int = 4, graph_alpha: float = 0.1,
                 cond_layers: int = 2, cond_heads: int = 4, dropout: float = 0.1,
                 cluster_position: str = "none") -> None:
        super().__init__()
        layout = RaggedLayout(groups)
        self.tokenizer = PathwayTokenizer(layout, hidden)
        self.graph = PathwayGraphBlock(hidden, graph_heads, attention_bias(shared_gene_adjacency(groups, num_genes)),
                                       graph_alpha, dropout)
        self.time = TimestepEmbedder(hidden)
        self.condition = ClusterEncoder(feature_dim, num_clusters, hidden, cond_layers, cond_heads, dropout,
                                        cluster_position)
        self.blocks = nn.ModuleList(AdaLNZeroBlock(hidden, heads) for _ in range(depth))
        self.heads = PathwayHeads(layout, groups, num_genes, hidden)

    def forward(self, x: Tensor, t: Tensor, features: Tensor | None = None, condition: Tensor | None = None) -> Tensor:
        """x [B, G], t [B], and either cluster features [B, C, D] or their embedding ``condition`` [B, H]."""
        c = self.time(t) + (self.condition(features) if condition is None else condition)
        tokens = self.graph(self.tokenizer(x))
        for block in self.blocks:
            tokens = block(tokens, c)
        return self.heads(tokens, c)


# ============================================================================================ metrics
def per_gene_pearson(pred: Tensor, target: Tensor) -> Tensor:
    """Pearson r across slides for every gene ([N, G] -> [G]); 0 where either side is constant."""
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
    Subclasses implement ``build(structure)``, ``loss(batch)`` and ``distribution(features, k, generator)``.
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

    def structure_from(self, datamodule) -> dict:
        pathways, background = datamodule.pathways, datamodule.background
        groups = None
        if pathways:
            groups = [list(map(int, p)) for p in pathways] + ([list(map(int, background))] if background else [])
        return {"num_genes": int(datamodule.num_genes), "feature_dim": int(datamodule.feature_dim),
                "num_clusters": int(datamodule.num_clusters), "groups": groups}

    def setup(self, stage: str) -> None:
        datamodule = self.attached_datamodule
        if datamodule is not None and hasattr(datamodule, "num_genes"):
            structure = self.structure_from(datamodule)
            if self.structure is None:
                self._build(structure)
                if stage == "fit":
                    self.gene_mean.copy_(torch.as_tensor(datamodule.gene_mean))
                    self.gene_std.copy_(torch.as_tensor(datamodule.gene_std))
            elif any(self.structure[k] != structure[k] for k in ("num_genes", "feature_dim", "num_clusters")):
                raise UserInputError(
                    f"the model was built for {self.structure['num_genes']} genes and cluster features "
                    f"[{self.structure['num_clusters']}, {self.structure['feature_dim']}] but the data has "
                    f"{structure['num_genes']} genes and [{structure['num_clusters']}, {structure['feature_dim']}]: "
                    "use the data the checkpoint was trained on.")
        elif self.structure is None:
            raise UserInputError(f"{type(self).__name__} needs a SlideExpressionDataModule (genes, pathways and "
                                 "feature shape come from the data), or a checkpoint to load.")
        super().setup(stage)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[STRUCTURE_KEY] = self.structure
        if self.val_gene_r is not None:  # the top-k gene lists of a later test-only run come from validation
            checkpoint[VAL_R_KEY] = self.val_gene_r.detach().cpu().clone()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Rebuild the network (``load_from_checkpoint`` calls this before ``load_state_dict``)."""
        if self.structure is None and checkpoint.get(STRUCTURE_KEY):
            self._build(checkpoint[STRUCTURE_KEY])
        if checkpoint.get(VAL_R_KEY) is not None:
            self.val_gene_r = checkpoint[VAL_R_KEY].float()

    # ----------------------------------------------------------------------------------------- interface
    def loss(self, batch: dict[str, Tensor], generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def distribution(self, features: Tensor, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """(point prediction [B, G], k samples [B, k, G]), standardised."""
        raise NotImplementedError

    def _generator(self, batch_idx: int) -> torch.Generator:
        return torch.Generator().manual_seed(int(self.hparams.sample_seed) + int(batch_idx))

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
        loss = self.loss(batch, self._generator(batch_idx))
        self.log(f"{stage}/loss", loss, batch_size=features.shape[0], sync_dist=True)
        point, samples = self.distribution(features, k, self._generator(batch_idx))
        self._outputs.setdefault(stage, []).append((point, samples, batch["expression"]))

    def validation_step(self, batch, batch_idx):
        self._evaluate("val", batch, batch_idx, self.hparams.eval_samples)

    def test_step(self, batch, batch_idx):
        self._evaluate("test", batch, batch_idx, self.hparams.test_samples)

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> Tensor:
        """Point prediction in log2(x+1) units, [B, G] (RNA-FM: mean of ``eval_samples`` samples)."""
        point, _ = self.distribution(self._check_batch(batch), self.hparams.eval_samples, self._generator(batch_idx))
        return self.to_log_space(point)

    def _gathered(self, stage: str) -> tuple[Tensor, Tensor, Tensor]:
        outputs = self._outputs.pop(stage, [])
        point, samples, target = (torch.cat([o[i] for o in outputs]) for i in range(3))
        if self._trainer is not None and self.trainer.world_size > 1:
            point, samples, target = (self.all_gather(x).flatten(0, 1) for x in (point, samples, target))
        return point, samples, target

    def on_validation_epoch_end(self) -> None:
        if "val" not in self._outputs:
            return
        point, samples, target = self._gathered("val")
        self.val_gene_r = per_gene_pearson(point, target).float()
        self.log("val/pearson", self.val_gene_r.mean())
        self.log("val/rmse", (((point - target) ** 2).mean(0).sqrt() * self.gene_std).mean())
        self.after_validation(point, target)

    def after_validation(self, point: Tensor, target: Tensor) -> None:
        """Hook (regressors estimate their residual std here)."""

    def bimodal_genes(self) -> Tensor | None:
        datamodule = self.attached_datamodule
        mask = getattr(datamodule, "bimodal_genes", None) if datamodule is not None else None
        return None if mask is None else torch.as_tensor(mask, dtype=torch.bool)

    def on_test_epoch_end(self) -> None:
        if "test" not in self._outputs:
            return
        point, samples, target = self._gathered("test")
        chosen = top_k_genes(self.val_gene_r, self.hparams.top_ks) if self.val_gene_r is not None else None
        metrics, _ = expression_metrics(point, samples, target, self.gene_std, chosen, self.bimodal_genes(),
                                        self.hparams.coverage_level, self.hparams.fdr_alpha)
        self.test_metrics = metrics
        for name, value in metrics.items():
            self.log(f"test/{name}", value)


# ============================================================================================ RNA-FM
class RNAFM(SlideExpressionModule):
    """RNA-FM: conditional flow matching with the pathway-structured velocity network (see module docstring).

    Args:
        hidden_dim, depth, num_heads: DiT width, number of adaLN-Zero blocks, attention heads (paper 256, 7, 8).
        graph_heads, graph_alpha: heads (4) and initial residual scale (0.1) of the pathway graph block.
        cond_layers, cond_heads, cluster_position: the cluster transformer (2 layers; heads must divide D).
        dropout: in the graph block and the cluster transformer (0.1).
        pathway_tokens: False = one flat token over all genes (ablation).
        cfg_drop_prob, cfg_drop: condition dropout probability and granularity (``sample`` or ``batch``).
        cfg_scale: guidance scale at sampling (2.0). sampling_steps, sampler: ODE integration (19 Euler steps).
        eval_samples, test_samples, coverage_level, top_ks, fdr_alpha, sample_seed: evaluation (base class).
    """

    needs_pathways = True

    def __init__(self, hidden_dim: int = 256, depth: int = 7, num_heads: int = 8, graph_heads: int = 4,
                 graph_alpha: float = 0.1, cond_layers: int = 2, cond_heads: int = 4,
                 cluster_position: Literal["none", "learned"] = "none", dropout: float = 0.1,
                 pathway_tokens: bool = True, cfg_drop_prob: float = 0.1,
                 cfg_drop: Literal["sample", "batch"] = "sample", cfg_scale: float = 2.0, sampling_steps: int = 19,
                 sampler: Literal["euler", "heun"] = "euler", eval_samples: int = 1, test_samples: int = 19,
                 coverage_level: float = 0.9, top_ks: Sequence[int] = (20, 100), fdr_alpha: float = 0.05,
                 sample_seed: int = 42, optimizer: OptimizerCallable = torch.optim.AdamW,
                 lr_scheduler: LRSchedulerCallable | None = None, init_from: str | None = None,
                 init_from_trusted: bool = False) -> None:
        super().__init__(eval_samples=eval_samples, test_samples=test_samples, coverage_level=coverage_level,
                         top_ks=top_ks, fdr_alpha=fdr_alpha, sample_seed=sample_seed, optimizer=optimizer,
                         lr_scheduler=lr_scheduler, init_from=init_from, init_from_trusted=init_from_trusted)
        for name, value in (("hidden_dim", hidden_dim), ("num_heads", num_heads), ("graph_heads", graph_heads),
                            ("cond_heads", cond_heads), ("sampling_steps", sampling_steps)):
            check_range(name, value, 1)
        check_range("depth", depth, 0)
        check_range("cond_layers", cond_layers, 0)
        for name, heads in (("num_heads", num_heads), ("graph_heads", graph_heads)):
            if hidden_dim % heads:
                raise UserInputError(f"hidden_dim={hidden_dim} is not divisible by {name}={heads}.")
        check_range("dropout", dropout, 0.0, 1.0, high_inclusive=False)
        check_range("cfg_drop_prob", cfg_drop_prob, 0.0, 1.0)
        check_range("cfg_scale", cfg_scale, 0.0)
        for name, value, allowed in (("cluster_position", cluster_position, ("none", "learned")),
                                     ("cfg_drop", cfg_drop, ("sample", "batch")),
                                     ("sampler", sampler, ("euler", "heun"))):
            if value not in allowed:
                raise UserInputError(f"{name}={value!r} is unknown: choose one of {', '.join(allowed)}.")
        self.needs_pathways = pathway_tokens
        self.save_hyperparameters()
        self.net: PathwayVelocityNet | None = None

    def build(self, structure: dict) -> None:
        hp = self.hparams
        d = structure["feature_dim"]
        if d % hp.cond_heads:
            raise UserInputError(f"cluster feature dim {d} is not divisible by cond_heads={hp.cond_heads}.")
        groups = structure["groups"] if hp.pathway_tokens else [list(range(structure["num_genes"]))]
        self.net = PathwayVelocityNet(groups, structure["num_genes"], d, structure["num_clusters"], hp.hidden_dim,
                                      hp.depth, hp.num_heads, hp.graph_heads, hp.graph_alpha, hp.cond_layers,
                                      hp.cond_heads, hp.dropout, hp.cluster_position)
        empty = torch.randn(1, structure["num_clusters"], d, generator=torch.Generator().manual_seed(0))
        self.register_buffer("empty_condition", empty)

    def velocity(self, x: Tensor, t: Tensor, features: Tensor) -> Tensor:
        return self.net(x, t, features)

    def condition_embeddings(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """(slide embeddings [B, H], empty-condition embedding [1, H]); computed once per sampling call."""
        return self.net.condition(features), self.net.condition(self.empty_condition.to(features.dtype))

    def drop_condition(self, features: Tensor) -> Tensor:
        """Replace the condition by the empty one, per sample (or for the whole batch) w.p. cfg_drop_prob."""
        if not self.training or self.hparams.cfg_drop_prob == 0:
            return features
        b = features.shape[0]
        if self.hparams.cfg_drop == "batch":
            drop = (torch.rand(1, device=features.device) < self.hparams.cfg_drop_prob).expand(b)
        else:
            drop = torch.rand(b, device=features.device) < self.hparams.cfg_drop_prob
        return torch.where(drop[:, None, None], self.empty_condition.to(features.dtype), features)

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator | None = None) -> Tensor:
        features, x1 = self._check_batch(batch), batch["expression"]
        if generator is None:
            t = torch.rand(x1.shape[0], device=x1.device, dtype=x1.dtype)
            x0 = torch.randn_like(x1)
        else:
            t = torch.rand(x1.shape[0], generator=generator).to(x1)
            x0 = torch.randn(x1.shape, generator=generator).to(x1)
        v = self.velocity(interpolate(x0, x1, t), t, self.drop_condition(features))
        return F.mse_loss(v, target_velocity(x0, x1))

    def guided_velocity(self, x: Tensor, t: Tensor, condition: Tensor, empty: Tensor) -> Tensor:
        """CFG velocity from condition embeddings [B, H] and the empty embedding [1, H] (one batched pass)."""
        scale = self.hparams.cfg_scale
        if scale == 1.0:
            return self.net(x, t, condition=condition)
        both = torch.cat([condition, empty.expand_as(condition)])
        v_cond, v_uncond = self.net(torch.cat([x, x]), torch.cat([t, t]), condition=both).chunk(2)
        return cfg_combine(v_cond, v_uncond, scale)

    @torch.no_grad()
    def sample(self, features: Tensor, k: int = 1, generator: torch.Generator | None = None) -> Tensor:
        """k samples per slide, standardised: [B, k, G]."""
        b, g = features.shape[0], self.structure["num_genes"]
        x0 = torch.randn(b * k, g, generator=generator).to(features)
        condition, empty = self.condition_embeddings(features)
        condition = condition.repeat_interleave(k, 0)

        def field(x: Tensor, t: Tensor) -> Tensor:
            return self.guided_velocity(x, t, condition, empty)

        return integrate(field, x0, self.hparams.sampling_steps, self.hparams.sampler).reshape(b, k, g)

    def distribution(self, features: Tensor, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        samples = self.sample(features, k, generator)
        return samples.mean(1), samples


# ============================================================================================ Regressors
class ExpressionRegressor(SlideExpressionModule):
    """MSE regressor on standardised expression; Gaussian predictive distribution with validation residual std."""

    def build(self, structure: dict) -> None:
        self.register_buffer("residual_std", torch.ones(structure["num_genes"]))
        self.net = self.build_net(structure)

    def build_net(self, structure: dict) -> nn.Module:
        raise NotImplementedError

    def forward(self, features: Tensor) -> Tensor:
        return self.net(features)

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator | None = None) -> Tensor:
        return F.mse_loss(self(self._check_batch(batch)), batch["expression"])

    def distribution(self, features: Tensor, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        point = self(features)
        noise = torch.randn(point.shape[0], k, point.shape[1], generator=generator).to(point)
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
    """HE2RNA-lite baseline. Args: hidden_dim, ks (top-k cluster pooling sizes), dropout; evaluation as RNA-FM."""

    def __init__(self, hidden_dim: int = 256, ks: Sequence[int] = (10,), dropout: float = 0.25,
                 eval_samples: int = 1, test_samples: int = 19, coverage_level: float = 0.9,
                 top_ks: Sequence[int] = (20, 100), fdr_alpha: float = 0.05, sample_seed: int = 42,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
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
    """tRNAsformer-style baseline. Args: dim, depth, num_heads, mlp_dim, dropout, cluster_position."""

    def __init__(self, dim: int = 256, depth: int = 2, num_heads: int = 4, mlp_dim: int = 512, dropout: float = 0.1,
                 cluster_position: Literal["none", "learned"] = "none", eval_samples: int = 1,
                 test_samples: int = 19, coverage_level: float = 0.9, top_ks: Sequence[int] = (20, 100),
                 fdr_alpha: float = 0.05, sample_seed: int = 42, optimizer: OptimizerCallable = torch.optim.Adam,
                 lr_scheduler: LRSchedulerCallable | None = None, init_from: str | None = None,
                 init_from_trusted: bool = False) -> None:
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

    def build_net(self, structure: dict) -> nn.Module:
        hp = self.hparams
        return TRNAsformerNet(structure["feature_dim"], structure["num_clusters"], structure["num_genes"], hp.dim,
                              hp.depth, hp.num_heads, hp.mlp_dim, hp.dropout, hp.cluster_position)
