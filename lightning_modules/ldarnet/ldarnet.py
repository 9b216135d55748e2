"""LDARNet: a hierarchical byte-level DNA model with learned (dynamic) chunking, MLM pretraining and fine-tuning.

Paper: "LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling",
Daria Ledneva, Denis Kuznetsov, ICML 2026 (arXiv 2606.04552). Official code: github.com/darlednik/ICML-LDARNet
(Apache-2.0), an H-Net derivative. Only the abstract of the paper was readable; every formula below follows the
official code, and what the code does not settle is listed under "Deviations / reconstructions".

Files: the network (steps 1-7 below) is in `lightning_modules.ldarnet.ldarnet_network`, its BiMamba-2 blocks in
`lightning_modules.ldarnet.bimamba2`; this module holds the training recipe (optimiser groups, schedule, MLM masking)
and the two LightningModules.

Method
------
Bytes of DNA (vocabulary A=0, C=1, G=2, T=3, N=4, [MASK]=5, [PAD]=6) are embedded (d_outer) and processed by a
single-stage hierarchy given by an architecture layout like the authors' ``arch_layout = ["m3t1", ["M10"], "m4"]``
(`parse_layout`: ``m``/``M`` = BiMamba-2 block without/with a SwiGLU MLP, ``t``/``T`` = local bidirectional
attention block without/with MLP, each letter followed by a count):

1. **Encoder** (``m3t1``) at width ``d_model[0]``: pre-norm RMSNorm residual blocks of BiMamba-2
   (`lightning_modules.ldarnet.bimamba2`) and local attention (window ``attn_window`` on both sides, rotary on the first
   ``rotary_dim`` dims of every head), final RMSNorm.
2. **Bidirectional routing** (`BidirectionalRouter`): ``q = normalize(W_q x)``, ``k = normalize(W_k x)`` (identity
   initialised); ``cos_t = 1/2 (q_{t-1}.k_t + q_t.k_{t-1})`` (symmetrised adjacent similarity), ``p_t =
   clamp((1 - cos_t)/2, 0, 1)``, ``p_0 = 1``; boundary ``b_t = [p_t > 0.5]`` (masked by padding), selected
   probability ``c_t = max(p_t, 1 - p_t)``.
3. **Chunking** (`chunk`): keep the boundary positions (stable order), right-pad to the longest compressed
   sequence of the batch; compressed padding mask.
4. **Backbone** (``M10``) at width ``d_model[1]`` on the compressed sequence; the encoder output is widened with a
   learned vector (``d_model[1] - d_model[0]`` dims) and the backbone output is cut back to ``d_model[0]``.
5. **Dechunking** (`dechunk_ema`, always in fp32 - the authors' post-camera-ready fix): a bidirectional EMA over
   the M chunk vectors, ``zbar_j = p_j z_j + (1 - p_j) zbar_{j-1}`` forwards and the same on the reversed chunk
   sequence, averaged (p clamped to [1e-4, 1 - 1e-4]); computed with the chunked SSD scan (scalar state,
   log-decay ``log(1 - p)``, input weight ``p``), which equals the EMA loop (tested). Upsampling: position t takes
   chunk ``cumsum(b)_t - 1``.
6. **Straight-through residual**: ``out = upsampled * STE(c_t) + W_res enc_out`` (STE forward 1, gradient to
   c_t; W_res zero-initialised, fp32), then the **decoder** (``m4``) and its final RMSNorm.
7. **Ratio loss** (H-Net's load balancing, `ratio_loss`): ``F = mean(b)``, ``G = mean(p)`` over valid tokens,
   ``L_ratio = N/(N-1) ((N-1) F G + (1-F)(1-G))`` with target compression N; total loss
   ``L_MLM + ratio_loss_weight * L_ratio`` (paper: N = 4, weight 0.03). L_ratio = 1 at F = G = 1/N.

Pretraining (`LDARNetPretraining`): MLM on 15 % of the A/C/G/T positions (80 % [MASK], 10 % a random base, 10 %
unchanged; N and PAD are never selected), reverse-complement augmentation with probability 0.5 on training
batches, untied LM head Linear(d_outer, 7). Validation and test mask each sequence from a generator of its own,
seeded by (``val_mask_seed``, the sequence's index in its split) (`lightning_modules.shared.example_rng`): the
same positions every epoch, whatever batch or rank the sequence lands in. Their logged values are epoch totals
over every sequence once (all ranks' per-sequence sums gathered, the sampler's padding copies dropped):
``mlm_loss`` / ``mlm_accuracy`` per masked token, ``compression`` (F) / ``mean_prob`` (G) per valid token,
``ratio_loss`` of the epoch's F and G, ``loss = mlm_loss + ratio_loss_weight * ratio_loss``; so 1 and 2
processes report the same numbers.
Fine-tuning (`LDARNetClassifier`): the same network loaded with ``init_from`` (weights matched by name and shape),
mean pooling over non-pad positions of the final full-resolution hidden states, a linear head; metrics MCC (the
paper's metric) and accuracy (torchmetrics). Optimiser groups (both modules): no weight decay for biases, norms,
``A_log``, ``D``, ``dt_bias`` (and the embedding / pad vector); the outer stage (embedding, encoder, router,
residual, decoder, LM head) gets ``outer_lr_multiplier`` x the LR (paper: ``sqrt(N) * d_back/d_outer = 3``), the
classifier head ``head_lr_multiplier``.

**Fixed-boundary control** (``boundaries: fixed``): boundaries every N bases (``t mod N == 0``; the same
compressed length as the target of the learned router), hard ``p = b`` (the EMA then copies each chunk vector,
up to the 1e-4 clamp), ``c = 1``, no ratio loss, router frozen. Everything else is identical.

Evaluation protocol (paper): NT downstream tasks (18) and Genomic Benchmarks, full fine-tuning from the
pretrained checkpoint, 10-fold CV on train, best epoch by val MCC, test MCC x 100 (see configs/ldarnet/paper.yaml).

Deviations / reconstructions
----------------------------
* Pure PyTorch SSD instead of mamba_ssm kernels (mamba_ssm's fused scan is used when it imports and the input is
  on CUDA); padded steps get ``dt = 0`` in BiMamba-2 (exact padding invariance; see
  `lightning_modules.ldarnet.bimamba2`).
* Only single-stage hierarchies (``[enc, [main], dec]``); deeper nesting raises. Attention heads / window /
  rotary dim are one value for every attention block. The residual stream stays in the dtype of the embedding
  (fp32 under autocast, like the official fp32 residual).
* Fixed-boundary control: hard p and no router (reconstructed: which p the authors' control uses is not stated).
* ``WSDSchedule``: warm-up (linear), stable, and a ``1 - sqrt`` decay to ``final_ratio`` over the last
  ``decay_fraction`` of steps (a reconstruction of the described "inverse-sqrt decay to 5 %"; the exact curve is
  not given). The fine-tuning ``reduce_lr_on_plateau`` of the authors' eval script is not wired (the collection
  steps schedulers per step).
* Classification head lr multiplier default 1.0 (the authors' eval script); the outer-stage multiplier defaults to
  1.0 when fine-tuning (the multiplier is documented for pretraining only); 10-fold CV is left to the user
  (``data.init_args.fold``/seeds), a single seeded validation hold-out is used.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassMatthewsCorrCoef

from lightning_modules.shared.base import PaperModule
from lightning_modules.ldarnet.bimamba2 import SSDImpl
from lightning_modules.shared.data_contract import LabelledSequenceData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExampleGenerators, gather_examples
from lightning_modules.ldarnet.ldarnet_network import (MASK_TOKEN, N_TOKEN, VOCAB_SIZE, Boundaries, LDARNetNetwork,
                                                       Layout, check_arch_layout)

COMPLEMENT = torch.tensor([3, 2, 1, 0, 4, 5, 6])  # A<->T, C<->G; N, MASK, PAD unchanged
IGNORE_INDEX = -100
STREAM_EVAL_MASK = 0  # `ExampleGenerators` stream of the validation/test MLM masks


# ============================================================================================ optimisation
def no_weight_decay(name: str, param: Tensor) -> bool:
    """Biases, norm weights, SSM A_log/D/dt_bias, embeddings and the pad vector get no weight decay."""
    last = name.rsplit(".", 1)[-1]
    return (param.ndim < 2 or last in ("A_log", "D", "dt_bias", "bias") or "norm" in name
            or "embedding" in name or name.endswith("pad_dimension"))


def param_groups(module: nn.Module, multipliers: dict[str, float]) -> list[dict]:
    """AdamW groups: (decay / no decay) x (LR multiplier by name prefix; first matching prefix wins, '' = rest)."""
    groups: dict[tuple[float, bool], list[Tensor]] = {}
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        mult = next(m for prefix, m in multipliers.items() if name.startswith(prefix))
        groups.setdefault((mult, no_weight_decay(name, param)), []).append(param)
    out = []
    for (mult, no_wd), params in groups.items():
        group = {"params": params, "lr_multiplier": mult}
        if no_wd:
            group["weight_decay"] = 0.0
        out.append(group)
    return out


class WSDSchedule(torch.optim.lr_scheduler.LambdaLR):
    """Warm-up (linear) / stable / decay (``1 - sqrt``) to ``final_ratio`` of the LR, by optimiser step.

    transformers' ``get_wsd_schedule(decay_type="1-sqrt", min_lr_ratio=final_ratio)`` gives the same stable and
    decay phases, but its warm-up starts at ``final_ratio`` x LR rather than LR / warm-up steps, it takes whole
    step counts rather than fractions of the run, and it would make LDARNet import transformers.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float = 0.1,
                 decay_fraction: float = 0.2, final_ratio: float = 0.05) -> None:
        if total_steps < 1:
            raise UserInputError(f"WSDSchedule total_steps={total_steps} must be >= 1 (the run's optimiser steps).")
        check_range("warmup_fraction", warmup_fraction, 0, 1)
        check_range("decay_fraction", decay_fraction, 0, 1)
        check_range("final_ratio", final_ratio, 0, 1)
        self.total, self.warmup, self.decay, self.final = total_steps, warmup_fraction, decay_fraction, final_ratio
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        warm, decay_start = self.warmup * self.total, (1 - self.decay) * self.total
        if step < warm:
            return (step + 1) / warm
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start) / max(self.total - decay_start, 1))
        return self.final + (1 - self.final) * (1 - math.sqrt(progress))


