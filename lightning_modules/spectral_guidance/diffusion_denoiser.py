"""The DDPM eps-prediction model that Spectral Guidance (arXiv 2605.28900) steers, and its noise schedules.

`DiffusionDenoiser` trains eps_theta(x_t, t) with the standard DDPM loss ||eps_theta(x_t, t) - eps||^2 on the
forward noising of diffusers' ``DDPMScheduler`` (Ho et al., 2020), or wraps a pretrained diffusers
``UNet2DModel`` read from a local folder (e.g. a copy of google/ddpm-cifar10-32; nothing is downloaded). Its
``sample`` / ``predict_step`` run unguided DDIM through
`lightning_modules.spectral_guidance.guided_sampling.guided_ddim_sample`. `make_scheduler` builds the DDPM/DDIM
schedulers shared with `SpectralGuidanceEncoder`, which must use the denoiser's schedule.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from diffusers import DDIMScheduler, DDPMScheduler
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.denoisers import from_model_range
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExampleGenerators, draw_integers, draw_normal
from lightning_modules.spectral_guidance.guided_sampling import guided_ddim_sample, predict_eps

BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")


def make_scheduler(kind: str, num_train_timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02,
                   beta_schedule: str = "linear", clip_sample: bool = False):
    """A fresh diffusers DDPM/DDIM scheduler (stateful: one per use). ``kind``: "ddpm" or "ddim"."""
    cls = {"ddpm": DDPMScheduler, "ddim": DDIMScheduler}[kind]
    return cls(num_train_timesteps=num_train_timesteps, beta_start=beta_start, beta_end=beta_end,
               beta_schedule=beta_schedule, prediction_type="epsilon", clip_sample=clip_sample)


def check_schedule(num_train_timesteps: int, beta_start: float, beta_end: float, beta_schedule: str) -> None:
    check_range("num_train_timesteps", num_train_timesteps, 2)
    check_range("beta_start", beta_start, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    check_range("beta_end", beta_end, beta_start, 1.0, high_inclusive=False)
    if beta_schedule not in BETA_SCHEDULES:
        raise UserInputError(f"beta_schedule={beta_schedule!r} is unknown: choose one of {', '.join(BETA_SCHEDULES)}.")


def load_diffusers_unet(path: str) -> nn.Module:
    """A pretrained ``UNet2DModel`` from a local diffusers folder (the model folder or a pipeline with unet/)."""
    if not os.path.isdir(path):
        raise UserInputError(f"denoiser_path '{path}' does not exist: give a local diffusers-format folder (e.g. a "
                             "copy of google/ddpm-cifar10-32 with config.json and diffusion_pytorch_model."
                             "safetensors/.bin, or a pipeline folder with unet/). Nothing is downloaded.")
    subfolder = "unet" if os.path.isfile(os.path.join(path, "unet", "config.json")) else None
    if not os.path.isfile(os.path.join(path, subfolder or "", "config.json")):
        raise UserInputError(f"denoiser_path '{path}' holds no config.json (nor unet/config.json): it is not a "
                             "diffusers UNet2DModel folder.")
    from diffusers import UNet2DModel
    try:
        return UNet2DModel.from_pretrained(path, subfolder=subfolder, local_files_only=True)
    except (OSError, ValueError, EnvironmentError) as err:
        raise UserInputError(f"denoiser_path '{path}' could not be loaded as a UNet2DModel: {err}") from None


EVALUATION_SEED = 0  # evaluation noise is the same in every run (as the validation split is)
STREAM_LOSS, STREAM_SAMPLES, STREAM_FEATURES = 0, 1, 2


def evaluation_generators(batch, batch_idx: int, stream: int = STREAM_LOSS) -> ExampleGenerators | torch.Generator:
    """The evaluation noise of a `datamodules.toy_distributions.DiffusionToyDataModule` batch ``(x, label, index)``:
    one generator per example seeded by (stream, its index), so the noise does not depend on batching or on the
    number of processes; a batch without an index gets one generator seeded by (stream, batch index)."""
    if isinstance(batch, (tuple, list)) and len(batch) == 3:
        return ExampleGenerators(EVALUATION_SEED, batch[2], stream)
    return torch.Generator().manual_seed(batch_idx * 7 + stream)


NO_TEST_STAGE = ("DiffusionDenoiser has no test stage: the toy distributions have no test split and its held-out "
                 "denoising loss is val/loss; use `validate` (or `predict` for DDIM samples).")


class DiffusionDenoiser(PaperModule):
    """DDPM eps-prediction model (the pretrained prior that Spectral Guidance steers).

    Args:
        denoiser: the network eps(x_t, t) (``lightning_modules.shared.denoisers.MLPDenoiser`` / ``UNet``); None with
            ``denoiser_path``.
        denoiser_path: local diffusers ``UNet2DModel`` folder to load instead (pretrained DDPM; frozen unless
            ``train_pretrained``).
        num_train_timesteps, beta_start, beta_end, beta_schedule: the DDPM noise schedule (diffusers).
        clip_sample: clamp x0_hat to [-1, 1] in the sampler (images: True; vectors: False).
        sample_steps, sample_eta: DDIM settings of ``predict_step`` / ``sample``.
        train_pretrained: fine-tune a loaded pretrained denoiser instead of freezing it.
    """

    no_test_stage = NO_TEST_STAGE

    def __init__(self, denoiser: nn.Module | None = None, denoiser_path: str | None = None,
                 num_train_timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02,
                 beta_schedule: str = "linear", clip_sample: bool = False, sample_steps: int = 50,
                 sample_eta: float = 0.0, train_pretrained: bool = False,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer, lr_scheduler, init_from, init_from_trusted)
        self.save_hyperparameters()
        check_schedule(num_train_timesteps, beta_start, beta_end, beta_schedule)
        check_range("sample_steps", sample_steps, 1, num_train_timesteps)
        check_range("sample_eta", sample_eta, 0.0, 1.0)
        if (denoiser is None) == (denoiser_path is None):
            raise UserInputError("DiffusionDenoiser needs exactly one of `denoiser` (a network to train) and "
                                 "`denoiser_path` (a local pretrained diffusers UNet2DModel folder).")
        self.denoiser = denoiser if denoiser is not None else load_diffusers_unet(denoiser_path)
        if denoiser_path is not None and not train_pretrained:
            self.denoiser.requires_grad_(False)
        self.schedule = dict(num_train_timesteps=num_train_timesteps, beta_start=beta_start, beta_end=beta_end,
                             beta_schedule=beta_schedule, clip_sample=clip_sample)
        self.noise_scheduler = make_scheduler("ddpm", **self.schedule)
        self.register_buffer("alphas_cumprod", self.noise_scheduler.alphas_cumprod.clone(), persistent=False)
        self.sample_steps, self.sample_eta = sample_steps, sample_eta

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return predict_eps(self.denoiser, x, t)

    def trainable_parameters(self):
        params = super().trainable_parameters()
        if not params:
            raise UserInputError("this DiffusionDenoiser has nothing to train: the pretrained denoiser_path model is "
                                 "frozen. Set train_pretrained: true to fine-tune it, or use it for sampling only.")
        return params

    def _loss(self, x0: Tensor, generator: torch.Generator | ExampleGenerators | None = None) -> Tensor:
        where = "cpu" if generator is not None else x0.device
        t = draw_integers(0, self.schedule["num_train_timesteps"], (len(x0),), generator, where).to(x0.device)
        noise = draw_normal(x0.shape, generator, where).to(x0)
        x_t = self.noise_scheduler.add_noise(x0, noise, t)
        return F.mse_loss(self(x_t, t), noise)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch[0])
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self._loss(batch[0], evaluation_generators(batch, batch_idx))
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def ddim_scheduler(self) -> DDIMScheduler:
        return make_scheduler("ddim", **self.schedule)

    @torch.no_grad()
    def sample(self, num_samples: int, data_shape: tuple[int, ...], num_inference_steps: int | None = None,
               eta: float | None = None, generator: torch.Generator | ExampleGenerators | None = None) -> Tensor:
        """Unguided DDIM samples [num_samples, *data_shape]."""
        return guided_ddim_sample(self.denoiser, self.ddim_scheduler(), (num_samples, *data_shape),
                                  num_inference_steps or self.sample_steps, None,
                                  self.sample_eta if eta is None else eta, generator, self.device)

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
        """DDIM samples shaped like the batch, one per example, seeded by the example's index (deterministic)."""
        x0 = batch[0]
        return self.sample(len(x0), tuple(x0.shape[1:]),
                           generator=evaluation_generators(batch, batch_idx, STREAM_SAMPLES))

    def prediction_fields(self, outputs, batch) -> dict:
        """The samples: images in [0, 1] (written as a PNG grid), points as they are (one CSV row each)."""
        return {"samples": from_model_range(outputs) if outputs.dim() == 4 else outputs}
