"""experiments/phyb_d3rlpy.py: the exact data hand-over to d3rlpy (conversion and checksum), the argument checks, and
(with d3rlpy installed) a smoke run."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from experiments import phyb_d3rlpy as exp
from lightning_modules.shared.errors import UserInputError


def transitions(n: int = 7, terminal: tuple[int, ...] = (2, 6)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    done = np.zeros(n, np.float32)
    done[list(terminal)] = 1.0
    return {"obs": rng.normal(size=(n, 3)).astype(np.float32), "act": rng.uniform(-1, 1, (n, 1)).astype(np.float32),
            "rew": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
            "done": done}


def test_episode_rows_give_back_the_transitions_exactly():
    data = transitions()
    rows = exp.to_episodes(data)
    # 5 non-terminal transitions take 2 rows, 2 terminal ones 1 row; every episode ends in a terminal or a time-out
    assert len(rows["observations"]) == 5 * 2 + 2
    assert int(rows["terminals"].sum()) == 2 and int(rows["timeouts"].sum()) == 5
    back = exp.from_episodes(rows)
    np.testing.assert_array_equal(back["obs"], data["obs"])
    np.testing.assert_array_equal(back["next_obs"][data["done"] == 0], data["next_obs"][data["done"] == 0])
    # d3rlpy gives a terminal transition a zero next state; it is unused (done = 1), so compare with that convention
    expected = dict(data, next_obs=np.where(data["done"][:, None] > 0, 0.0, data["next_obs"]).astype(np.float32))
    assert exp.checksum(back) == exp.checksum(expected)


def test_checksum_sees_a_single_changed_value_and_the_shapes():
    data = transitions(terminal=())
    changed = {k: v.copy() for k, v in data.items()}
    changed["rew"][3] += 1e-3
    assert exp.checksum(changed) != exp.checksum(data)
    assert exp.checksum({k: v[:-1] for k, v in data.items()}) != exp.checksum(data)
    with pytest.raises(UserInputError, match="one row per transition"):
        exp.to_episodes(dict(data, rew=data["rew"][:-1]))


def test_split_is_the_phyb_experiments_split():
    """Seed 1 at the reference's 20,000 transitions: both PhyB configs give the same 18,000-row training split
    (`split_for_seed` raises otherwise), and the split is the datamodule's own arrays."""
    _, arrays, digest = exp.split_for_seed(1, 20000, 10000)
    assert len(arrays["obs"]) == 18000 and arrays["act"].shape == (18000, 1)
    _, again, digest_again = exp.split_for_seed(1, 20000, 10000)
    assert digest == digest_again == exp.checksum(again)
    assert digest != exp.split_for_seed(2, 20000, 10000)[2]


def test_reference_rows_are_read_per_seed():
    config, rows = exp.load_reference(exp.REFERENCE, 5)
    assert config["steps"] == 10000 and config["transitions"] == 20000 and config["episodes"] == 20
    arms = exp.reference_arms(rows[0])
    assert set(arms) == set(exp.REFERENCE_ARMS)
    raw = json.loads(exp.REFERENCE.read_text())["per_seed"][0]
    assert arms["phyb"]["return"] == raw["pendulum/phyb"]["return"]



def test_a_runner_result_is_read_as_a_reference():
    """`python -m experiments phyb` writes its settings as per-arm overrides; the 500-step landed run reads as
    20,000 transitions, 500 training steps (trainer.max_steps 1000 counts critic and actor steps) and 20 episodes."""
    config, rows = exp.load_reference(exp.kit.RESULTS / "phyb.json", 3)
    assert (config["transitions"], config["steps"], config["episodes"]) == (20000, 500, 20)
    assert set(exp.reference_arms(rows[2])) == set(exp.REFERENCE_ARMS)

@pytest.mark.parametrize("argv, match", [(["--seeds", "0"], "at least 1"), (["--seeds", "6"], "lacks"),
                                         (["--steps", "500"], "differs from the 10000 steps"),
                                         (["--reward-scale", "0"], "must be positive"),
                                         (["--reference", "nope.json"], "no reference result")])
def test_bad_arguments_are_one_line_errors(argv, match, tmp_path):
    with pytest.raises(UserInputError, match=match):
        exp.main([*argv, "--out", str(tmp_path)])


@pytest.mark.skipif(importlib.util.find_spec("d3rlpy") is not None, reason="d3rlpy is installed")
def test_without_d3rlpy_the_error_names_the_install(tmp_path):
    with pytest.raises(UserInputError, match="pip install d3rlpy==2.8.1"):
        exp.main(["--smoke", "--seeds", "1", "--out", str(tmp_path)])


@pytest.mark.slow
def test_smoke_run_with_d3rlpy(tmp_path):
    pytest.importorskip("d3rlpy")
    result = exp.main(["--smoke", "--seeds", "1", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "phyb_d3rlpy.json").read_text())
    assert written["config"]["smoke"] and written["seeds"] == 1
    row = written["per_seed"][0]
    assert {*exp.LIBRARY_ARMS, *exp.REFERENCE_ARMS} <= set(row)
    for arm in exp.LIBRARY_ARMS:
        assert np.isfinite([row[arm][m] for m in exp.METRICS]).all()
        assert -200 * 16.3 <= row[arm]["return"] <= 0  # Pendulum's per-step reward lies in [-16.3, 0]
    assert written["seed_facts"][0]["train_sha256"] == exp.split_for_seed(0, 20000, 20)[2]
    assert set(result["paired"]) == {"phyb - d3rlpy_iql", "phyb - d3rlpy_td3_bc", "td3_bc - d3rlpy_td3_bc"}
