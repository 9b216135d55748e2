"""``experiments/trew.py``'s protocol: every selected arm gets the same validation budget, selection reads a
separately retrained model (never the test reference R), and the epoch read-off keeps the best epoch."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import ScriptedScores
from experiments import kit
from experiments.trew import (HAND_SET, MODEL_SEEDS, EpochReadOff, Evaluator, Run, grid_points, parse_args,
                              select)


@pytest.mark.parametrize("argv", [[], ["--smoke"]])
def test_every_selected_arm_chooses_from_as_many_points_as_trew(argv):
    args = parse_args(argv)
    points = grid_points(args)
    assert set(points) == {"TREW weights similarity", "TREW confusion similarity", "FT", "NegGrad+", "RL"}
    assert len(set(points.values())) == 1, points
    if not argv:
        assert points["FT"] == 125 and len(args.lr_grid) >= 5   # learning rate searched for every baseline
    # the hand-set first version of each baseline is a point of its grid (read off the same runs)
    assert HAND_SET["lr"] in args.lr_grid
    assert HAND_SET["neggrad_weight"] in args.neggrad_weight_grid and HAND_SET["rl_weight"] in args.rl_weight_grid


def test_the_retrained_models_have_distinct_seeds():
    assert len(set(MODEL_SEEDS.values())) == len(MODEL_SEEDS)
    assert MODEL_SEEDS["selection"] not in (MODEL_SEEDS["reference"], MODEL_SEEDS["floor"], MODEL_SEEDS["shadow"])


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


def test_epoch_readoff_keeps_the_lowest_epoch_and_a_fixed_length_snapshot():
    torch.manual_seed(0)
    scores = [0.5, 0.2, 0.4, 0.2]   # best at epoch 2 (1-based); the later tie must not replace it
    module = ScriptedScores(scores, "val/tv_to_reference")
    readoff = EpochReadOff(snapshot_epoch=3)
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    kit.quiet_trainer([readoff], max_epochs=len(scores)).fit(module, loader, loader)
    assert readoff.scores == pytest.approx(scores)
    assert readoff.best_epoch == 2 and readoff.best_score == pytest.approx(0.2)
    for key, value in readoff.snapshot.items():
        assert torch.equal(value, module.snapshots[2][key]), key
    readoff.restore(module)
    for key, value in module.state_dict().items():
        assert torch.equal(value, module.snapshots[1][key]), key


def test_select_takes_the_lowest_validation_tv_and_the_first_on_ties():
    runs = [Run(torch.nn.Identity(), tv, 1, {"lr": lr}) for tv, lr in ((0.3, 1e-4), (0.1, 1e-3), (0.1, 1e-2))]
    assert select(runs).config == {"lr": 1e-3}
