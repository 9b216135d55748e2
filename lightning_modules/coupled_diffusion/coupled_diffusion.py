"""Coupled diffusion of signals and logits: joint enhancement and classification of corrupted images.

Paper: "Joint Enhancement and Classification using Coupled Diffusion Models of Signals and Logits", Nurko, Benita,
Dissen, Nakatani, Delcroix, Araki, Keshet, arXiv 2602.15405 (2026); official code github.com/gilad-nurko/
coupled-diffusion (images/). The paper's method sections were not readable here: this module follows the
official code, and what is reconstructed is listed under "Deviations" below.

Method
------
A frozen pretrained classifier f maps images to logits. Two DDPMs (epsilon prediction, one shared schedule,
cosine by default, T = 150 in the code) are coupled:

* the signal enhancer eps_x(x_t, t, x_c, y_cond) denoises the clean image x given the corrupted input x_c
  and a logit condition y_cond (a conditional enhancer, not purification);
* the logit denoiser eps_y(y_t, t, y_cond, phi(image)) denoises the clean-image logits f(x) given the
  classifier's logits of an image (y_cond) and learned features phi of that same image.

Every logit used as a condition is standardised per sample (`standardize_logits`):
``y <- 0.8 * (y - mean(y)) / (std(y) + 1e-5)`` (the code's LOGITS_MEAN = 0, LOGITS_STD = 0.8).

Coupling strategies (``strategy`` trains, ``sampling_strategy`` samples; by default the same; each one is a pair of
plain functions in `lightning_modules.coupled_diffusion.coupling_strategies` over this module's primitives eps_x, eps_y,
x_loss, y_loss, x_chain, y_chain):

* ``parallel`` (the code's "interleaved scheduler"). Training, per batch: y0 := 0, then
  ``coupling_iterations`` times with a fresh t ~ U{0..T-1}: an x loss conditioned on (x_c, std(y0)) gives x0_hat;
  the classifier input is x0_hat where t < switch_fraction * T and x_c otherwise; y_cond = std(f(input)); a y loss on
  y_t = q(f(x) | t) conditioned on (y_cond, input) gives y0_hat, the next y0 (detached). Loss
  ``x_loss_weight * MSE_x + y_loss_weight * MSE_y`` (0.9 / 0.1). Sampling, for each step t = T-1..0: the y step
  conditions on (std(f(x0_hat)), x0_hat) from the previous x step once t < switch_fraction * T, else on
  (std(f(x_c)), x_c); then the x step conditions on (x_c, std(y0_hat)) of this y step.
* ``alternating`` (the code's "block scheduler"). Sampling: y0 = 0, then ``alternating_iterations`` rounds of
  x0 = full x chain(x_c, std(y0)); y0 = full y chain(std(f(x0)), x0).
* ``nested`` (the code's "hierarchical scheduler"). Sampling: x0 = full x chain(x_c, 0), y_cond = std(f(x0));
  one y chain in which, at the steps whose number of remaining steps r satisfies r <= nested_refresh_from and
  r % nested_refresh_every == 0 (the code: (t + 1) <= 50 and (t + 1) % 20 == 0 with t the timestep; equal when
  sampling_steps = T), a new full x chain conditioned on the current std(y0_hat) refreshes x0, y_cond and the image
  condition. Training: t walks down T..0 in blocks of ``nested_block_size`` (t uniform inside a block); each block
  does one x loss (conditioned on the current std(y0)) and one y loss conditioned on (std(f(x0_hat)), x0_hat) of
  that x step, and y0 <- y0_hat.
* ``enhanced`` (the sequential baseline, "enhance then classify"): only eps_x is built and trained, with
  y_cond = 0; sampling runs the x chain and classifies the enhanced image with f.

Outputs of sampling: the prediction is the argmax of the final y (for ``enhanced``: of f(x0)); the accuracy of
f on the enhanced image x0 is reported too (``acc_f_enhanced``).

Frozen classifier and ``init_from``
-----------------------------------
The classifier is a `lightning_modules.shared.classifier.build_backbone` network whose architecture is given by
``classifier_backbone``, ``num_classes``, ``in_channels``, ``image_size``, ``classifier_hidden_dim``,
``classifier_depth`` and ``classifier_cifar_stem`` (the `ImageClassifier` init args with a prefix). Its
weights come from ``init_from``, which therefore accepts two kinds of checkpoint (told apart by their keys):

* an `ImageClassifier` checkpoint (keys ``net.*``; e.g. from ``configs/coupled_diffusion/classifier_quick.yaml``):
  the pretrained classifier, loaded strictly into ``classifier`` (its saved hyper-parameters must match the
  architecture args, and its data's ``dataset`` must match); the denoisers start fresh. This is what the
  config harness passes (``# prerequisite:``), and how a coupled run starts.
* a `CoupledDiffusion` checkpoint (keys ``classifier.*`` ...): fine-tuning with a new config, weights copied by
  name and shape as in `PaperModule`.

The classifier is ``requires_grad_(False)`` and always in eval mode (``train()`` keeps it there), so it is never
updated and its BatchNorm statistics never move. Fitting without a classifier checkpoint is an error (a random
frozen classifier makes the method meaningless). Its input normalisation is fixed: images in the diffusion range
[-1, 1] are mapped to [0, 1] (`from_model_range`) and normalised with the training-split ``mean``/``std`` of the
datamodule (`CorruptedImageDataModule` computes them exactly as `ImageClassificationDataModule` for the same
``seed``/``val_fraction``), copied into buffers at ``setup("fit")`` and saved in the checkpoint.

Evaluation protocol
-------------------
On the held-out split with a fixed corruption per example: accuracy of f(x_c) (``acc_corrupted``), of the chosen
sampler's prediction (``acc``) and of f on its enhanced image (``acc_f_enhanced``). ``predict_step`` returns the
sampler's outputs. In validation, test and predict each example's noise (the evaluation losses' timesteps and
noise, the samplers' initial noise) comes from generators of its own, seeded by (``sample_seed``, the example's
index in its split: the fourth entry of `CorruptedImageDataModule` batches;
`lightning_modules.shared.example_rng.ExampleGenerators`), so it is deterministic and the same with any number of
processes (batches without an index fall back to a generator seeded by (``sample_seed``, batch index)).

Deviations from the paper / code (all configurable where a choice exists)
------------------------------------------------------------------------
* Networks: the collection's `MLPDenoiser` / `UNet` instead of the code's ShuffleNetV2-block UNet (three encoders)
  and the 1024-wide MLP U-Net with cross-attention. eps_x sees x_c by channel concatenation (UNet) or as part of
  the condition vector (MLP) and y_cond through the condition embedding; eps_y gets [y_cond, phi(image)] through
  its condition embedding (no cross-attention). phi is a trainable `build_backbone` network (``feature_encoder``:
  ``mlp``/``cnn``/a timm name such as ``resnet18`` with the CIFAR stem, as the code's ResNet-18).
* One schedule for both chains and both phases (the code pre-trains the logit model with linear betas and then
  couples with a cosine schedule) and no separate logit-model pre-training stage.
* Sampling is DDIM with eta = 0 (diffusers ``DDIMScheduler``, trailing spacing, x0_hat clamped to [-1, 1] for
  images, not for logits) with ``sampling_steps`` dividing T. The code's ``is_ddim=True`` is a deterministic
  DDPM posterior mean with a wrong alpha for skipped steps; the switch point compares timesteps (t < 0.5 T),
  never step counts with timesteps.
* ``prediction_type``: epsilon prediction as in the code by default; ``v_prediction`` is offered because with
  epsilon the clean estimate of the first, almost pure-noise steps (alpha_bar ~ 0 at t = T - 1 of the cosine
  schedule) is ill-conditioned: on digits (1000 steps, MLP) x0_hat at t = T - 1 had MSE 1.36 with epsilon and 0.15
  with v, and Enhanced samples were classified 51% vs 69% correctly. The CPU experiment uses v for every arm.
* ``logit_target``: the code diffuses the raw clean-image logits f(x) (``raw``); the default here diffuses their
  standardisation (``standardized``) so that the logit chain has unit-scale data for any classifier. The
  prediction (an argmax) is the same function of either.
* Parallel training sums the ``coupling_iterations`` inner losses into ONE optimiser step per batch (the code
  steps the optimiser after each inner iteration).
* Alternating training (the code: 10 x-only epochs, then per batch full chains of the EMA model and 5 x 30 steps
  with frozen conditions; 6 full chains per batch) is reduced to: per batch, ``alternating_iterations`` rounds,
  each one x loss conditioned on the round's std(y0) (0 in round one) and one y loss conditioned on (std(f(x0)),
  x0), where x0 / y0 come from no-grad chains of ``condition_sampling_steps`` DDIM steps run with the CURRENT
  weights (the EMA weights live in a callback the module cannot see).
* x0_hat is detached before it enters the classifier and the logit branch (the code does not say; with a
  frozen f the gradient would only couple the two losses through f).
* Corruptions act in the [-1, 1] range and are clamped to it (see `datamodules.corrupted_images`).
* The code's EMA (every 10 steps, rescaled decay) is replaced by `callbacks.ema.EMAWeights` in the configs.
"""
from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn.functional as F
import torchmetrics
from diffusers import DDIMScheduler, DDPMScheduler
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule, read_checkpoint
from lightning_modules.shared.classifier import build_backbone
from lightning_modules.coupled_diffusion.coupling_strategies import SAMPLERS, STRATEGIES, TRAINING_LOSSES, noise_like
from lightning_modules.shared.data_contract import PixelStatisticsData
from lightning_modules.shared.denoisers import MLPDenoiser, UNet, from_model_range, to_model_range
from lightning_modules.shared.errors import UserInputError, check_range, one_line
from lightning_modules.shared.example_rng import ExampleGenerators

