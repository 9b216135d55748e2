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
