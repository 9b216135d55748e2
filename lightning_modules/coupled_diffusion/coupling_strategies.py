"""The coupling strategies of coupled signal/logit diffusion (arXiv 2602.15405) as plain functions.

`lightning_modules.coupled_diffusion.coupled_diffusion.CoupledDiffusion` owns the networks and their primitives: the two
noise predictions (``eps_x``, ``eps_y``), one-timestep losses (``x_loss``, ``y_loss``), full DDIM chains with fixed
conditions (``x_chain``, ``y_chain``), the frozen classifier (``classify``) and the logit standardisation
(``standardize``). A strategy only decides in which order those are called and what conditions each call gets;
the rules are stated in ``coupled_diffusion``'s module docstring ("Coupling strategies") and follow the official
code (github.com/gilad-nurko/coupled-diffusion, images/): ``parallel`` = its "interleaved scheduler",
``alternating`` = "block scheduler", ``nested`` = "hierarchical scheduler", ``enhanced`` = the enhance-then-classify
baseline.

Each training function returns ``(x loss, y loss)`` for one batch of [-1, 1] images; each sampling function returns
``{"logits", "images", "classifier_logits"}``. `TRAINING_LOSSES` and `SAMPLERS` map strategy names to them. The
functions draw their noise and timesteps from the given generator in a fixed order, so a seeded run is
reproducible; the generator may be a `lightning_modules.shared.example_rng.ExampleGenerators` (one per example, as
in evaluation), every draw being one row per example of the batch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from lightning_modules.shared.example_rng import ExampleGenerators, draw_integers, draw_normal

if TYPE_CHECKING:  # the module imports this one
    from lightning_modules.coupled_diffusion.coupled_diffusion import CoupledDiffusion


def noise_like(shape, like: Tensor, generator: torch.Generator | ExampleGenerators | None) -> Tensor:
    """Standard normal noise of ``shape`` with ``like``'s dtype and device (drawn on the generator's device)."""
    return draw_normal(shape, generator, like.device, like.dtype)


def random_timesteps(low: int, high: int, size: int, like: Tensor,
                     generator: torch.Generator | ExampleGenerators | None) -> Tensor:
    """``size`` integer timesteps uniform in [low, high) on ``like``'s device (drawn on the generator's device)."""
    return draw_integers(low, high, (size,), generator, like.device)


# ============================================================================================ training
def enhanced_losses(model: CoupledDiffusion, clean: Tensor, corrupted: Tensor,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Enhance-then-classify baseline: one x loss with y_cond = 0; no logit branch (y loss 0)."""
    batch, steps = clean.shape[0], model.hparams.num_train_timesteps
    zeros = clean.new_zeros(batch, model.hparams.num_classes)
    t = random_timesteps(0, steps, batch, clean, generator)
    x_mse, _ = model.x_loss(clean, corrupted, zeros, t, generator)
    return x_mse, clean.new_zeros(())


