"""The HiDe experiment's paired block (experiments/hide.py): per clutter level, HiDe and the other arms minus the
full image, HiDe minus upscaling and minus the oracle crop, the oracle crop minus upscaling, seed by seed with a 95%
t interval."""
from __future__ import annotations

import pytest

from experiments.hide import paired
from icml26.claims import paired_interval


def _seed(full, upscaled, oracle, hide):
    row = {}
    for level, values in ((0, (full, upscaled, oracle, hide)), (8, (0.3, 0.3, 0.9, 0.35))):
        for arm, value in zip(("full image", "upscaled", "oracle crop", "hide"), values):
            row[f"{arm}/clutter{level}"] = {"accuracy": value}
        row[f"hide/clutter{level}"]["box_iou"] = 0.1
    return row


def test_paired_block_per_clutter_level_matches_the_hand_computed_differences():
    per_seed = [_seed(0.5, 0.6, 0.9, 0.7), _seed(0.4, 0.45, 0.8, 0.5), _seed(0.45, 0.5, 0.85, 0.65)]
    block = paired(per_seed, [0, 8])
    names = [f"{arm}/clutter{n} - full image/clutter{n}" for n in (0, 8) for arm in ("hide", "upscaled", "oracle crop")]
    names += [f"hide/clutter{n} - {b}/clutter{n}" for n in (0, 8) for b in ("upscaled", "oracle crop")]
    names += [f"oracle crop/clutter{n} - upscaled/clutter{n}" for n in (0, 8)]
    assert sorted(block) == sorted(names)
    assert all(list(cells) == ["accuracy"] for cells in block.values())  # box_iou only exists for hide
    cell = block["hide/clutter0 - full image/clutter0"]["accuracy"]
    mean, lo, hi, n = paired_interval([0.2, 0.1, 0.2])
    assert (cell["mean"], cell["lo"], cell["hi"], cell["n"]) == pytest.approx((mean, lo, hi, n))
    assert cell["lo"] > 0  # every seed gains: the interval excludes zero
    cell = block["hide/clutter0 - upscaled/clutter0"]["accuracy"]
    assert cell["mean"] == pytest.approx((0.1 + 0.05 + 0.15) / 3)
    cell = block["oracle crop/clutter0 - upscaled/clutter0"]["accuracy"]
    assert cell["mean"] == pytest.approx((0.3 + 0.35 + 0.35) / 3)
    cell = block["hide/clutter8 - full image/clutter8"]["accuracy"]
    assert cell["mean"] == pytest.approx(0.05) and cell["n"] == 3


def test_paired_block_with_one_seed_has_no_interval():
    cell = paired([_seed(0.5, 0.6, 0.9, 0.7)], [0])["hide/clutter0 - oracle crop/clutter0"]["accuracy"]
    assert cell["mean"] == pytest.approx(-0.2) and cell["n"] == 1 and cell["lo"] is None and cell["hi"] is None


def test_paired_block_follows_the_given_pairs_in_order():
    per_seed = [_seed(0.5, 0.6, 0.9, 0.7), _seed(0.4, 0.45, 0.8, 0.5)]
    block = paired(per_seed, [8, 0], [("upscaled", "oracle crop"), ("hide", "full image")])
    assert list(block) == ["upscaled/clutter8 - oracle crop/clutter8", "hide/clutter8 - full image/clutter8",
                           "upscaled/clutter0 - oracle crop/clutter0", "hide/clutter0 - full image/clutter0"]
    assert block["upscaled/clutter0 - oracle crop/clutter0"]["accuracy"]["mean"] == pytest.approx(-0.325)


def test_experiment_yaml_is_the_protocol_and_its_smoke_overlay_is_small():
    """configs/hide/experiment.yaml: one trained run per seed (900 steps, 6 validations, 50 / 200 questions per
    clutter level), HiDe from configs/hide/quick.yaml, the default pairs; the smoke overlay is a few steps."""
    from experiments import hide, runner

    assert "hide" in runner.available()
    spec = runner.load_spec("hide")
    assert spec.seeds == 5 and [arm.name for arm in spec.arms] == [spec.baseline] == ["full image/clutter0"]
    assert spec.arms[0].configs == ["configs/hide/toy_mllm_quick.yaml"] and spec.arms[0].fit
    assert {k: spec.overrides[k] for k in ("trainer.max_steps", "trainer.val_check_interval",
                                           "data.init_args.num_val", "data.init_args.num_test")} == {
        "trainer.max_steps": 900, "trainer.val_check_interval": 150, "data.init_args.num_val": 50,
        "data.init_args.num_test": 200}
    assert spec.settings["hide_config"] == "configs/hide/quick.yaml" and spec.settings["oracle_margin"] == 4
    assert [tuple(pair) for pair in spec.settings["paired"]] == list(hide.PAIRS)
    assert spec.hooks == {hook: f"experiments.hide:{hook}" for hook in ("evaluate", "report", "plot")}
    smoke = runner.load_spec("hide", smoke=True)
    assert smoke.seeds == 1 and smoke.smoke_overrides["trainer.max_steps"] <= 10
    overrides = smoke.smoke_overrides
    assert overrides["data.init_args.num_test"] <= 5 and overrides["data.init_args.num_val"] <= 5
    flags = runner.arm_flags(smoke, smoke.arms[0])
    assert "--trainer.max_steps=4" in flags and "--trainer.max_steps=900" not in flags  # the smoke overlay wins


@pytest.mark.slow
def test_smoke_run_through_the_runner(tmp_path, monkeypatch):
    """The runner's smoke run: the twelve evaluations of one trained model per seed in the old order, the layer
    chosen on validation, and the per-clutter-level paired block of the report."""
    from experiments import runner

    monkeypatch.chdir(tmp_path)
    result = runner.run_experiment("hide", smoke=True, out=tmp_path / "out")
    levels = (0, 8, 24)
    assert list(result["arms"]) == [f"{arm}/clutter{n}" for n in levels
                                    for arm in ("full image", "upscaled", "oracle crop", "hide")]
    assert set(result["arms"]["hide/clutter8"]) == {"accuracy", "box_iou", "box_iou_raw", "target_coverage",
                                                    "no_zoom_rate"}
    assert set(result["arms"]["upscaled/clutter8"]) == {"accuracy"}
    per_level = paired(result["per_seed"], list(levels))
    assert list(per_level) == [f"{m}/clutter{n} - {b}/clutter{n}" for n in levels for m, b in
                               (("hide", "full image"), ("upscaled", "full image"), ("oracle crop", "full image"),
                                ("hide", "upscaled"), ("hide", "oracle crop"), ("oracle crop", "upscaled"))]
    assert {k: result["paired"][k] for k in per_level} == per_level
    # the runner's own pairs (every row minus the baseline arm) come first, the report's per-level pairs follow
    runner_pairs = [k for k in result["paired"] if k not in per_level or k.endswith(" - full image/clutter0")]
    assert runner_pairs == [f"{arm} - full image/clutter0" for arm in result["arms"] if arm != "full image/clutter0"]
    (layer,) = result["selected_layers"]
    assert layer["layer"] in (1, 2, 3) and len(layer["val_box_iou_by_layer"]) == 3
    assert (tmp_path / "out" / "hide.png").is_file() and not (tmp_path / "runs").exists()


def test_settings_paired_is_validated():
    from experiments import hide, runner

    assert hide.checked_pairs([["hide", "upscaled"]]) == [("hide", "upscaled")]
    for bad in ([["hide", "zoom"]], [["hide"]], "hide - upscaled"):
        with pytest.raises(runner.ExperimentError, match="settings.paired"):
            hide.checked_pairs(bad)
