"""Guided DDIM sampling for Spectral Guidance (arXiv 2605.28900): the spectral guide and the DPS-style baseline.

The method is described in `lightning_modules.spectral_guidance.spectral_guidance` (module docstring, "Guided DDIM" and
"The sign fix"); this module holds the sampler side, following the official code's ``guidance.py``
(github.com/gabmoreira/spectralguidance):

* `SpectralGuide`: at a guided step t, p = Phi~(x, t) . c_t / ||Phi~(x, t)|| from one forward/backward pass of the
  small encoder, g = `guidance_direction`(grad_x p, p) (grad p / p, or grad p / max(p, p_floor) with the sign fix),
  rescaled per sample by `clamp_norm`, and the shift s sqrt(1 - a_t) g. The denoiser is never backpropagated.
* `DPSStyleGuide`: the baseline of the experiments, g = grad_{x_t} log p(y | x0_hat(x_t)) backpropagated through
  the denoiser, with the same shift rule so that only the gradient estimate differs (a documented simplification
  of DPS / FreeDoM: no 1 / ||residual|| scaling, no recurrence).
* `guided_ddim_step` / `guided_ddim_sample`: one DDIM step (diffusers ``DDIMScheduler``) with an optional shift of
  x_t, eps_hat computed before the shift (as the official code does), and the loop from pure noise.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from diffusers import DDIMScheduler
from torch import Tensor, nn

from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExampleGenerators, draw_normal

if TYPE_CHECKING:  # the encoder module imports this one
    from lightning_modules.spectral_guidance.spectral_guidance import SpectralGuidanceEncoder


def guidance_direction(grad_p: Tensor, p: Tensor, sign_fix: bool = True, p_floor: float = 1e-3) -> Tensor:
    """grad log p estimate: grad p / max(p, p_floor) with the sign fix, the official grad p / p without it."""
    denominator = p.clamp_min(p_floor) if sign_fix else p
    return grad_p / denominator.reshape(-1, *([1] * (grad_p.dim() - 1)))


def clamp_norm(g: Tensor, low: float, high: float) -> Tensor:
    """Rescale every sample's g to norm clamp(||g||, low, high) (zero stays zero)."""
    norm = g.flatten(1).norm(dim=1).reshape(-1, *([1] * (g.dim() - 1)))
    return g / norm.clamp_min(1e-20) * norm.clamp(low, high)



def predict_eps(denoiser: nn.Module, x: Tensor, t: Tensor | int) -> Tensor:
    """eps_hat(x, t) of a collection denoiser (x, t[B]) -> tensor or a diffusers UNet2DModel (-> .sample)."""
    t_batch = torch.as_tensor(t, device=x.device).reshape(-1).expand(len(x)).long()
    out = denoiser(x, t_batch)
    return out.sample if hasattr(out, "sample") else out


class GuidanceStats:
    """Counters a guide fills while sampling: guided steps, encoder / denoiser backward passes."""

    def __init__(self) -> None:
        self.guided_steps = self.encoder_backprops = self.denoiser_backprops = 0
        self.estimates = self.estimates_below_floor = 0   # (sample, step) pairs; p <= p_floor: where the sign matters