# ============================================================================================ MLM data ops
def reverse_complement(tokens: Tensor, valid: Tensor) -> Tensor:
    """Reverse complement of every right-padded sequence (padding stays at the end)."""
    lengths = valid.sum(1, keepdim=True)
    pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
    index = torch.where(pos < lengths, lengths - 1 - pos, pos)
    return COMPLEMENT.to(tokens.device)[tokens.gather(1, index)]


def random_reverse_complement(tokens: Tensor, valid: Tensor, prob: float, generator=None) -> Tensor:
    """Reverse-complement each sequence with probability ``prob`` (one draw per sequence; per-sequence generators
    with `ExampleGenerators`)."""
    if isinstance(generator, ExampleGenerators):
        flip = generator.rand((tokens.shape[0],)).to(tokens.device) < prob
    else:
        flip = torch.rand(tokens.shape[0], generator=generator).to(tokens.device) < prob
    return torch.where(flip.unsqueeze(1), reverse_complement(tokens, valid), tokens)


def _per_sequence_draws(valid: Tensor, generators: ExampleGenerators) -> tuple[Tensor, Tensor]:
    """`mlm_mask`'s (3, B, L) uniforms and (B, L) random bases, row b drawn from generator b over the sequence's
    own length only (padding gets 1.0 / 0), so a sequence's mask does not depend on how far its batch is padded."""
    if len(generators) != valid.shape[0]:
        raise ValueError(f"{len(generators)} generators for a batch of {valid.shape[0]} sequences.")
    draws = torch.ones((3, *valid.shape))
    random_base = torch.zeros(valid.shape, dtype=torch.long)
    for row, (n, g) in enumerate(zip(valid.sum(1).tolist(), generators.generators)):
        draws[:, row, :n] = torch.rand((3, n), generator=g)
        random_base[row, :n] = torch.randint(0, 4, (n,), generator=g)
    return draws, random_base


