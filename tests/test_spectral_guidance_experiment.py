"""Spectral Guidance's experiment as configuration (configs/spectral_guidance/experiment.yaml): the spec holds the
protocol of the module docstring, the smoke overlay is small, the hooks check their settings."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments import runner, spectral_guidance


def test_spec_holds_the_protocol():
    spec = runner.load_spec("spectral_guidance")
    arms = {arm.name: arm for arm in spec.arms}
    assert spec.seeds == 3 and list(arms) == [spectral_guidance.S1_ARM, spectral_guidance.S2_PRIOR,
                                              spectral_guidance.S2_ENCODER, spectral_guidance.DIGITS_PRIOR,
                                              spectral_guidance.DIGITS_ENCODER]
    steps = {name: arm.overrides["trainer.max_steps"] for name, arm in arms.items()}
    assert steps == {"S1 spectrum recovery (K=3)": 800, "S2 prior": 1500, "S2 unguided": 800, "digits prior": 1000,
                     "digits encoder": 800}
    assert arms["S2 unguided"].seed_offset == 100 and arms["S2 unguided"].row
    assert not arms["S2 prior"].row and arms["S2 prior"].configs == ["configs/spectral_guidance/denoiser_quick.yaml"]
    assert arms["digits prior"].seeds == arms["digits encoder"].seeds == 1  # the digits run on seed 0 only
    assert arms["S1 spectrum recovery (K=3)"].overrides["model.init_args.encoder.init_args.num_features"] == 3
    assert arms["S2 unguided"].overrides["model.init_args.encoder.init_args.num_features"] == 30
    settings = spectral_guidance.sampling(spec.settings)
    assert settings.strengths == (0.5, 1.0, 2.0, 3.0, 5.0, 10.0) and settings.samples_per_class == 128
    assert settings.ddim_steps == 50 and settings.repeats == 2 and settings.fidelity_tol == 0.5
    assert spec.baseline == "S2 DPS-style @ matched fidelity" and "accuracy" in spec.metrics
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)


def test_smoke_overlay_is_small():
    spec = runner.load_spec("spectral_guidance", smoke=True)
    assert spec.seeds == 1 and spec.smoke_overrides["trainer.max_steps"] == 3
    settings = spectral_guidance.sampling(spec.settings)
    assert settings.strengths == (1.0,) and settings.samples_per_class == 8 and settings.repeats == 1
    assert settings.s1_num_eval == 2000
    prior = next(arm for arm in spec.arms if arm.name == "S2 prior")
    assert prior.smoke_overrides["data.init_args.num_train"] == 1000


def test_settings_and_run_order_are_checked():
    settings = dict(runner.load_spec("spectral_guidance").settings, strengths=[])
    with pytest.raises(runner.ExperimentError, match="settings.strengths must be a list of positive numbers"):
        spectral_guidance.sampling(settings)
    with pytest.raises(runner.ExperimentError, match="settings.repeats must be a positive integer"):
        spectral_guidance.sampling(dict(settings, strengths=[1.0], repeats=0))
    run = SimpleNamespace(arm=SimpleNamespace(name="S2 unguided"), earlier={})
    with pytest.raises(runner.ExperimentError, match="needs the 'S2 prior' arm run before it"):
        spectral_guidance._earlier(run, "S2 prior")


def test_matched_fidelity_picks_the_most_accurate_strength_within_the_tolerance():
    arms = {"unguided": {"loglik": -3.0, "accuracy": 0.1},
            "spectral, s=1": {"loglik": -3.2, "accuracy": 0.5}, "spectral, s=3": {"loglik": -3.4, "accuracy": 0.7},
            "spectral, s=10": {"loglik": -9.0, "accuracy": 0.99}}
    assert spectral_guidance.select_matched(arms, "spectral", 0.5) == "spectral, s=3"
    assert spectral_guidance.select_matched(arms, "spectral", 0.1) == "spectral, s=1"  # none within: best loglik