log = logging.getLogger(__name__)

LOGIT_SCALE = 0.8     # the code's LOGITS_STD ("based on stats of our classifier logits"); LOGITS_MEAN = 0
LOGIT_EPS = 1e-5
# (this module's arg, the ImageClassifier hyper-parameter it must equal)
CLASSIFIER_ARGS = (("classifier_backbone", "backbone"), ("num_classes", "num_classes"),
                   ("in_channels", "in_channels"), ("image_size", "image_size"),
                   ("classifier_hidden_dim", "hidden_dim"), ("classifier_depth", "depth"),
                   ("classifier_cifar_stem", "cifar_stem"))


# ================================================================================ logit standardisation
def logit_statistics(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample mean and (unbiased, torch's default) std over the class dimension, shaped [..., 1]."""
    return logits.mean(-1, keepdim=True), logits.std(-1, keepdim=True)


def standardize_logits(logits: Tensor, scale: float = LOGIT_SCALE, eps: float = LOGIT_EPS) -> Tensor:
    """``scale * (y - mean(y)) / (std(y) + eps)`` per sample (the code's logit normalisation)."""
    mean, std = logit_statistics(logits)
    return scale * (logits - mean) / (std + eps)


class CoupledDiffusion(PaperModule):
    """Coupled signal/logit diffusion around a frozen classifier (see the module docstring).

    Args:
        strategy: training strategy, one of parallel / alternating / nested / enhanced.
        sampling_strategy: strategy used by validation/test/predict sampling (None: ``strategy``).
        classifier_backbone, num_classes, in_channels, image_size, classifier_hidden_dim, classifier_depth,
            classifier_cifar_stem: the frozen classifier's architecture (= the `ImageClassifier` args).
        signal_denoiser: "mlp" (flattened images) or "unet" for eps_x; signal_hidden_dim / signal_depth (MLP),
            unet_base_channels / unet_channel_mults (UNet).
        logit_hidden_dim / logit_depth: the eps_y MLP.
        feature_encoder / feature_dim / feature_hidden_dim / feature_cifar_stem: phi, the image features of eps_y
            (a `build_backbone` network: "mlp", "cnn" or a timm name, e.g. resnet18 with the CIFAR stem).
        time_dim: sinusoidal time-embedding size of both denoisers.
        num_train_timesteps: T. beta_schedule: "squaredcos_cap_v2" (cosine, the code) or "linear".
        prediction_type: what both networks predict, "epsilon" (the code) or "v_prediction" (v = sqrt(a) eps -
            sqrt(1 - a) x0; the clean estimate stays well conditioned at the last, almost pure-noise steps).
        sampling_steps: DDIM steps of every sampled chain (must divide T).
        condition_sampling_steps: DDIM steps of the no-grad chains of alternating training (must divide T).
        logit_scale: the standardisation scale (0.8). logit_target: "standardized" or "raw" (the code).
        coupling_iterations: inner iterations per batch of parallel training (5).
        x_loss_weight / y_loss_weight: loss weights (0.9 / 0.1 in the code's parallel training).
        switch_fraction: the y branch looks at x0_hat instead of x_c once t < switch_fraction * T (0.5).
        alternating_iterations: rounds of alternating sampling and training.
        nested_block_size / nested_refresh_every / nested_refresh_from: nested training blocks and the
            refresh rule of nested sampling (20 / 20 / 50 in the code).
        validate_sampling: also run the sampler in validation/test (accuracies); off: losses only.
        sample_seed: seeds the initial noise of sampling in validation/test/predict.
        optimizer / lr_scheduler / init_from / init_from_trusted: see `PaperModule`; ``init_from`` is the frozen
            classifier's `ImageClassifier` checkpoint (or a CoupledDiffusion checkpoint to fine-tune).

    The arguments stay flat on purpose: each is one CLI key (``--model.init_args.sampling_steps``) that the configs,
    sweeps and experiments override, and one entry of the checkpoints' saved hyper-parameters; grouping them would
    rename every key and break loading the checkpoints already written.
    """

    def __init__(
        self,
        strategy: Literal["parallel", "alternating", "nested", "enhanced"] = "parallel",
        sampling_strategy: Literal["parallel", "alternating", "nested", "enhanced"] | None = None,
        classifier_backbone: str = "mlp",
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        classifier_hidden_dim: int = 128,
        classifier_depth: int = 1,
        classifier_cifar_stem: bool = False,
        signal_denoiser: Literal["mlp", "unet"] = "mlp",
        signal_hidden_dim: int = 256,
        signal_depth: int = 3,
        unet_base_channels: int = 32,
        unet_channel_mults: tuple[int, ...] = (1, 2),
        logit_hidden_dim: int = 256,
        logit_depth: int = 3,
        feature_encoder: str = "mlp",
        feature_dim: int = 64,
        feature_hidden_dim: int = 128,
        feature_cifar_stem: bool = False,
        time_dim: int = 64,
        num_train_timesteps: int = 150,
        beta_schedule: Literal["squaredcos_cap_v2", "linear"] = "squaredcos_cap_v2",
        prediction_type: Literal["epsilon", "v_prediction"] = "epsilon",
        sampling_steps: int = 50,
        condition_sampling_steps: int = 10,
        logit_scale: float = LOGIT_SCALE,
        logit_target: Literal["standardized", "raw"] = "standardized",
        coupling_iterations: int = 5,
        x_loss_weight: float = 0.9,
        y_loss_weight: float = 0.1,
        switch_fraction: float = 0.5,
        alternating_iterations: int = 2,
        nested_block_size: int = 20,
        nested_refresh_every: int = 20,
        nested_refresh_from: int = 50,
        validate_sampling: bool = True,
        sample_seed: int = 0,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        init_from: str | None = None,
        init_from_trusted: bool = False,
    ) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        for name, value in (("strategy", strategy), ("sampling_strategy", sampling_strategy or strategy)):
            if value not in STRATEGIES:
                raise UserInputError(f"{name}={value!r} is unknown: choose one of {', '.join(STRATEGIES)}.")
        if signal_denoiser not in ("mlp", "unet"):
            raise UserInputError(f"signal_denoiser={signal_denoiser!r} is unknown: choose 'mlp' or 'unet'.")
        if logit_target not in ("standardized", "raw"):
            raise UserInputError(f"logit_target={logit_target!r} is unknown: choose 'standardized' or 'raw'.")
        if prediction_type not in ("epsilon", "v_prediction"):
            raise UserInputError(f"prediction_type={prediction_type!r} is unknown: choose 'epsilon' (the official "
                                 "code) or 'v_prediction'.")
        if beta_schedule not in ("squaredcos_cap_v2", "linear"):
            raise UserInputError(f"beta_schedule={beta_schedule!r} is unknown: choose 'squaredcos_cap_v2' "
                                 "(cosine, the official code) or 'linear'.")
        integers = (("num_classes", num_classes, 2), ("in_channels", in_channels, 1), ("image_size", image_size, 1),
                    ("num_train_timesteps", num_train_timesteps, 2), ("sampling_steps", sampling_steps, 1),
                    ("condition_sampling_steps", condition_sampling_steps, 1),
                    ("coupling_iterations", coupling_iterations, 1),
                    ("alternating_iterations", alternating_iterations, 1), ("nested_block_size", nested_block_size, 1),
                    ("nested_refresh_every", nested_refresh_every, 1), ("nested_refresh_from", nested_refresh_from, 0),
                    ("feature_dim", feature_dim, 1), ("time_dim", time_dim, 2), ("sample_seed", sample_seed, 0))
        for name, value, low in integers:
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserInputError(f"{name}={value!r} must be an integer.")
            check_range(name, value, low)
        for name, steps in (("sampling_steps", sampling_steps), ("condition_sampling_steps", condition_sampling_steps)):
            if steps > num_train_timesteps or num_train_timesteps % steps:
                raise UserInputError(f"{name}={steps} must divide num_train_timesteps={num_train_timesteps} (DDIM "
                                     "steps of T // steps timesteps each; other counts would skip unevenly). "
                                     f"Pick a divisor of {num_train_timesteps}.")
        check_range("nested_block_size", nested_block_size, 1, num_train_timesteps)
        check_range("logit_scale", logit_scale, 0.0, low_inclusive=False)
        check_range("x_loss_weight", x_loss_weight, 0.0)
        check_range("y_loss_weight", y_loss_weight, 0.0)
        check_range("switch_fraction", switch_fraction, 0.0, 1.0)
        if strategy != "enhanced" and y_loss_weight == 0:
            raise UserInputError(f"strategy={strategy!r} trains the logit denoiser, but y_loss_weight=0 leaves it "
                                 "without a gradient. Set y_loss_weight > 0 (the code: 0.1), or strategy: enhanced.")
        if x_loss_weight == 0:
            raise UserInputError("x_loss_weight=0 leaves the signal enhancer untrained; set it > 0 (the code: 0.9).")
        if time_dim % 2:
            raise UserInputError(f"time_dim={time_dim} must be even (cos/sin pairs).")
        if (sampling_strategy or strategy) != "enhanced" and strategy == "enhanced":
            raise UserInputError(f"sampling_strategy={sampling_strategy!r} needs the logit denoiser, which "
                                 "strategy='enhanced' does not build. Use sampling_strategy: enhanced (or null).")
        self.save_hyperparameters()
        self.strategy, self.sampling_strategy = strategy, sampling_strategy or strategy

        # ---- frozen classifier f (weights from init_from) and its fixed input normalisation
        self.classifier = build_backbone(classifier_backbone, num_classes, in_channels, image_size,
                                         classifier_hidden_dim, classifier_depth, classifier_cifar_stem)
        self.classifier.requires_grad_(False)
        self.classifier.eval()
        self.register_buffer("pixel_mean", torch.full((in_channels,), 0.5))
        self.register_buffer("pixel_std", torch.full((in_channels,), 0.5))
        self.classifier_loaded = False

        # ---- eps_x(x_t, t, x_c, y_cond)
        data_dim = in_channels * image_size * image_size
        if signal_denoiser == "mlp":
            self.signal_net = MLPDenoiser(data_dim, signal_hidden_dim, signal_depth, cond_dim=data_dim + num_classes,
                                          time_dim=time_dim)
        else:
            factor = 2 ** (len(unet_channel_mults) - 1)
            if image_size % factor:
                raise UserInputError(f"image_size={image_size} must be divisible by {factor} for a UNet with "
                                     f"channel_mults={list(unet_channel_mults)}; use fewer levels.")
            self.signal_net = UNet(2 * in_channels, in_channels, unet_base_channels, tuple(unet_channel_mults),
                                   cond_dim=num_classes, time_dim=time_dim)
        # ---- eps_y(y_t, t, y_cond, phi(image)); not built for the enhance-then-classify baseline
        if strategy == "enhanced":
            self.feature_net, self.logit_net = None, None
        else:
            self.feature_net = build_backbone(feature_encoder, feature_dim, in_channels, image_size, feature_hidden_dim,
                                              1, feature_cifar_stem)
            self.logit_net = MLPDenoiser(num_classes, logit_hidden_dim, logit_depth,
                                         cond_dim=num_classes + feature_dim, time_dim=time_dim)

        # ---- one schedule (diffusers): training noise, sampling chains with and without x0 clamping
        schedule = dict(num_train_timesteps=num_train_timesteps, beta_schedule=beta_schedule,
                        prediction_type=prediction_type)
        self.noise_scheduler = DDPMScheduler(clip_sample=False, **schedule)
        self.register_buffer("alphas_cumprod", self.noise_scheduler.alphas_cumprod.clone().float(), persistent=False)
        sampler = dict(set_alpha_to_one=True, timestep_spacing="trailing", **schedule)
        self.image_sampler = DDIMScheduler(clip_sample=True, clip_sample_range=1.0, **sampler)
        self.logit_sampler = DDIMScheduler(clip_sample=False, **sampler)

        self.metrics = nn.ModuleDict({
            f"{stage}_{name}": torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")
            for stage in ("val", "test") for name in ("acc", "acc_f_enhanced", "acc_corrupted")})
        # evaluation losses as summed (loss x batch size, batch size) states: Lightning's own sync_dist mean truncates
        # its integer example count when averaging it over gloo ranks, which is off whenever the total is odd
        self.metrics.update({f"{stage}_{name}": torchmetrics.MeanMetric() for stage in ("val", "test")
                             for name in ("loss", "x_loss", "y_loss")})

    # ================================================================================== frozen classifier
    def train(self, mode: bool = True):
        super().train(mode)
        self.classifier.eval()  # frozen: BatchNorm/Dropout always in inference mode
        return self

    def classify(self, images: Tensor) -> Tensor:
        """Logits of the frozen classifier for [-1, 1] images (fixed transform to its normalised inputs)."""
        pixels = from_model_range(images)
        normalised = (pixels - self.pixel_mean.view(-1, 1, 1)) / self.pixel_std.view(-1, 1, 1)
        with torch.no_grad():
            return self.classifier(normalised)

    def standardize(self, logits: Tensor) -> Tensor:
        return standardize_logits(logits, self.hparams.logit_scale)

    def setup(self, stage: str) -> None:
        sizes = {name: self.hparams[name] for name in ("num_classes", "in_channels", "image_size")}
        self.check_data_matches(PixelStatisticsData, sizes, "model.{name}={model} but the data has {name}={data}: set "
                                                            "model.init_args.{name}: {data}.")
        mean = self.data(PixelStatisticsData).mean
        if stage == "fit" and mean is not None:
            self.set_pixel_statistics(mean, self.data(PixelStatisticsData).std)
        super().setup(stage)  # init_from: the classifier checkpoint
        resuming = bool(self.checkpoint_being_restored())
        if stage == "fit" and not self.classifier_loaded and not resuming:
            raise UserInputError(
                "coupled diffusion needs a pretrained frozen classifier, but none was loaded: set "
                "model.init_args.init_from to an ImageClassifier checkpoint (e.g. the last.ckpt of "
                "`python train.py fit --config configs/coupled_diffusion/classifier_quick.yaml`).")

    def set_pixel_statistics(self, mean: Tensor, std: Tensor) -> None:
        """The classifier's input normalisation (per-channel mean/std of [0, 1] training pixels)."""
        if mean.numel() != self.hparams.in_channels or std.numel() != self.hparams.in_channels:
            raise UserInputError(f"pixel statistics have {mean.numel()} channels, the model "
                                 f"{self.hparams.in_channels}.")
        self.pixel_mean.copy_(mean.reshape(-1))
        self.pixel_std.copy_(std.reshape(-1))

    def load_initial_weights(self) -> dict[str, list[str]]:
        """``init_from``: an ImageClassifier checkpoint -> the frozen classifier; a CoupledDiffusion one -> all."""
        payload = read_checkpoint(self.init_from, trusted=self.init_from_trusted, what="init_from")
        state = payload["state_dict"]
        if any(key.startswith("classifier.") for key in state):  # a coupled-diffusion checkpoint: fine-tune
            self.classifier_loaded = True
            return super().load_initial_weights()
        if not state or not all(key.startswith("net.") for key in state):
            raise UserInputError(f"init_from '{self.init_from}' is neither an ImageClassifier checkpoint (keys net.*) "
                                 f"nor a CoupledDiffusion checkpoint (keys classifier.*); first keys: "
                                 f"{sorted(state)[:5]}.")
        self._check_classifier_checkpoint(payload)
        report = self.load_classifier_state({key[len("net."):]: value for key, value in state.items()})
        self.init_from_report = report
        log.info("init_from %s: loaded the frozen classifier (%d tensors)", self.init_from, len(report["loaded"]))
        return report

    def _check_classifier_checkpoint(self, payload: dict) -> None:
        saved = payload.get("hyper_parameters") or {}
        wrong = [f"{own}: {saved[theirs]!r} (configured {self.hparams[own]!r})" for own, theirs in CLASSIFIER_ARGS
                 if theirs in saved and saved[theirs] != self.hparams[own]]
        if wrong:
            raise UserInputError(f"init_from '{self.init_from}' holds a classifier of another architecture; set "
                                 f"model.init_args.{'; '.join(wrong)}.")
        data_saved = payload.get("datamodule_hyper_parameters") or {}
        datamodule = self.attached_datamodule
        data_now = datamodule.hparams if datamodule is not None else {}
        if "dataset" in data_saved and "dataset" in data_now and data_saved["dataset"] != data_now["dataset"]:
            raise UserInputError(f"the classifier in '{self.init_from}' was trained on dataset "
                                 f"{data_saved['dataset']!r}, but the data is {data_now['dataset']!r}.")
        for key in ("seed", "val_fraction"):
            if key in data_saved and key in data_now and data_saved[key] != data_now[key]:
                log.warning("the classifier was trained with data %s=%r, the coupled run uses %r: its input "
                            "normalisation statistics (training split) differ slightly.", key, data_saved[key],
                            data_now[key])

    def load_classifier_state(self, state: dict[str, Tensor]) -> dict[str, list[str]]:
        """Strictly load a classifier ``state_dict`` (keys of the bare backbone) into the frozen classifier."""
        try:
            self.classifier.load_state_dict(state, strict=True)
        except RuntimeError as err:
            raise UserInputError(f"the classifier weights do not fit the configured classifier architecture "
                                 f"({one_line(err)}). Match classifier_backbone / "
                                 "classifier_hidden_dim / classifier_depth / num_classes to the checkpoint.") from None
        self.classifier.requires_grad_(False)
        self.classifier_loaded = True
        own = list(self.state_dict())
        loaded = [f"classifier.{key}" for key in state]
        return {"loaded": loaded, "shape_mismatch": [], "not_in_model": [],
                "not_in_checkpoint": [key for key in own if key not in set(loaded)]}

    # ============================================================================================ networks
    def eps_x(self, x_t: Tensor, t: Tensor, corrupted: Tensor, y_cond: Tensor) -> Tensor:
        """Signal enhancer: noise prediction for [-1, 1] images x_t given x_c and standardised logits."""
        if self.hparams.signal_denoiser == "mlp":
            cond = torch.cat([corrupted.flatten(1), y_cond], dim=1)
            return self.signal_net(x_t.flatten(1), t, cond).view_as(x_t)
        return self.signal_net(torch.cat([x_t, corrupted], dim=1), t, y_cond)

    def eps_y(self, y_t: Tensor, t: Tensor, y_cond: Tensor, image: Tensor) -> Tensor:
        """Logit denoiser: noise prediction for logits y_t given standardised logits and an image."""
        if self.logit_net is None:
            raise UserInputError("this model was trained with strategy='enhanced' and has no logit denoiser: "
                                 "sample it with strategy 'enhanced'.")
        return self.logit_net(y_t, t, torch.cat([y_cond, self.feature_net(image)], dim=1))

    def logit_target(self, clean: Tensor) -> Tensor:
        logits = self.classify(clean)
        return self.standardize(logits) if self.hparams.logit_target == "standardized" else logits

    # ============================================================================================== losses
    def _x0_hat(self, x_t: Tensor, prediction: Tensor, t: Tensor) -> Tensor:
        """The clean estimate from a network output (epsilon or v, as the diffusers schedulers compute it)."""
        alpha = self.alphas_cumprod[t].view(-1, *([1] * (x_t.dim() - 1)))
        if self.hparams.prediction_type == "v_prediction":
            return alpha.sqrt() * x_t - (1 - alpha).sqrt() * prediction
        return (x_t - (1 - alpha).sqrt() * prediction) / alpha.sqrt()

    def _target(self, clean: Tensor, noise: Tensor, t: Tensor) -> Tensor:
        if self.hparams.prediction_type == "v_prediction":
            return self.noise_scheduler.get_velocity(clean, noise, t)
        return noise

    def x_loss(self, clean: Tensor, corrupted: Tensor, y_cond: Tensor, t: Tensor,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(MSE of eps_x, clamped x0_hat detached) at timesteps t."""
        noise = noise_like(clean.shape, clean, generator)
        x_t = self.noise_scheduler.add_noise(clean, noise, t)
        out = self.eps_x(x_t, t, corrupted, y_cond)
        return F.mse_loss(out, self._target(clean, noise, t)), self._x0_hat(x_t, out, t).detach().clamp(-1.0, 1.0)

    def y_loss(self, target: Tensor, y_cond: Tensor, image: Tensor, t: Tensor,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(MSE of eps_y, y0_hat detached) at timesteps t."""
        noise = noise_like(target.shape, target, generator)
        y_t = self.noise_scheduler.add_noise(target, noise, t)
        out = self.eps_y(y_t, t, y_cond, image)
        return F.mse_loss(out, self._target(target, noise, t)), self._x0_hat(y_t, out, t).detach()

    def losses(self, clean: Tensor, corrupted: Tensor, strategy: str | None = None,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(x loss, y loss) of one batch under a training strategy ([-1, 1] images)."""
        strategy = strategy or self.strategy
        if strategy not in TRAINING_LOSSES:
            raise UserInputError(f"strategy={strategy!r} is unknown: choose one of {', '.join(STRATEGIES)}.")
        return TRAINING_LOSSES[strategy](self, clean, corrupted, generator)

    # ============================================================================================ samplers
    def sampling_timesteps(self, sampler: DDIMScheduler, steps: int | None = None) -> Tensor:
        """Set ``sampler`` to ``steps`` DDIM steps (default ``sampling_steps``) and return its timesteps."""
        sampler.set_timesteps(steps or self.hparams.sampling_steps)
        return sampler.timesteps

    def x_chain(self, corrupted: Tensor, y_cond: Tensor, generator: torch.Generator | None = None,
                steps: int | None = None) -> Tensor:
        """A full DDIM chain of the enhancer with fixed conditions; returns x0 in [-1, 1]."""
        x = noise_like(corrupted.shape, corrupted, generator)
        for t in self.sampling_timesteps(self.image_sampler, steps):
            t_batch = torch.full((x.shape[0],), int(t), device=x.device, dtype=torch.long)
            x = self.image_sampler.step(self.eps_x(x, t_batch, corrupted, y_cond), int(t), x).prev_sample
        return x.clamp(-1.0, 1.0)

    def y_chain(self, y_cond: Tensor, image: Tensor, generator: torch.Generator | None = None,
                steps: int | None = None) -> Tensor:
        """A full DDIM chain of the logit denoiser with fixed conditions; returns y0 (target space)."""
        y = noise_like(y_cond.shape, y_cond, generator)
        for t in self.sampling_timesteps(self.logit_sampler, steps):
            t_batch = torch.full((y.shape[0],), int(t), device=y.device, dtype=torch.long)
            y = self.logit_sampler.step(self.eps_y(y, t_batch, y_cond, image), int(t), y).prev_sample
        return y

    @torch.no_grad()
    def sample(self, corrupted: Tensor, strategy: str | None = None,
               generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Run a coupling strategy on [-1, 1] corrupted images.

        Returns ``logits`` (the prediction's scores: final y, or f(x0) for enhanced), ``images`` (the enhanced
        x0 in [-1, 1]) and ``classifier_logits`` (f(x0)).
        """
        strategy = strategy or self.sampling_strategy
        if strategy not in STRATEGIES:
            raise UserInputError(f"strategy={strategy!r} is unknown: choose one of {', '.join(STRATEGIES)}.")
        return SAMPLERS[strategy](self, corrupted, generator)

    # =========================================================================================== lightning
    @staticmethod
    def _unpack(batch) -> tuple[Tensor | None, Tensor, Tensor | None]:
        """(clean, corrupted, labels) as [-1, 1] images from a datamodule batch (clean/labels may be absent)."""
        if isinstance(batch, Tensor):
            return None, to_model_range(batch), None
        if len(batch) == 4:  # CorruptedImageDataModule's loaders add each example's index
            batch = batch[:3]
        if len(batch) == 3:
            clean, corrupted, labels = batch
            return to_model_range(clean), to_model_range(corrupted), labels
        if len(batch) == 1:
            return None, to_model_range(batch[0]), None
        raise UserInputError(f"coupled diffusion expects (clean, corrupted, label) batches (CorruptedImageDataModule "
                             f"with output='coupled'), got a batch of {len(batch)} items.")

    def training_step(self, batch, batch_idx):
        clean, corrupted, _ = self._unpack(batch)
        if clean is None:
            raise UserInputError("training needs clean images: use CorruptedImageDataModule with output='coupled'.")
        x_mse, y_mse = self.losses(clean, corrupted)
        loss = self.hparams.x_loss_weight * x_mse + self.hparams.y_loss_weight * y_mse
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/x_loss", x_mse)
        self.log("train/y_loss", y_mse)
        return loss

    def _generator(self, batch, batch_idx: int, stream: int) -> torch.Generator | ExampleGenerators:
        """Per-example generators seeded by (``sample_seed``, stream, the example's index) when the batch carries
        the index (`CorruptedImageDataModule`), else one generator seeded by (``sample_seed``, batch index)."""
        if isinstance(batch, (tuple, list)) and len(batch) == 4:
            return ExampleGenerators(self.hparams.sample_seed, batch[3], stream)
        return torch.Generator().manual_seed((self.hparams.sample_seed * 1_000_003 + batch_idx) * 7 + stream)

    def _evaluate(self, batch, batch_idx: int, stage: str) -> None:
        clean, corrupted, labels = self._unpack(batch)
        if clean is None or labels is None:
            raise UserInputError(f"{stage} needs (clean, corrupted, label) batches (CorruptedImageDataModule).")
        x_mse, y_mse = self.losses(clean, corrupted, generator=self._generator(batch, batch_idx, 0))
        losses = {"loss": self.hparams.x_loss_weight * x_mse + self.hparams.y_loss_weight * y_mse,
                  "x_loss": x_mse, "y_loss": y_mse}
        for name, value in losses.items():  # batch means weighted by batch size: the mean over examples
            metric = self.metrics[f"{stage}_{name}"]
            metric.update(value.detach(), weight=len(clean))
            self.log(f"{stage}/{name}", metric)
        if not self.hparams.validate_sampling:
            return
        out = self.sample(corrupted, generator=self._generator(batch, batch_idx, 1))
        for name, logits in (("acc", out["logits"]), ("acc_f_enhanced", out["classifier_logits"]),
                             ("acc_corrupted", self.classify(corrupted))):
            metric = self.metrics[f"{stage}_{name}"]
            metric(logits, labels)
            self.log(f"{stage}/{name}", metric, prog_bar=name == "acc")

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "test")

    def predict_step(self, batch, batch_idx):
        _, corrupted, _ = self._unpack(batch)
        out = self.sample(corrupted, generator=self._generator(batch, batch_idx, 1))
        return {"probs": out["logits"].softmax(-1), "enhanced": from_model_range(out["images"]),
                "classifier_probs": out["classifier_logits"].softmax(-1)}