def mlm_mask(tokens: Tensor, valid: Tensor, mask_prob: float = 0.15, generator=None) -> tuple[Tensor, Tensor]:
    """BERT masking of A/C/G/T only: select ``mask_prob``; of those 80 % -> [MASK], 10 % random base, 10 % kept.

    ``generator``: None (the global RNG: training), a ``torch.Generator``, or `ExampleGenerators` (one per sequence,
    evaluation: each sequence's mask depends only on its generator and its tokens). Returns (inputs, targets) with
    targets = IGNORE_INDEX at unselected positions.
    """
    shape = tokens.shape
    if isinstance(generator, ExampleGenerators):
        draws, random_base = _per_sequence_draws(valid.cpu(), generator)
        draws, random_base = draws.to(tokens.device), random_base.to(tokens.device)
    else:
        draws = torch.rand((3, *shape), generator=generator).to(tokens.device)
        random_base = torch.randint(0, 4, shape, generator=generator).to(tokens.device)
    selected = (draws[0] < mask_prob) & (tokens < N_TOKEN) & valid
    inputs = torch.where(selected & (draws[1] < 0.8), torch.full_like(tokens, MASK_TOKEN), tokens)
    inputs = torch.where(selected & (draws[1] >= 0.8) & (draws[1] < 0.9), random_base, inputs)
    targets = torch.where(selected, tokens, torch.full_like(tokens, IGNORE_INDEX))
    return inputs, targets


