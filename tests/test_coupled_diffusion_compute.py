"""Coupled diffusion experiment: the compute each arm spends (network calls per optimiser step and per sampled
image, counted by hooks), and the compute-matched Enhanced arm."""
from __future__ import annotations

import torch

from datamodules.corrupted_images import CorruptedImageDataModule
from experiments import coupled_diffusion as exp
from experiments import kit, runner
from test_coupled_diffusion import tiny_model  # one tiny configuration for both files


def test_training_calls_per_step_hand_counted():
    data = CorruptedImageDataModule(batch_size=16)
    data.setup("fit")
    # Parallel: 3 inner iterations of (enhancer, f on the image, logit denoiser + its feature encoder), plus f on
    # the clean batch for the logit target
    parallel = exp.training_passes(tiny_model(), data)
    assert parallel == {"signal_net": 3, "logit_net": 3, "feature_net": 3, "classifier": 4}
    # Enhanced: one enhancer call, nothing else
    assert exp.training_passes(tiny_model(strategy="enhanced"), data) == {
        "signal_net": 1, "logit_net": 0, "feature_net": 0, "classifier": 0}
    row = exp.compute_metrics("train", parallel)
    assert row["train_denoiser"] == 6.0 and row["train_classifier"] == 4.0


def test_sampling_calls_per_image_hand_counted_and_hooks_are_removed():
    corrupted = torch.rand(4, 1, 8, 8) * 2 - 1
    model = tiny_model().eval()
    with exp.CallCounter(model) as counter:
        model.sample(corrupted, "parallel", torch.Generator().manual_seed(0))
    # 5 DDIM steps of each chain; f on x_c once, on x0_hat at the 2 steps below T/2 (t = 7, 3), on the final x
    assert counter.counts == {"signal_net": 5, "logit_net": 5, "feature_net": 5, "classifier": 4}
    with exp.CallCounter(model) as counter:
        model.sample(corrupted, "enhanced", torch.Generator().manual_seed(0))
    assert counter.counts == {"signal_net": 5, "logit_net": 0, "feature_net": 0, "classifier": 1}
    model.sample(corrupted, "parallel", torch.Generator().manual_seed(0))  # after the block: no more counting
    assert counter.counts["signal_net"] == 5


def test_compute_matched_enhanced_gets_the_parallel_iterations_in_optimiser_steps():
    spec = runner.load_spec("coupled_diffusion")
    assert "enhanced_3x" in exp.ARMS and spec.settings["step_factor"] == {"enhanced_3x": 3}
    arm = next(a for a in spec.arms if a.name == "enhanced_3x (p=0.3)")
    assert arm.overrides["model.init_args.strategy"] == "enhanced"  # Enhanced, trained 3x the optimiser steps
    model, _ = kit.from_config(arm.configs[0])
    assert model.hparams.coupling_iterations == spec.settings["step_factor"]["enhanced_3x"] == 3
