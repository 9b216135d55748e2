"""Rollout allocators (Knapsack RL, DARS, uniform) against hand values, brute force and the released code."""
from __future__ import annotations

import io
import itertools
import math

import pytest
import torch

from lightning_modules.rlvr.rollout_allocation import (DARSAllocator, KnapsackAllocator, RolloutAllocator,
                                                  UniformAllocator, allocate_budget, cumulative_advantage_per_rollout,
                                                  dars_extra_rollouts, greedy_extra_rollouts, knapsack_value,
                                                  prob_nonzero_gradient, released_dp_extra_rollouts, rollout_cost)
from lightning_modules.shared.errors import UserInputError

# a 12-prompt worked example: two never-solved, two always-solved and eight effective prompts, n = 8
WORKED_P = torch.tensor([0, 0, 1, 1, .05, .1, .2, .33, .5, .7, .9, .95], dtype=torch.float64)


def _objective(p, alloc):
    return float(knapsack_value(alloc.double(), p).sum())


# --------------------------------------------------------------------------------------------- value
def test_value_matches_hand_computation():
    assert float(prob_nonzero_gradient(8, 0.5)) == pytest.approx(1 - 2 / 256)
    assert float(knapsack_value(8, 0.5)) == pytest.approx((1 - 2 / 256) * 0.5 * 0.25)
    assert float(knapsack_value(2, 0.1)) == pytest.approx((1 - 0.01 - 0.81) * 0.1 * 0.81)
    assert float(knapsack_value(5, 0.0)) == 0.0 and float(knapsack_value(5, 1.0)) == 0.0
    assert float(rollout_cost(torch.tensor(0.01))) == pytest.approx(math.log(0.1) / math.log(0.99))
    assert float(rollout_cost(torch.tensor(0.01), "expectation")) == pytest.approx(1 / 0.0099 - 1, rel=1e-6)


def test_value_is_increasing_and_concave_in_n():
    p = torch.linspace(0.01, 0.99, 99, dtype=torch.float64)[:, None]
    n = torch.arange(1, 130, dtype=torch.float64)[None, :]
    v = knapsack_value(n, p)
    first = v[:, 1:] - v[:, :-1]
    assert (first >= -1e-15).all()
    assert (first[:, 1:] - first[:, :-1] <= 1e-15).all()


# --------------------------------------------------------------------------------------------- knapsack
def test_worked_example_released_dp_and_exact_greedy():
    # the released DP's allocation was computed by running the released rule on these p
    valid = torch.ones(12, dtype=torch.bool)
    dp, _ = allocate_budget(WORKED_P, valid, 8, solver="dp", max_n=128)
    assert dp.tolist() == [2, 2, 2, 2, 19, 21, 16, 10, 8, 9, 3, 2]
    greedy, _ = allocate_budget(WORKED_P, valid, 8, solver="greedy", max_n=128)
    assert greedy.tolist() == [2, 2, 2, 2, 19, 21, 16, 11, 8, 9, 2, 2]
    assert int(greedy.sum()) == int(dp.sum()) == 96
    # the released DP's k = 0 quirk costs true value: greedy is strictly better on the real objective
    assert _objective(WORKED_P, greedy) > _objective(WORKED_P, dp)