# ============================================================================================ LightningModules
def _check_network_args(arch_layout, d_model, d_intermediate, target_compression, expand, headdim, boundaries,
                        ssd_chunk_size, attn_heads, attn_window, rotary_dim) -> None:
    check_arch_layout(arch_layout)
    if len(d_model) != 2 or d_model[1] < d_model[0] or min(d_model) < 1:
        raise UserInputError(f"d_model={d_model} must be [d_outer, d_backbone] with d_backbone >= d_outer >= 1.")
    if len(d_intermediate) != 2 or min(d_intermediate) < 0:
        raise UserInputError(f"d_intermediate={d_intermediate} must be two SwiGLU widths >= 0 (outer, backbone).")
    for d in d_model:
        if (expand * d) % headdim:
            raise UserInputError(f"expand * d_model = {expand} * {d} is not a multiple of headdim={headdim}.")
    check_range("target_compression", target_compression, 1, None, low_inclusive=False)
    if boundaries == "fixed" and float(target_compression) != int(target_compression):
        raise UserInputError(f"boundaries='fixed' needs an integer target_compression, got {target_compression}.")
    if boundaries not in ("learned", "fixed"):
        raise UserInputError(f"boundaries={boundaries!r}: use 'learned' or 'fixed'.")
    check_range("ssd_chunk_size", ssd_chunk_size, 1)
    check_range("attn_heads", attn_heads, 1)
    check_range("attn_window", attn_window, 0)
    if rotary_dim % 2 or rotary_dim < 0:
        raise UserInputError(f"rotary_dim={rotary_dim} must be even and >= 0.")