class SpectralGuide:
    """The spectral-guidance shift at DDIM step t (None when t is not guided). Never touches the denoiser.

    Args:
        encoder: a `SpectralGuidanceEncoder` that has been ``encode``d.
        coefficients: [G, K+1, M] spectral coefficients (constant first) on the encoder's grid.
        targets: [B] index into M for every sample of the batch (e.g. the wanted class).
        strength: s. grad_clip_min/max: the per-sample norm clamp. top_k: number of leading features kept (None:
        all). guidance_t_min/max: the guidance window. sign_fix/p_floor: see the module docstring.
    """

    needs_denoiser_grad = False

    def __init__(self, encoder: "SpectralGuidanceEncoder", coefficients: Tensor, targets: Tensor,
                 strength: float = 10.0, guidance_t_min: int = 0, guidance_t_max: int = 1000,
                 grad_clip_min: float = 0.1, grad_clip_max: float = 0.3, top_k: int | None = None,
                 sign_fix: bool = True, p_floor: float = 1e-3) -> None:
        check_range("strength", strength, 0.0)
        check_range("grad_clip_min", grad_clip_min, 0.0)
        check_range("grad_clip_max", grad_clip_max, grad_clip_min)
        if not bool(encoder.encoded):
            raise UserInputError("the encoder has no whitening yet: call encoder.encode(train_x) before guiding.")
        k = encoder.num_features
        if coefficients.dim() != 3 or coefficients.shape[:2] != (len(encoder.encode_timesteps), k + 1):
            raise UserInputError(f"coefficients must have shape [{len(encoder.encode_timesteps)}, {k + 1}, M] (grid "
                                 f"x (K + 1) x targets), got {tuple(coefficients.shape)}.")
        if top_k is not None:
            check_range("top_k", top_k, 0, k)
        self.encoder, self.coefficients, self.targets = encoder, coefficients, targets.long()
        self.strength, self.t_min, self.t_max = float(strength), guidance_t_min, guidance_t_max
        self.clip_min, self.clip_max, self.sign_fix, self.p_floor = grad_clip_min, grad_clip_max, sign_fix, p_floor
        self.keep = k + 1 if top_k is None else top_k + 1
        self.alphas_cumprod = encoder.alphas_cumprod
        self.stats = GuidanceStats()
        self.last_p: Tensor | None = None

    def is_guided(self, t: int) -> bool:
        return self.t_min <= t <= self.t_max and self.encoder.grid_index(t) is not None

    def estimate(self, x: Tensor, t: int) -> Tensor:
        """p(x, t) = Phi~[:, :keep] . c_t[:keep, target] / ||Phi~[:, :keep]|| (differentiable in x)."""
        index = self.encoder.grid_index(t)
        phi = self.encoder.forward_whitened(x, t)[:, :self.keep]
        c = self.coefficients[index, :self.keep].to(phi)[:, self.targets.to(phi.device)].T    # B, keep
        return (phi * c).sum(-1) / phi.norm(dim=-1).clamp_min(1e-12)

    def __call__(self, x: Tensor, t: int) -> Tensor | None:
        t = int(t)
        if not self.is_guided(t):
            return None
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            p = self.estimate(x_in, t)
            (grad_p,) = torch.autograd.grad(p.sum(), x_in)
        self.stats.guided_steps += 1
        self.stats.encoder_backprops += 1
        self.stats.estimates += len(p)
        self.stats.estimates_below_floor += int((p.detach() <= self.p_floor).sum())
        self.last_p = p.detach()
        g = guidance_direction(grad_p, p.detach(), self.sign_fix, self.p_floor)
        g = clamp_norm(g, self.clip_min, self.clip_max)
        sigma = (1.0 - self.alphas_cumprod[t]).sqrt().to(x)
        return self.strength * g * sigma