def _brute_force(p, base, max_extra, budget, quirk=False):
    best = -math.inf
    for ks in itertools.product(range(max_extra + 1), repeat=len(p)):
        if sum(ks) != budget:
            continue
        k = torch.tensor(ks)
        values = knapsack_value((base + k).double(), p)
        if quirk:
            values = torch.where(k > 0, values, torch.zeros_like(values))
        else:
            values = values - knapsack_value(torch.full_like(values, base), p)
        best = max(best, float(values.sum()))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_greedy_and_released_dp_equal_brute_force_on_tiny_instances(seed):
    gen = torch.Generator().manual_seed(seed)
    n_items = int(torch.randint(1, 5, (1,), generator=gen))
    p = torch.rand(n_items, generator=gen, dtype=torch.float64) * 0.98 + 0.01
    base, max_extra = 2, int(torch.randint(1, 5, (1,), generator=gen))
    budget = int(torch.randint(0, n_items * max_extra + 1, (1,), generator=gen))
    extra = greedy_extra_rollouts(p, base, max_extra, budget)
    assert int(extra.sum()) == budget and int(extra.max()) <= max_extra and int(extra.min()) >= 0
    gain = float((knapsack_value((base + extra).double(), p) - knapsack_value(float(base), p)).sum())
    assert gain == pytest.approx(_brute_force(p, base, max_extra, budget), abs=1e-12)
    released = released_dp_extra_rollouts(p, base, max_extra, budget)
    assert int(released.sum()) == budget
    quirk_gain = float(torch.where(released > 0, knapsack_value((base + released).double(), p), 0.0).sum())
    assert quirk_gain == pytest.approx(_brute_force(p, base, max_extra, budget, quirk=True), abs=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_allocation_spends_exactly_the_budget_and_respects_bounds(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    m, n, min_n, max_n = 32, 8, 2, 24
    p = torch.rand(m, generator=gen, dtype=torch.float64)
    p[torch.rand(m, generator=gen) < 0.2] = 0.0
    p[torch.rand(m, generator=gen) < 0.2] = 1.0
    valid = torch.rand(m, generator=gen) < 0.8
    for cost in ("probability", "expectation"):
        alloc, _ = allocate_budget(p, valid, n, min_n=min_n, max_n=max_n, cost_estimation=cost)
        assert int(alloc.sum()) == m * n
        assert int(alloc.min()) >= min_n and int(alloc.max()) <= max_n
        assert (alloc[~valid] >= n).all()
        released, _ = allocate_budget(p, valid, n, min_n=min_n, max_n=max_n, cost_estimation=cost, solver="dp")
        assert int(released.sum()) == m * n


def test_saturated_and_unsolved_prompts_get_their_minimum_without_fallback():
    p = torch.tensor([1.0, 1.0, 0.0, 0.1, 0.2, 0.05], dtype=torch.float64)
    alloc, info = allocate_budget(p, torch.ones(6, dtype=torch.bool), 8, min_n=2, max_n=64, positive_n=2,
                                  negative_n=3)
    assert info["fallback"] == 0.0
    assert alloc[:2].tolist() == [2, 2] and int(alloc[2]) == 3
    assert int(alloc.sum()) == 48 and (alloc[3:] > 2).all()


@pytest.mark.parametrize("cost, estimate, expected", [("probability", 12, [30, 8, 8, 2]),
                                                      ("expectation", 6, [36, 5, 5, 2])])
def test_fallback_hands_the_surplus_to_unsolved_prompts(cost, estimate, expected):
    # p = 0.3: probability cost ln(0.1)/ln(0.7) = 6.46 -> 6 each, expectation 1/0.21 - 1 = 3.76 -> 3 each;
    # remaining after the minimum of 2 each: 48 - 8 = 40 > estimate, so 40 - estimate goes to the p = 0 prompt
    p = torch.tensor([0.0, 0.3, 0.3, 1.0], dtype=torch.float64)
    alloc, info = allocate_budget(p, torch.ones(4, dtype=torch.bool), 12, min_n=2, max_n=64, cost_estimation=cost)
    assert info["fallback"] == 1.0 and info["fallback_effective_ratio"] == pytest.approx(estimate / 40)
    assert alloc.tolist() == expected  # the saturated prompt gets nothing extra while an unsolved one exists
    no_fallback, info = allocate_budget(p, torch.ones(4, dtype=torch.bool), 12, min_n=2, max_n=64,
                                        allow_fallback=False)
    assert info["fallback"] == 0.0 and no_fallback.tolist() == [2, 22, 22, 2]
    everyone_effective, info = allocate_budget(torch.full((3,), 0.5), torch.ones(3, dtype=torch.bool), 8)
    assert info["fallback"] == 0.0 and everyone_effective.tolist() == [8, 8, 8]  # released code divides by 0


def test_no_effective_prompts_follow_the_released_rules():
    valid = torch.ones(4, dtype=torch.bool)
    alloc, _ = allocate_budget(torch.tensor([0.0, 0.0, 1.0, 1.0]), valid, 8, min_n=2, max_n=64)
    assert alloc.tolist() == [14, 14, 2, 2]
    alloc, _ = allocate_budget(torch.tensor([1.0, 1.0, 1.0]), torch.ones(3, dtype=torch.bool), 8)
    assert alloc.tolist() == [8, 8, 8]
    capped, _ = allocate_budget(torch.tensor([0.0, 1.0, 1.0, 1.0]), valid, 8, min_n=2, max_n=10)
    assert int(capped[0]) == 10 and int(capped.sum()) == 32 and int(capped.max()) <= 10


def test_unseen_prompts_get_the_uniform_share():
    alloc, _ = allocate_budget(torch.zeros(5), torch.zeros(5, dtype=torch.bool), 8)
    assert alloc.tolist() == [8] * 5


# --------------------------------------------------------------------------------------------- history
def _observe(allocator, ids, rewards_per_prompt):
    rewards = torch.cat([torch.tensor(r, dtype=torch.float32) for r in rewards_per_prompt])
    group = torch.cat([torch.full((len(r),), i) for i, r in enumerate(rewards_per_prompt)])
    perm = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(0))  # order must not matter
    allocator.observe(torch.tensor(ids), rewards[perm], group[perm])


def test_history_is_stale_by_one_visit_and_uses_the_robust_window():
    alloc = KnapsackAllocator(min_history=8, buffer_length=16)
    ids = torch.tensor([7])
    p, valid, count = alloc.estimates(ids)
    assert not valid.any() and count.tolist() == [0]
    _observe(alloc, [7], [[1, 0, 0, 0]])                      # 4 rewards: not valid yet
    assert not alloc.estimates(ids)[1].any()
    _observe(alloc, [7], [[1, 1, 1, 1]])                      # 8 rewards, visit < 16: mean of the last 8
    p, valid, count = alloc.estimates(ids)
    assert valid.all() and count.tolist() == [8] and float(p) == pytest.approx(5 / 8)
    _observe(alloc, [7], [[0] * 16])                         # a full visit of 16: that visit only
    assert float(alloc.estimates(ids)[0]) == 0.0
    _observe(alloc, [7], [[1] * 4])                          # short visit: last 16 = 12 zeros + 4 ones
    assert float(alloc.estimates(ids)[0]) == pytest.approx(4 / 16)
    moving = KnapsackAllocator(epoch_estimation=False, buffer_length=4)
    _observe(moving, [1], [[1] * 20])
    _observe(moving, [1], [[0, 0] * 10])
    assert float(moving.estimates(torch.tensor([1]))[0]) == 0.0


def test_plan_uses_history_from_previous_visits_only():
    alloc = KnapsackAllocator(min_n=2, max_n=32, min_history=8)
    ids = torch.tensor([0, 1, 2, 3])
    assert alloc.plan(ids, 8).tolist() == [8, 8, 8, 8]       # first epoch: uniform
    _observe(alloc, [0, 1, 2, 3], [[1] * 8, [0] * 8, [1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]])
    plan = alloc.plan(ids, 8)
    assert int(plan.sum()) == 32 and int(plan[0]) == 2
    assert alloc.metrics()["valid_prompts"] == 1.0 and alloc.metrics()["covered_prompts"] == 4.0
    assert set(alloc.metrics()) >= {"max_budget", "min_budget", "covered_prompts", "budget_fallback"}


def test_state_dict_round_trip_through_a_weights_only_checkpoint():
    alloc = KnapsackAllocator(max_n=32)
    _observe(alloc, [3, 9], [[1, 0] * 5, [0] * 3 + [1] * 7])
    buffer = io.BytesIO()
    torch.save({"allocator": alloc.state_dict()}, buffer)
    buffer.seek(0)
    restored = KnapsackAllocator(max_n=32)
    restored.load_state_dict(torch.load(buffer, weights_only=True)["allocator"])
    ids = torch.tensor([9, 3, 4])
    assert torch.equal(restored.plan(ids, 8), alloc.plan(ids, 8))
    assert restored.state_dict() == alloc.state_dict()
    with pytest.raises(UserInputError):
        restored.load_state_dict({})


def test_knapsack_allocator_rejects_bad_settings():
    with pytest.raises(UserInputError):
        KnapsackAllocator(min_n=4, max_n=2)
    with pytest.raises(UserInputError):
        KnapsackAllocator(solver="lp")
    with pytest.raises(UserInputError):
        KnapsackAllocator(cost_estimation="median")
    with pytest.raises(UserInputError, match="rollouts_per_prompt"):
        KnapsackAllocator(min_n=2, max_n=16).plan(torch.arange(4), 32)


def test_uniform_allocator_is_the_grpo_baseline():
    uni = UniformAllocator()
    assert isinstance(uni, RolloutAllocator)
    assert uni.plan(torch.arange(5), 8).tolist() == [8] * 5
    assert uni.second_stage(torch.arange(5), torch.full((5,), 8), torch.zeros(5)).tolist() == [0] * 5
    assert uni.metrics() == {} and uni.state_dict() == {}


# --------------------------------------------------------------------------------------------- DARS
@pytest.mark.parametrize("schedule, n_max, use_std, expected", [
    ("equal_treatment", 32, False, [24, 11, 3, 1, 0, 0, 0, 0, 0]),
    ("hardness_weighted", 64, False, [56, 24, 8, 3, 0, 0, 0, 0, 0]),
    ("equal_treatment", 32, True, [9, 5, 2, 1, 0, 0, 0, 0, 0]),
    ("hardness_weighted", 64, True, [23, 14, 6, 3, 0, 0, 0, 0, 0]),
])
def test_dars_delta_n_reproduces_the_schedule_table_of_the_official_code(schedule, n_max, use_std, expected):
    delta = dars_extra_rollouts(torch.full((9,), 8), torch.arange(9), schedule, n_max, use_std)
    assert delta.tolist() == expected


def test_dars_targets_equalise_cumulative_advantage():
    n = torch.full((7,), 16)
    correct = torch.arange(1, 8)
    a = correct / 16.0
    et = dars_extra_rollouts(n, correct, "equal_treatment", 10_000)
    s = cumulative_advantage_per_rollout(a)
    assert ((n + et) * s >= 8 - 1e-9).all() and ((n + et - 1) * s < 8).all()
    assert dars_extra_rollouts(torch.tensor([8, 0]), torch.tensor([0, 0]), "hardness_weighted", 64).tolist() == [56, 0]


def test_cumulative_advantage_identity():
    for n in range(2, 17):
        for c in range(n + 1):
            r = torch.zeros(n, dtype=torch.float64)
            r[:c] = 1.0
            a = c / n
            centred = (r - r.mean()).abs().sum()
            assert float(centred) == pytest.approx(2 * n * a * (1 - a))
            assert float(n * cumulative_advantage_per_rollout(torch.tensor(a))) == pytest.approx(float(centred))
            if 0 < c < n:
                std = r.std(unbiased=False)
                assert float(centred / std) == pytest.approx(float(n * cumulative_advantage_per_rollout(
                    torch.tensor(a), use_std=True)))


def test_cumulative_advantage_identity_holds_for_grpo_group_advantages():
    from lightning_modules.rlvr import grpo

    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    adv = grpo.group_advantages(rewards, group, scale_by_std=False)
    assert float(adv[:4].abs().sum()) == pytest.approx(2 * 4 * 0.25 * 0.75)
    assert float(adv[4:].abs().sum()) == pytest.approx(2 * 8 * (3 / 8) * (5 / 8))


def test_dars_allocator_two_stages_and_metrics():
    dars = DARSAllocator("equal_treatment", max_rollouts=32)
    ids = torch.arange(3)
    counts = dars.plan(ids, 8)
    assert counts.tolist() == [8, 8, 8]
    extra = dars.second_stage(ids, counts, torch.tensor([0, 1, 6]))
    assert extra.tolist() == [24, 11, 0]
    rewards = torch.cat([torch.zeros(8), torch.tensor([1.0] + [0] * 7), torch.ones(6), torch.zeros(2),
                         torch.tensor([1.0] + [0] * 23), torch.zeros(11)])
    group = torch.cat([torch.full((8,), 0), torch.full((8,), 1), torch.full((8,), 2), torch.full((24,), 0),
                       torch.full((11,), 1)])
    dars.observe(ids, rewards, group)
    assert dars.metrics() == {"2nd_rollout": 35.0, "2nd_prompts": pytest.approx(2 / 3), "2nd_saved": 1.0}
    with pytest.raises(UserInputError):
        DARSAllocator(max_rollouts=4).plan(ids, 8)
    with pytest.raises(UserInputError):
        DARSAllocator(schedule="focal")


# --------------------------------------------------------------------------------------------- claims
def _simulate(allocator, p_true, steps, batch, n, seed):
    """Binomial rollouts from fixed per-prompt success rates through plan/observe; response-level effective ratio."""
    gen = torch.Generator().manual_seed(seed)
    m = len(p_true)
    ratios = []
    for step in range(steps):
        ids = torch.arange(step * batch, (step + 1) * batch) % m
        counts = allocator.plan(ids, n)
        assert int(counts.sum()) == batch * n
        group = torch.repeat_interleave(torch.arange(batch), counts)
        rewards = (torch.rand(len(group), generator=gen) < p_true[ids][group]).float()
        correct = torch.zeros(batch).index_add_(0, group, rewards)
        mixed = (correct > 0) & (correct < counts)
        ratios.append(float((counts * mixed).sum() / counts.sum()))
        allocator.observe(ids, rewards, group)
    return sum(ratios[steps // 2:]) / (steps - steps // 2)


def test_knapsack_raises_the_response_level_effective_ratio_at_equal_budget():
    # a "mid-training" mix of success rates: 40% nearly solved, 20% nearly unsolved, 40% uniform in (0, 1)
    gen = torch.Generator().manual_seed(0)
    m = 256
    p = torch.rand(m, generator=gen)
    p[: int(0.4 * m)] = 0.95 + 0.05 * torch.rand(int(0.4 * m), generator=gen)
    p[int(0.4 * m): int(0.6 * m)] = 0.05 * torch.rand(int(0.2 * m), generator=gen)
    uniform = _simulate(UniformAllocator(), p, 96, 32, 8, seed=1)
    knapsack = _simulate(KnapsackAllocator(max_n=64), p, 96, 32, 8, seed=1)
    assert knapsack >= uniform + 0.1, (uniform, knapsack)


@pytest.mark.slow
def test_knapsack_experiment_reduced_claim(tmp_path):
    """The knapsack_rl experiment at 1 seed, a 1000-step SFT and 64 GRPO steps (~1-1.5 min on 2 cores):
    ``python -m experiments knapsack_rl --seeds 1 --set trainer.max_steps=1000 --set trainer.max_epochs=8``."""
    from experiments.runner import run_experiment

    result = run_experiment("knapsack_rl", seeds=1, out=tmp_path, overrides={
        "trainer.max_steps": 1000, "trainer.max_epochs": 8, "data.init_args.sft_num_examples": 64000})
    assert result["claim"]["difference_mean"] >= 0.05, result["claim"]
    assert (tmp_path / "knapsack_rl.json").is_file() and (tmp_path / "knapsack_rl.png").is_file()