class _LDARNetBase(PaperModule):
    """Shared network construction, optimiser groups and checks of the two LDARNet modules."""

    def _build_network(self) -> None:
        hp = self.hparams
        _check_network_args(hp.arch_layout, hp.d_model, hp.d_intermediate, hp.target_compression, hp.expand,
                            hp.headdim, hp.boundaries, hp.ssd_chunk_size, hp.attn_heads, hp.attn_window,
                            hp.rotary_dim)
        check_range("ratio_loss_weight", hp.ratio_loss_weight, 0)
        check_range("outer_lr_multiplier", hp.outer_lr_multiplier, 0, low_inclusive=False)
        self.net = LDARNetNetwork(hp.arch_layout, list(hp.d_model), list(hp.d_intermediate), hp.d_state, hp.d_conv,
                                  hp.expand, hp.headdim, hp.ssd_chunk_size, hp.ssd_impl, hp.attn_heads,
                                  hp.attn_window, hp.rotary_dim, hp.target_compression, hp.boundaries)

    def _lr_multipliers(self) -> dict[str, float]:
        return {"net.main.": 1.0, "net.pad_dimension": 1.0, "": self.hparams.outer_lr_multiplier}

    def trainable_parameters(self):
        return param_groups(self, self._lr_multipliers())

    def configure_optimizers(self):
        """The injected optimiser over `param_groups`, each group's LR scaled by its multiplier *before* the
        scheduler is built (so the scheduler's base LRs are the scaled ones)."""
        optimizer = self.build_optimizer(self.trainable_parameters())
        for group in optimizer.param_groups:
            group["lr"] *= group.get("lr_multiplier", 1.0)
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.build_lr_scheduler(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @staticmethod
    def _check_batch(batch: dict) -> tuple[Tensor, Tensor]:
        tokens, valid = batch["tokens"], batch["mask"]
        if tokens.min() < 0 or tokens.max() >= VOCAB_SIZE:
            raise UserInputError(f"token ids must lie in [0, {VOCAB_SIZE}) (A C G T N [MASK] [PAD]); got "
                                 f"[{int(tokens.min())}, {int(tokens.max())}].")
        if not bool(valid[:, 0].all()):
            raise UserInputError("every sequence needs at least one base (and right padding): empty sequence found.")
        return tokens, valid


NETWORK_DOC = """arch_layout: [encoder, [backbone], decoder] layout strings (letters m/M/t/T + counts).
        d_model: [d_outer, d_backbone]. d_intermediate: SwiGLU widths [outer, backbone] (0 = no MLP).
        d_state, d_conv, expand, headdim, ssd_chunk_size, ssd_impl: Mamba-2 settings ('auto' uses mamba_ssm on CUDA).
        attn_heads, attn_window, rotary_dim: local attention (window on each side).
        target_compression: N of the ratio loss (and the grid of the fixed control).
        boundaries: 'learned' (router) or 'fixed' (every N bases). ratio_loss_weight: alpha (paper 0.03).
        outer_lr_multiplier: LR factor of everything outside the backbone (paper 3.0)."""


class LDARNetPretraining(_LDARNetBase):
    __doc__ = f"""Masked-language-model pretraining of LDARNet (see the module docstring).

    Args:
        {NETWORK_DOC}
        mask_prob: fraction of A/C/G/T positions selected (0.15). rc_prob: reverse-complement probability (0.5).
        val_mask_seed: seed of the fixed validation/test masking (with each sequence's index in its split).
    """

    def __init__(self, arch_layout: Layout = ("m3t1", ["M10"], "m4"), d_model: list[int] = (512, 768),
                 d_intermediate: list[int] = (0, 2560), d_state: int = 128, d_conv: int = 4, expand: int = 2,
                 headdim: int = 64, ssd_chunk_size: int = 256, ssd_impl: SSDImpl = "auto", attn_heads: int = 16,
                 attn_window: int = 1023, rotary_dim: int = 32, target_compression: float = 4.0,
                 boundaries: Boundaries = "learned", ratio_loss_weight: float = 0.03,
                 outer_lr_multiplier: float = 3.0, mask_prob: float = 0.15, rc_prob: float = 0.5,
                 val_mask_seed: int = 1234, **base) -> None:
        super().__init__(**base)
        self.save_hyperparameters()
        check_range("mask_prob", mask_prob, 0, 1, low_inclusive=False)
        check_range("rc_prob", rc_prob, 0, 1)
        self._build_network()
        self.lm_head = nn.Linear(d_model[0], VOCAB_SIZE)
        self._eval_rows: dict[str, list[tuple[Tensor, Tensor]]] = {"val": [], "test": []}

    def forward(self, tokens: Tensor, valid: Tensor) -> tuple[Tensor, dict]:
        hidden, aux = self.net(tokens, valid)
        return self.lm_head(hidden), aux

    def _step(self, batch: dict, stage: str, generator=None, index: Tensor | None = None) -> Tensor:
        tokens, valid = self._check_batch(batch)
        if stage == "train" and self.hparams.rc_prob > 0:
            tokens = random_reverse_complement(tokens, valid, self.hparams.rc_prob, generator)
        inputs, targets = mlm_mask(tokens, valid, self.hparams.mask_prob, generator)
        logits, aux = self(inputs, valid)
        selected = targets != IGNORE_INDEX
        if selected.any():
            mlm = F.cross_entropy(logits[selected].float(), targets[selected])
            accuracy = (logits[selected].argmax(-1) == targets[selected]).float().mean()
        else:  # no base drawn (tiny batch): a zero loss that still touches every parameter
            mlm, accuracy = logits.sum() * 0.0, logits.new_zeros(())
        loss = mlm + self.hparams.ratio_loss_weight * aux["ratio_loss"]
        if stage == "train":
            self.log_dict({"train/loss": loss, "train/mlm_loss": mlm, "train/mlm_accuracy": accuracy,
                           "train/ratio_loss": aux["ratio_loss"], "train/compression": aux["compression"],
                           "train/mean_prob": aux["mean_prob"]}, prog_bar=False, batch_size=tokens.shape[0])
        else:
            self._eval_rows[stage].append((index, self._sequence_sums(logits, targets, valid, aux)))
        return loss

    @staticmethod
    def _sequence_sums(logits: Tensor, targets: Tensor, valid: Tensor, aux: dict) -> Tensor:
        """Per sequence (B, 6) float64: MLM cross-entropy sum, masked tokens, correct predictions, valid tokens,
        boundaries, boundary-probability sum (the epoch's metrics are ratios of their totals)."""
        selected = targets != IGNORE_INDEX
        ce = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
        correct = (logits.argmax(-1) == targets) & selected
        return torch.stack([ce.double().sum(1), selected.sum(1).double(), correct.sum(1).double(),
                            valid.sum(1).double(), (aux["boundaries"] & valid).sum(1).double(),
                            (aux["p"].double() * valid).sum(1)], 1)

    def _evaluate(self, batch: dict, batch_idx: int, stage: str) -> None:
        """Mask each sequence from its own generator (``batch["index"]``). A hand-made batch without an index
        is masked from one generator seeded by ``val_mask_seed + batch_idx`` and counted as it comes."""
        if "index" in batch:
            index = batch["index"].reshape(-1)
            generator = ExampleGenerators(self.hparams.val_mask_seed, index, STREAM_EVAL_MASK)
        else:
            world, rank = (self.trainer.world_size, self.trainer.global_rank) if self._trainer is not None else (1, 0)
            seen = sum(len(i) for i, _ in self._eval_rows[stage])
            index = -1 - (seen + torch.arange(len(batch["tokens"]), device=self.device)) * world - rank  # unique, < 0
            generator = torch.Generator().manual_seed(self.hparams.val_mask_seed + batch_idx)
        self._step(batch, stage, generator, index)

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "test")

    def on_validation_epoch_start(self) -> None:
        self._eval_rows["val"] = []

    def on_test_epoch_start(self) -> None:
        self._eval_rows["test"] = []

    def epoch_metrics(self, stage: str) -> dict[str, float]:
        """The epoch's metrics from every rank's per-sequence sums, each sequence once (`gather_examples`)."""
        rows, self._eval_rows[stage] = self._eval_rows[stage], []
        index = torch.cat([i for i, _ in rows]) if rows else torch.zeros(0, dtype=torch.long, device=self.device)
        sums = torch.cat([r for _, r in rows]) if rows else torch.zeros(0, 6, dtype=torch.float64, device=self.device)
        _, sums = gather_examples(index, sums)
        ce, masked, correct, tokens, boundaries, prob = sums.sum(0).tolist()
        mlm, accuracy = (ce / masked, correct / masked) if masked > 0 else (0.0, 0.0)
        frac, mean_prob = (boundaries / tokens, prob / tokens) if tokens > 0 else (0.0, 0.0)
        n = float(self.hparams.target_compression)
        ratio = n / (n - 1) * ((n - 1) * frac * mean_prob + (1 - frac) * (1 - mean_prob)) \
            if self.hparams.boundaries == "learned" else 0.0  # the fixed control has no ratio loss
        return {f"{stage}/loss": mlm + self.hparams.ratio_loss_weight * ratio, f"{stage}/mlm_loss": mlm,
                f"{stage}/mlm_accuracy": accuracy, f"{stage}/ratio_loss": ratio, f"{stage}/compression": frac,
                f"{stage}/mean_prob": mean_prob}

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.epoch_metrics("val"), prog_bar=True, sync_dist=True)

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.epoch_metrics("test"), prog_bar=True, sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> Tensor:
        """LM logits (B, L, 7) of the unmasked input (deterministic)."""
        tokens, valid = self._check_batch(batch)
        return self(tokens, valid)[0]

    def prediction_fields(self, outputs, batch) -> dict:
        """The logits, and the most likely base at every valid position as a string (one JSONL line per
        sequence)."""
        bases = "ACGTN"
        letters = [[bases[i] if i < len(bases) else "?" for i in row] for row in outputs.argmax(-1).tolist()]
        lengths = batch["mask"].sum(1).tolist()
        return {"predicted_bases": ["".join(row[:n]) for row, n in zip(letters, lengths)], "logits": outputs}


