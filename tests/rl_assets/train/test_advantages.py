"""advantages.py: GRPO, RLOO and REINFORCE++ advantages against naive loops, and the signal-free groups (their share, the rows left)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from rl_assets.train.advantages import (equal_reward_group_share, equal_reward_groups, group_advantages, informative_rows, reinforce_pp_advantages,
                                  rloo_advantages)


def std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))  # unbiased, like torch.std


def naive_advantages(rewards: list[float], group_size: int, scale: str, eps: float = 1e-4) -> list[float]:
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        for r in group:
            if scale == "group":
                out.append((r - mean) / (std(group) + eps))
            elif scale == "batch":
                out.append((r - mean) / (std(rewards) + eps))
            else:
                out.append(r - mean)
    return out


def naive_rloo(rewards: list[float], group_size: int) -> list[float]:
    out = []
    for i, r in enumerate(rewards):
        start = i - i % group_size
        others = [rewards[j] for j in range(start, start + group_size) if j != i]
        out.append(r - sum(others) / len(others))
    return out


def naive_reinforce_pp(rewards: list[float], group_size: int) -> list[float]:
    centred = naive_advantages(rewards, group_size, "none")
    mean = sum(centred) / len(centred)
    return [(c - mean) / (std(centred) + 1e-8) for c in centred]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("B,G", [(1, 2), (3, 4), (7, 8), (5, 3)])
def test_group_advantages_match_a_naive_loop(B, G, scale):
    generator = torch.Generator().manual_seed(B * 100 + G)
    rewards = torch.randn(B * G, generator=generator, dtype=torch.float64) * 3 + 1
    expected = naive_advantages(rewards.tolist(), G, scale)
    assert torch.allclose(group_advantages(rewards, G, scale=scale), torch.tensor(expected, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_binary_rewards_match_a_naive_loop(scale):
    rewards = torch.randint(0, 2, (6 * 8,), generator=torch.Generator().manual_seed(0)).double()
    assert torch.allclose(group_advantages(rewards, 8, scale=scale), torch.tensor(naive_advantages(rewards.tolist(), 8, scale), dtype=torch.float64))


def test_advantages_centre_each_group():
    advantages = group_advantages(torch.randn(40, generator=torch.Generator().manual_seed(1)), 8).view(5, 8)
    assert torch.allclose(advantages.sum(dim=1), torch.zeros(5), atol=1e-5)


@pytest.mark.parametrize("scale", ["group", "none"])
def test_all_equal_groups_give_zero_not_nan(scale):
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    advantages = group_advantages(rewards, 3, scale=scale)
    assert not torch.isnan(advantages).any()
    assert advantages[:6].tolist() == [0.0] * 6
    assert advantages[6] > 0 > advantages[7]


@pytest.mark.parametrize("B,G", [(1, 2), (3, 4), (7, 8), (5, 3)])
def test_rloo_and_reinforce_pp_match_naive_loops(B, G):
    rewards = torch.randn(B * G, generator=torch.Generator().manual_seed(B + G), dtype=torch.float64) * 2
    assert torch.allclose(rloo_advantages(rewards, G), torch.tensor(naive_rloo(rewards.tolist(), G), dtype=torch.float64), atol=1e-12)
    expected = torch.tensor(naive_reinforce_pp(rewards.tolist(), G), dtype=torch.float64)
    assert torch.allclose(reinforce_pp_advantages(rewards, G), expected, atol=1e-9)


def test_rloo_is_the_centred_reward_scaled_by_g_over_g_minus_one():
    rewards = torch.randn(24, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    assert torch.allclose(rloo_advantages(rewards, 4), group_advantages(rewards, 4, scale="none") * 4 / 3)


def test_rloo_needs_two_samples_and_flat_groups_give_zero():
    with pytest.raises(ValueError, match="RLOO needs at least 2 samples"):
        rloo_advantages(torch.zeros(4), 1)
    assert rloo_advantages(torch.ones(6), 3).tolist() == [0.0] * 6
    assert reinforce_pp_advantages(torch.ones(6), 3).tolist() == [0.0] * 6


def test_unknown_scale_is_an_error():
    with pytest.raises(ValueError, match="scale must be 'group', 'batch' or 'none'"):
        group_advantages(torch.zeros(4), 2, scale=True)


def test_groups_of_one_give_zero_not_nan():
    assert group_advantages(torch.tensor([1.0, 0.0, 3.0]), 1).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("rewards,group_size", [
    (torch.zeros(2, 4), 4),  # not flat
    (torch.zeros(10), 4),  # not a whole number of groups
    (torch.zeros(()), 1),  # a scalar
])
def test_bad_shapes_raise(rewards, group_size):
    with pytest.raises(ValueError, match=re.escape(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")):
        group_advantages(rewards, group_size)


def test_equal_reward_group_share():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0])
    assert equal_reward_group_share(rewards, 2) == pytest.approx(2 / 3)
    assert equal_reward_group_share(rewards, 3) == 0.0
    assert equal_reward_group_share(torch.zeros(8), 4) == 1.0


def test_equal_reward_group_share_matches_a_naive_count():
    rewards = torch.randint(0, 2, (50 * 4,), generator=torch.Generator().manual_seed(2)).float()
    groups = [rewards[i : i + 4].tolist() for i in range(0, len(rewards), 4)]
    expected = sum(len(set(g)) == 1 for g in groups) / len(groups)
    assert 0 < expected < 1
    assert equal_reward_group_share(rewards, 4) == pytest.approx(expected)


def test_informative_rows_match_a_naive_loop():
    rewards = torch.randint(0, 2, (60 * 4,), generator=torch.Generator().manual_seed(3)).float()
    rewards[8:12] = 0.5  # equal but neither 0 nor 1
    expected = [len(set(rewards[i - i % 4 : i - i % 4 + 4].tolist())) > 1 for i in range(len(rewards))]
    assert 0 < sum(expected) < len(expected)
    assert informative_rows(rewards, 4).tolist() == expected
    assert equal_reward_groups(rewards, 4).tolist() == [not e for e in expected[::4]]


def test_groups_of_one_are_all_equal():
    assert not informative_rows(torch.tensor([1.0, 0.0, 3.0]), 1).any()


@pytest.mark.parametrize("estimator", [lambda r, g: group_advantages(r, g, scale="group"), lambda r, g: group_advantages(r, g, scale="batch"),
                                       rloo_advantages, reinforce_pp_advantages], ids=["group", "batch", "rloo", "reinforce_pp"])
def test_the_rows_left_out_are_exactly_those_with_zero_advantage(estimator):
    """What makes dropping them free: every estimator gives the rows of all-equal groups advantage 0, and no other row."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.3, 0.7, 2.0, 2.0])
    advantages = estimator(rewards, 2)
    assert ((advantages.abs() < 1e-6) == ~informative_rows(rewards, 2)).all()
