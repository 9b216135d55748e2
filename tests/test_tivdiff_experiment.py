"""TIVDiff's experiment as configuration (configs/tivdiff/experiment.yaml): the spec parses with the protocol of
the module docstring, the smoke overlay is small, the hooks refuse what they cannot run."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments import runner, tivdiff


def test_spec_holds_the_two_stage_protocol():
    spec = runner.load_spec("tivdiff")
    assert spec.seeds == 3 and [arm.name for arm in spec.arms] == ["encoder", "VIP (trained)"]
    encoder, generator = spec.arms
    assert not encoder.row and encoder.seed_offset == 0 and encoder.configs == ["configs/tivdiff/encoder_quick.yaml"]
    assert generator.row and generator.seed_offset == 1000 and generator.configs == ["configs/tivdiff/quick.yaml"]
    assert encoder.overrides["trainer.max_steps"] == 200 and generator.overrides["trainer.max_steps"] == 700
    ema = generator.overrides["trainer.callbacks+"]
    assert ema == {"class_path": "callbacks.ema.EMAWeights", "init_args": {"decay": 0.995, "warmup": True}}
    # the model's CosFace classes are the data's training identities: 60 - 25% held out
    o = spec.overrides
    assert o["model.init_args.num_train_identities"] == o["data.init_args.num_identities"] * 3 // 4 == 45
    assert spec.settings["vip_identities"] == 200 and spec.settings["faces"] == 128
    assert spec.settings["few_steps"] == 20 and o["model.init_args.num_inference_steps"] == 50
    assert spec.baseline == "original embedding (no projection)" and "linkability_auc" in spec.metrics
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)


def test_smoke_overlay_is_small():
    spec = runner.load_spec("tivdiff", smoke=True)
    assert spec.seeds == 1 and all(arm.smoke_overrides["trainer.max_steps"] <= 2 for arm in spec.arms)
    flags = runner.arm_flags(spec, spec.arms[1])
    assert "--data.init_args.num_identities=8" in flags and "--model.init_args.num_train_identities=6" in flags
    assert "--model.init_args.num_inference_steps=4" in flags  # DDIM steps must divide T = 1000
    assert spec.settings["faces"] <= 8 and spec.settings["vip_identities"] <= 8


def test_prepare_needs_the_encoder_run_first():
    spec = runner.load_spec("tivdiff")
    run = SimpleNamespace(arm=spec.arms[1], earlier={}, settings=spec.settings)
    with pytest.raises(runner.ExperimentError, match="needs the 'encoder' arm"):
        tivdiff.prepare(run)
    assert tivdiff.prepare(SimpleNamespace(arm=spec.arms[0], earlier={})) == {}


def test_settings_are_checked():
    run = SimpleNamespace(settings={"faces": 0})
    with pytest.raises(runner.ExperimentError, match="settings.faces must be a positive integer"):
        tivdiff._setting(run, "faces")
