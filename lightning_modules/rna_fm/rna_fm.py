"""RNA-FM: a pathway-structured flow-matching model of bulk RNA-seq from whole-slide images, and two regressors.

Paper: "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction", Jianan Fan, Tianyi Wang,
Qiuyue Hu, Hang Chang, Heng Huang, Weidong Cai, ICML 2026 (arXiv 2605.11622). Official code:
github.com/YXSong000/RNA-FM (built on SEQUOIA's repository and SiT's ``transport/``). The paper's equations were
not readable; the method follows the official code, and details the code does not settle are marked below as
reconstructions.

Files: this module holds the flow matching, the pathway-structured velocity network and ``RNAFM``; the metrics and
the evaluation base shared with the baselines are in `lightning_modules.rna_fm.expression_eval`, the two regressors in
`lightning_modules.rna_fm.expression_regressors`.

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

Baselines (same features, MSE on standardised targets; `lightning_modules.rna_fm.expression_regressors`)
---------------------------------------------------------------------------------------------------
* ``HE2RNARegressor`` (HE2RNA-lite): per-cluster MLP (1x1 convolutions D -> hidden -> G), then for each gene the
  mean of its top-k cluster scores, k drawn from ``ks`` per training step and averaged over ``ks`` in eval.
* ``TRNAsformerRegressor`` (tRNAsformer-style): linear projection to ``dim``, a pre-norm transformer over the
  clusters, mean pooling, LayerNorm + Linear(dim -> G).
Their predictive distribution (for coverage and energy distance) is Gaussian around the point prediction with a
per-gene residual std estimated on the validation split at every validation epoch (``residual_std`` buffer).

Evaluation protocol (``test`` stage; `lightning_modules.rna_fm.expression_eval.expression_metrics`)
-------------------------------------------------------------------------------------------
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
* Prediction averages ``eval_samples`` samples (official: one sample, generator seed 42); each slide's noise is
  drawn from a CPU generator seeded with (``sample_seed``, the slide's global index), so predictions and metrics
  are reproducible and the same with any number of processes (`lightning_modules.shared.example_rng`).
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

from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExampleGenerators, draw_normal, draw_uniform
from lightning_modules.rna_fm.expression_eval import SlideExpressionModule

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

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator | ExampleGenerators | None = None,
             reduction: str = "mean") -> Tensor:
        """Flow-matching loss; t and x0 from the global RNG (training), ``generator`` or per-slide generators."""
        features, x1 = self._check_batch(batch), batch["expression"]
        if generator is None:
            t = torch.rand(x1.shape[0], device=x1.device, dtype=x1.dtype)
            x0 = torch.randn_like(x1)
        else:
            t = draw_uniform((x1.shape[0],), generator, "cpu").to(x1)
            x0 = draw_normal(x1.shape, generator, "cpu").to(x1)
        v = self.velocity(interpolate(x0, x1, t), t, self.drop_condition(features))
        if reduction == "mean":
            return F.mse_loss(v, target_velocity(x0, x1))
        return ((v - target_velocity(x0, x1)) ** 2).mean(1)

    def guided_velocity(self, x: Tensor, t: Tensor, condition: Tensor, empty: Tensor) -> Tensor:
        """CFG velocity from condition embeddings [B, H] and the empty embedding [1, H] (one batched pass)."""
        scale = self.hparams.cfg_scale
        if scale == 1.0:
            return self.net(x, t, condition=condition)
        both = torch.cat([condition, empty.expand_as(condition)])
        v_cond, v_uncond = self.net(torch.cat([x, x]), torch.cat([t, t]), condition=both).chunk(2)
        return cfg_combine(v_cond, v_uncond, scale)

    @torch.no_grad()
    def sample(self, features: Tensor, k: int = 1, generator: torch.Generator | ExampleGenerators | None = None
               ) -> Tensor:
        """k samples per slide, standardised: [B, k, G] (per-slide noise with `ExampleGenerators`)."""
        b, g = features.shape[0], self.structure["num_genes"]
        x0 = draw_normal((b, k, g), generator, "cpu").to(features).reshape(b * k, g)
        condition, empty = self.condition_embeddings(features)
        condition = condition.repeat_interleave(k, 0)

        def field(x: Tensor, t: Tensor) -> Tensor:
            return self.guided_velocity(x, t, condition, empty)

        return integrate(field, x0, self.hparams.sampling_steps, self.hparams.sampler).reshape(b, k, g)

    def distribution(self, features: Tensor, k: int,
                     generator: torch.Generator | ExampleGenerators) -> tuple[Tensor, Tensor]:
        samples = self.sample(features, k, generator)
        return samples.mean(1), samples