class LDARNetClassifier(_LDARNetBase):
    __doc__ = f"""Sequence classification with LDARNet: mean pooling over valid positions -> Linear.

    Args:
        num_classes: classes of the task (checked against the datamodule).
        {NETWORK_DOC}
        head_lr_multiplier: LR factor of the classification head (authors' eval script: 1.0).
        ratio_loss_weight: the ratio loss stays on during fine-tuning (the official code keeps it; 0 disables).
    """

    def __init__(self, num_classes: int = 2, arch_layout: Layout = ("m3t1", ["M10"], "m4"),
                 d_model: list[int] = (512, 768), d_intermediate: list[int] = (0, 2560), d_state: int = 128,
                 d_conv: int = 4, expand: int = 2, headdim: int = 64, ssd_chunk_size: int = 256,
                 ssd_impl: SSDImpl = "auto", attn_heads: int = 16, attn_window: int = 1023, rotary_dim: int = 32,
                 target_compression: float = 4.0, boundaries: Boundaries = "learned",
                 ratio_loss_weight: float = 0.03, outer_lr_multiplier: float = 1.0, head_lr_multiplier: float = 1.0,
                 **base) -> None:
        super().__init__(**base)
        self.save_hyperparameters()
        check_range("num_classes", num_classes, 2)
        check_range("head_lr_multiplier", head_lr_multiplier, 0, low_inclusive=False)
        self._build_network()
        self.head = nn.Linear(d_model[0], num_classes)
        self.metrics = nn.ModuleDict()
        for stage in ("val", "test"):
            self.metrics[f"{stage}_mcc"] = MulticlassMatthewsCorrCoef(num_classes=num_classes)
            self.metrics[f"{stage}_acc"] = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def _lr_multipliers(self) -> dict[str, float]:
        return {"head.": self.hparams.head_lr_multiplier, **super()._lr_multipliers()}

    def setup(self, stage: str) -> None:
        self.check_data_matches(LabelledSequenceData, {"num_classes": self.hparams.num_classes},
                                "model num_classes={model} but the data has {data} classes: set "
                                "--model.init_args.num_classes={data}.")
        super().setup(stage)

    def forward(self, tokens: Tensor, valid: Tensor) -> tuple[Tensor, dict]:
        hidden, aux = self.net(tokens, valid)
        weights = valid.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        return self.head(pooled), aux

    def _step(self, batch: dict, stage: str) -> Tensor:
        tokens, valid = self._check_batch(batch)
        labels = batch["label"]
        logits, aux = self(tokens, valid)
        ce = F.cross_entropy(logits.float(), labels)
        loss = ce + self.hparams.ratio_loss_weight * aux["ratio_loss"]
        size = tokens.shape[0]
        logs = {f"{stage}/loss": loss, f"{stage}/ce": ce, f"{stage}/compression": aux["compression"]}
        self.log_dict(logs, prog_bar=stage != "train", batch_size=size, sync_dist=stage != "train")
        if stage != "train":
            for name in ("mcc", "acc"):
                metric = self.metrics[f"{stage}_{name}"]
                metric.update(logits.argmax(-1), labels)
                self.log(f"{stage}/{name}", metric, prog_bar=True, batch_size=size)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> Tensor:
        """Class probabilities (B, num_classes)."""
        tokens, valid = self._check_batch(batch)
        return self(tokens, valid)[0].softmax(-1)

    def prediction_fields(self, outputs, batch) -> dict:
        """Class probabilities, written as one CSV row per sequence with the predicted class."""
        return {"probs": outputs}
