"""``configs/trew/experiment.yaml`` and ``experiments/trew.py``'s hooks: every selected arm gets the same validation
budget, selection reads a separately retrained model (never the test reference R), and each unlearning run keeps
its best validation epoch."""
from __future__ import annotations

import pytest
import torch

from experiments import runner
from experiments.trew import Evaluator, grid_points, members, prepare, select

CLASSIFIERS = ("reference R", "shadow A", "selection S", "original", "retrain (2nd seed, floor)")


@pytest.mark.parametrize("smoke", [False, True])
def test_every_selected_arm_chooses_from_as_many_points_as_trew(smoke):
    spec = runner.load_spec("trew", smoke=smoke)
    points = grid_points(spec)
    assert set(points) == {"TREW weights similarity, val-selected", "TREW confusion similarity, val-selected",
                           "FT val-selected", "NegGrad+ val-selected", "RL val-selected", "TREW beta 0 (ablation)"}
    ablation = points.pop("TREW beta 0 (ablation)")   # one run: only its epoch is read off
    assert len(set(points.values())) == 1, points
    if smoke:
        assert spec.seeds == 1 and len(spec.arms) == 14 and ablation == 1 and points["FT val-selected"] == 2
    else:
        assert points["FT val-selected"] == 125 and ablation == 5
        assert members(spec, {"select": ["FT lr 0.001"]}) == ["FT lr 0.001"]  # a name, not a prefix
        lr = "model.init_args.optimizer.init_args.lr"
        for family in ("FT lr", "NegGrad+ lr", "RL lr"):  # the learning rate is searched for every baseline
            assert len({arm.overrides[lr] for arm in spec.arms if arm.name.startswith(family)}) >= 5, family
    # the hand-set first version of each baseline is a point of its grid (or, for FT, its first 5 epochs)
    rows = {row["name"]: row for row in spec.settings["rows"]}
    for hand, selected in (("NegGrad+ hand-set", "NegGrad+ val-selected"), ("RL hand-set", "RL val-selected"),
                           ("TREW paper default (beta 10, T 0.1)", "TREW weights similarity, val-selected")):
        assert rows[hand]["final"] in members(spec, rows[selected]), hand
    ft_hand = next(arm for arm in spec.arms if arm.name == rows["FT hand-set"]["final"])
    assert ft_hand.overrides["model.init_args.optimizer.init_args.lr"] == 1e-3 and "FT lr 0.001" in members(
        spec, rows["FT val-selected"]) and ft_hand.name not in members(spec, rows["FT val-selected"])


def test_the_classifiers_have_distinct_model_seeds_and_one_data_split():
    spec = runner.load_spec("trew")
    arms = {arm.name: arm for arm in spec.arms}
    offsets = [arms[name].seed_offset for name in CLASSIFIERS]
    assert len(set(offsets)) == len(offsets) and arms["original"].seed_offset == 0
    assert [arm.name for arm in spec.arms[:5]] == list(CLASSIFIERS[:3]) + ["original", "retrain (2nd seed, floor)"]
    assert [arms[n].row for n in CLASSIFIERS] == [False, False, False, True, True]
    # every unlearning run keeps its best validation epoch on the TV to S, and is a grid point (no row of its own)
    for arm in spec.arms[5:]:
        callbacks = arm.overrides["trainer.callbacks"]
        checkpoint = callbacks[-1]
        assert checkpoint["class_path"].endswith("ModelCheckpoint") and not arm.row, arm.name
        assert checkpoint["init_args"] == {"monitor": "val/tv_to_reference", "mode": "min", "save_top_k": 1}
        assert arm.name.startswith("TREW") == (callbacks[0]["class_path"] == "callbacks.trew.TREWReweighting")


def test_unlearning_runs_start_from_the_original_and_validate_against_s(tmp_path):
    spec = runner.load_spec("trew", smoke=True)
    arm = next(a for a in spec.arms if a.name == "TREW beta 0")
    run = runner.Run(spec, arm, None, 0, tmp_path, tmp_path)
    with pytest.raises(runner.ExperimentError, match="no checkpoint of 'original' / 'selection S'"):
        prepare(run)

    class Done:
        def __init__(self, path):
            self.path = path

        def best_checkpoint(self):
            return self.path

    run.earlier = {"original": Done("o.ckpt"), "selection S": Done("s.ckpt"), "reference R": Done("r.ckpt")}
    assert prepare(run) == {"model.init_args.init_from": "o.ckpt", "model.init_args.reference_from": "s.ckpt"}
    classifier = runner.Run(spec, spec.arms[0], None, 0, tmp_path, tmp_path)
    assert prepare(classifier) == {}


def _untrained_classifier(seed: int):
    from lightning_modules.shared.classifier import ImageClassifier

    torch.manual_seed(seed)
    return ImageClassifier(backbone="mlp", num_classes=10, in_channels=1, image_size=8, hidden_dim=16).eval()


def test_selection_reads_the_selection_model_and_the_test_metric_the_reference():
    from datamodules.images import ImageClassificationDataModule

    data = ImageClassificationDataModule(dataset="digits", forget_class=8, seed=0)
    data.setup("fit")
    reference, shadow, selection = (_untrained_classifier(s) for s in (1, 2, 3))
    evaluator = Evaluator(data, reference, shadow, selection, forget_class=8, seed=0)
    assert evaluator.validation_tv(selection) == 0.0 and evaluator.validation_tv(reference) > 0.05
    on_reference, on_selection = evaluator.metrics(reference), evaluator.metrics(selection)
    assert on_reference["tv_to_retrain"] == 0.0 and on_reference["val_tv_to_selection"] > 0.05
    assert on_selection["val_tv_to_selection"] == 0.0 and on_selection["tv_to_retrain"] > 0.05
    for same in ((reference, shadow, reference), (reference, reference, selection)):
        with pytest.raises(ValueError, match="different models"):
            Evaluator(data, *same, forget_class=8, seed=0)


def test_select_takes_the_lowest_validation_tv_and_the_first_on_ties():
    records = [{"val_tv": tv, "config": {"lr": lr}} for tv, lr in ((0.3, 1e-4), (0.1, 1e-3), (0.1, 1e-2))]
    assert select(records)["config"] == {"lr": 1e-3}