class DPSStyleGuide:
    """The baseline that backpropagates through the denoiser (DPS / FreeDoM style): g = grad_{x_t} log p(y | x0_hat)
    with x0_hat = (x_t - sqrt(1 - a_t) eps_hat(x_t)) / sqrt(a_t), shifted with the same rule as `SpectralGuide`
    (per-sample norm clamp, s sqrt(1 - a_t)) so that only the gradient estimate differs.

    Args:
        log_likelihood: x0_hat [B, ...] -> [B] differentiable log p(y_b | x0_hat_b) (e.g. an exact GMM posterior).
        alphas_cumprod: the schedule's cumulative alphas.
    """

    needs_denoiser_grad = True

    def __init__(self, log_likelihood: Callable[[Tensor], Tensor], alphas_cumprod: Tensor, strength: float = 1.0,
                 guidance_t_min: int = 0, guidance_t_max: int = 1000, grad_clip_min: float = 0.1,
                 grad_clip_max: float = 0.3) -> None:
        check_range("strength", strength, 0.0)
        self.log_likelihood, self.alphas_cumprod = log_likelihood, alphas_cumprod
        self.strength, self.t_min, self.t_max = float(strength), guidance_t_min, guidance_t_max
        self.clip_min, self.clip_max = grad_clip_min, grad_clip_max
        self.stats = GuidanceStats()

    def is_guided(self, t: int) -> bool:
        return self.t_min <= t <= self.t_max and t > 0

    def shift_and_eps(self, denoiser: nn.Module, x: Tensor, t: int) -> tuple[Tensor, Tensor | None]:
        if not self.is_guided(t):
            with torch.no_grad():
                return predict_eps(denoiser, x, t), None
        alpha = self.alphas_cumprod[t].to(x)
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            eps = predict_eps(denoiser, x_in, t)
            x0_hat = (x_in - (1 - alpha).sqrt() * eps) / alpha.sqrt()
            (grad,) = torch.autograd.grad(self.log_likelihood(x0_hat).sum(), x_in)
        self.stats.guided_steps += 1
        self.stats.denoiser_backprops += 1
        shift = self.strength * clamp_norm(grad, self.clip_min, self.clip_max) * (1 - alpha).sqrt()
        return eps.detach(), shift


def guided_ddim_step(scheduler: DDIMScheduler, denoiser: nn.Module, x: Tensor, t: Tensor | int,
                     guide: Callable | None = None, eta: float = 0.0,
                     generator: torch.Generator | ExampleGenerators | None = None) -> Tensor:
    """One DDIM step with an optional guidance shift of x_t. eps_hat comes from the denoiser under no_grad
    (computed before the shift, as in the official code) unless the guide itself needs the denoiser's gradient
    (the DPS-style baseline), in which case ``guide.shift_and_eps`` returns both."""
    if guide is not None and getattr(guide, "needs_denoiser_grad", False):
        eps, shift = guide.shift_and_eps(denoiser, x, int(t))
    else:
        with torch.no_grad():
            eps = predict_eps(denoiser, x, t)
        shift = guide(x, int(t)) if guide is not None else None
    if shift is not None:
        x = x + shift
    if isinstance(generator, ExampleGenerators):  # diffusers draws row b of the step noise from generator b
        generator = generator.generators
    return scheduler.step(eps, t, x, eta=eta, generator=generator).prev_sample


def guided_ddim_sample(denoiser: nn.Module, scheduler: DDIMScheduler, shape: tuple[int, ...], num_inference_steps: int,
                       guide: Callable | None = None, eta: float = 0.0,
                       generator: torch.Generator | ExampleGenerators | None = None,
                       device: torch.device | str = "cpu") -> Tensor:
    """DDIM sampling (diffusers scheduler) from pure noise, with an optional guide at every step. With
    `ExampleGenerators` (one per sample) every sample's initial and step noise comes from its own generator."""
    check_range("num_inference_steps", num_inference_steps, 1, scheduler.config.num_train_timesteps)
    scheduler.set_timesteps(num_inference_steps)
    if guide is not None and hasattr(guide, "is_guided") and not any(guide.is_guided(int(t)) for t in
                                                                     scheduler.timesteps):
        raise UserInputError(f"no DDIM timestep of {num_inference_steps} steps lies on the encode grid inside the "
                             "guidance window, so nothing would be guided: choose num_inference_steps so that the "
                             "timesteps land on the grid (T=1000: 50 or 100) or widen guidance_t_min/max.")
    x = draw_normal(shape, generator, "cpu" if generator is None or isinstance(generator, ExampleGenerators)
                    else generator.device).to(device)
    for t in scheduler.timesteps:
        x = guided_ddim_step(scheduler, denoiser, x, t, guide, eta, generator).detach()
    return x