def parallel_losses(model: CoupledDiffusion, clean: Tensor, corrupted: Tensor,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``coupling_iterations`` times, one shared t: x loss on std(y0), then y loss on the image (x0_hat once
    t < switch_fraction * T, else x_c) and std(f(image)); y0 <- y0_hat. Mean of the inner losses."""
    batch, steps = clean.shape[0], model.hparams.num_train_timesteps
    y0 = clean.new_zeros(batch, model.hparams.num_classes)
    target = model.logit_target(clean)
    x_losses, y_losses = [], []
    for _ in range(model.hparams.coupling_iterations):
        t = random_timesteps(0, steps, batch, clean, generator)
        x_mse, x0_hat = model.x_loss(clean, corrupted, model.standardize(y0), t, generator)
        late = (t < model.hparams.switch_fraction * steps).view(-1, 1, 1, 1)
        image = torch.where(late, x0_hat, corrupted)
        y_mse, y0 = model.y_loss(target, model.standardize(model.classify(image)), image, t, generator)
        x_losses.append(x_mse)
        y_losses.append(y_mse)
    return torch.stack(x_losses).mean(), torch.stack(y_losses).mean()


def nested_losses(model: CoupledDiffusion, clean: Tensor, corrupted: Tensor,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """t walks down T..0 in blocks of ``nested_block_size``: per block an x loss on std(y0) and a y loss on
    (std(f(x0_hat)), x0_hat) of that x step; y0 <- y0_hat."""
    batch, steps = clean.shape[0], model.hparams.num_train_timesteps
    y0, block = clean.new_zeros(batch, model.hparams.num_classes), model.hparams.nested_block_size
    target = model.logit_target(clean)
    x_losses, y_losses = [], []
    for high in range(steps, 0, -block):
        t = random_timesteps(max(0, high - block), high, batch, clean, generator)
        x_mse, x0_hat = model.x_loss(clean, corrupted, model.standardize(y0), t, generator)
        y_mse, y0 = model.y_loss(target, model.standardize(model.classify(x0_hat)), x0_hat, t, generator)
        x_losses.append(x_mse)
        y_losses.append(y_mse)
    return torch.stack(x_losses).mean(), torch.stack(y_losses).mean()


def alternating_losses(model: CoupledDiffusion, clean: Tensor, corrupted: Tensor,
                       generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``alternating_iterations`` rounds: x loss on std(y0); no-grad x chain -> x0; y loss on (std(f(x0)), x0);
    between rounds a no-grad y chain -> y0 (chains of ``condition_sampling_steps`` steps, current weights)."""
    batch, steps = clean.shape[0], model.hparams.num_train_timesteps
    y0, cond_steps = clean.new_zeros(batch, model.hparams.num_classes), model.hparams.condition_sampling_steps
    target = model.logit_target(clean)
    x_losses, y_losses = [], []
    for round_ in range(model.hparams.alternating_iterations):
        y_cond_x = model.standardize(y0)
        x_mse, _ = model.x_loss(clean, corrupted, y_cond_x, random_timesteps(0, steps, batch, clean, generator),
                                generator)
        with torch.no_grad():
            x0 = model.x_chain(corrupted, y_cond_x, generator, cond_steps)
        y_cond = model.standardize(model.classify(x0))
        y_mse, _ = model.y_loss(target, y_cond, x0, random_timesteps(0, steps, batch, clean, generator), generator)
        x_losses.append(x_mse)
        y_losses.append(y_mse)
        if round_ + 1 < model.hparams.alternating_iterations:
            with torch.no_grad():
                y0 = model.y_chain(y_cond, x0, generator, cond_steps)
    return torch.stack(x_losses).mean(), torch.stack(y_losses).mean()


# ============================================================================================ sampling
def sample_enhanced(model: CoupledDiffusion, corrupted: Tensor,
                    generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """x chain with y_cond = 0, then classify the enhanced image with f."""
    zeros = corrupted.new_zeros(corrupted.shape[0], model.hparams.num_classes)
    x0 = model.x_chain(corrupted, zeros, generator)
    logits = model.classify(x0)
    return {"logits": logits, "images": x0, "classifier_logits": logits}


def sample_alternating(model: CoupledDiffusion, corrupted: Tensor,
                       generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """y0 = 0, then ``alternating_iterations`` rounds of x0 = x chain(x_c, std(y0)); y0 = y chain(std(f(x0)), x0)."""
    y0 = corrupted.new_zeros(corrupted.shape[0], model.hparams.num_classes)
    for _ in range(model.hparams.alternating_iterations):
        x0 = model.x_chain(corrupted, model.standardize(y0), generator)
        y0 = model.y_chain(model.standardize(model.classify(x0)), x0, generator)
    return {"logits": y0, "images": x0, "classifier_logits": model.classify(x0)}


def sample_nested(model: CoupledDiffusion, corrupted: Tensor,
                  generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """x0 = x chain(x_c, 0); one y chain in which, when the remaining steps r satisfy r <= nested_refresh_from and
    r % nested_refresh_every == 0, a new x chain on the current std(y0_hat) refreshes x0 and y_cond."""
    zeros = corrupted.new_zeros(corrupted.shape[0], model.hparams.num_classes)
    x0 = model.x_chain(corrupted, zeros, generator)
    y_cond = model.standardize(model.classify(x0))
    y = noise_like(zeros.shape, zeros, generator)
    timesteps = model.sampling_timesteps(model.logit_sampler)
    total, y0_hat = len(timesteps), None
    every, start = model.hparams.nested_refresh_every, model.hparams.nested_refresh_from
    for i, t in enumerate(timesteps):
        remaining = total - i
        if y0_hat is not None and remaining <= start and remaining % every == 0:
            x0 = model.x_chain(corrupted, model.standardize(y0_hat), generator)
            y_cond = model.standardize(model.classify(x0))
        t_batch = torch.full((y.shape[0],), int(t), device=y.device, dtype=torch.long)
        out = model.logit_sampler.step(model.eps_y(y, t_batch, y_cond, x0), int(t), y)
        y, y0_hat = out.prev_sample, out.pred_original_sample
    return {"logits": y, "images": x0, "classifier_logits": model.classify(x0)}


def sample_parallel(model: CoupledDiffusion, corrupted: Tensor,
                    generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Interleaved chains: at each t a y step on (std(f(x0_hat)), x0_hat) of the previous x step once
    t < switch_fraction * T (else on (std(f(x_c)), x_c)), then an x step on (x_c, std(y0_hat)) of this y step."""
    x = noise_like(corrupted.shape, corrupted, generator)
    y = noise_like((corrupted.shape[0], model.hparams.num_classes), corrupted, generator)
    cond_corrupted = model.standardize(model.classify(corrupted))
    x0_hat = None
    switch = model.hparams.switch_fraction * model.hparams.num_train_timesteps
    image_steps = model.sampling_timesteps(model.image_sampler)
    model.sampling_timesteps(model.logit_sampler)
    for t in image_steps:
        t_int = int(t)
        t_batch = torch.full((x.shape[0],), t_int, device=x.device, dtype=torch.long)
        if x0_hat is not None and t_int < switch:
            image, y_cond = x0_hat, model.standardize(model.classify(x0_hat))
        else:
            image, y_cond = corrupted, cond_corrupted
        y_out = model.logit_sampler.step(model.eps_y(y, t_batch, y_cond, image), t_int, y)
        y = y_out.prev_sample
        y_cond_x = model.standardize(y_out.pred_original_sample)
        x_out = model.image_sampler.step(model.eps_x(x, t_batch, corrupted, y_cond_x), t_int, x)
        x, x0_hat = x_out.prev_sample, x_out.pred_original_sample
    x = x.clamp(-1.0, 1.0)
    return {"logits": y, "images": x, "classifier_logits": model.classify(x)}


Losses = Callable[..., tuple[Tensor, Tensor]]
Sampler = Callable[..., dict[str, Tensor]]
TRAINING_LOSSES: dict[str, Losses] = {"parallel": parallel_losses, "alternating": alternating_losses,
                                      "nested": nested_losses, "enhanced": enhanced_losses}
SAMPLERS: dict[str, Sampler] = {"parallel": sample_parallel, "alternating": sample_alternating,
                                "nested": sample_nested, "enhanced": sample_enhanced}
STRATEGIES = tuple(SAMPLERS)
