"""PPO's math (token rewards, GAE, whitening, the clipped value loss, explained variance): by hand, and against verl's.

verl's loop and whitening are restated below from volcengine/verl@b178a3c (Apache-2.0),
`verl/trainer/ppo/core_algos.py::compute_gae_advantage_return` and `verl/utils/torch_functional.py::masked_whiten`,
so the comparison runs without installing verl.
"""

from __future__ import annotations

import pytest
import torch

from rl_assets.train.advantages import gae_advantages, token_rewards, whiten
from rl_assets.train.losses import explained_variance, policy_loss, value_loss


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    nextvalues, lastgaelam, reversed_advantages = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        reversed_advantages.append(lastgaelam)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    return advantages, advantages + values


def verl_masked_whiten(values, mask):
    mean = (values * mask).sum() / (mask.sum() + 1e-8)
    variance = (((values - mean) ** 2) * mask).sum() / (mask.sum() + 1e-8) * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def test_gae_by_hand_on_a_three_token_completion():
    # r = (0, 0, 1), V = (0.2, 0.4, 0.6), gamma 0.9, lambda 0.5:
    # delta_2 = 1 - 0.6 = 0.4;  delta_1 = 0.9 * 0.6 - 0.4 = 0.14;  delta_0 = 0.9 * 0.4 - 0.2 = 0.16
    # A_2 = 0.4;  A_1 = 0.14 + 0.45 * 0.4 = 0.32;  A_0 = 0.16 + 0.45 * 0.32 = 0.304
    advantages, returns = gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.6]]), torch.ones(1, 3), 0.9, 0.5)
    assert advantages[0].tolist() == pytest.approx([0.304, 0.32, 0.4])
    assert returns[0].tolist() == pytest.approx([0.504, 0.72, 1.0])


def test_lambda_one_gives_monte_carlo_returns_and_lambda_zero_one_step_td():
    rewards, values, mask = torch.tensor([[0.0, 0.5, 1.0]]), torch.tensor([[0.3, 0.1, 0.7]]), torch.ones(1, 3)
    _, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert returns[0].tolist() == pytest.approx([1.5, 1.5, 1.0])  # the sum of the rewards to come, whatever the values
    advantages, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.0)
    assert advantages[0].tolist() == pytest.approx([0.0 + 0.1 - 0.3, 0.5 + 0.7 - 0.1, 1.0 - 0.7])


def test_gae_equals_verls_on_a_crafted_batch_with_padding_and_an_environments_tokens():
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0],      # a short completion, padded
                         [1, 1, 0, 0, 1, 1],      # an episode: two tool tokens between the policy's turns
                         [1, 1, 1, 1, 1, 1]], dtype=torch.float32)
    kl = torch.randn(3, 6, generator=generator) * 0.1
    rewards = token_rewards(torch.tensor([1.0, -0.5, 2.0]), mask, kl=kl, kl_coef=0.05)
    values = torch.randn(3, 6, generator=generator)
    ours, our_returns = gae_advantages(rewards, values, mask, gamma=0.99, lam=0.95)
    theirs, their_returns = verl_gae(rewards, values, mask, 0.99, 0.95)
    on = mask.bool()
    assert torch.allclose(ours[on], theirs[on], atol=1e-6) and torch.allclose(our_returns[on], their_returns[on], atol=1e-6)
    assert not ours[~on].any() and not our_returns[~on].any()  # off the policy's tokens: nothing to learn from
    assert torch.allclose(whiten(ours, mask)[on], verl_masked_whiten(theirs, mask)[on], atol=1e-5)


def test_token_rewards_put_the_score_on_the_last_policy_token_and_the_kl_on_every_one():
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    rewards = token_rewards(torch.tensor([3.0, 5.0]), mask, kl=torch.full((2, 5), 2.0), kl_coef=0.5)
    assert rewards.tolist() == [[-1.0, -1.0, 0.0, 2.0, 0.0], [0.0] * 5]  # a row with no policy token gets nothing


def test_whitened_advantages_have_zero_mean_and_unit_variance_on_the_mask():
    values, mask = torch.randn(4, 7, generator=torch.Generator().manual_seed(1)) * 3 + 5, (torch.rand(4, 7, generator=torch.Generator().manual_seed(2)) > 0.3).float()
    out = whiten(values, mask)
    on = mask.bool()
    assert out[on].mean().item() == pytest.approx(0.0, abs=1e-5) and out[on].std().item() == pytest.approx(1.0, abs=1e-4)
    assert not out[~on].any()
    kept = whiten(values, mask, shift_mean=False)
    assert kept[on].mean().item() == pytest.approx(values[on].mean().item(), abs=1e-4)


def test_the_value_loss_stops_pulling_an_estimate_that_moved_past_the_clip():
    old, returns, mask = torch.zeros(1, 2), torch.tensor([[2.0, 0.0]]), torch.ones(1, 2)
    values = torch.tensor([[1.0, 0.0]], requires_grad=True)
    loss, metrics = value_loss(values, old, returns, mask, clip=0.5)
    loss.backward()
    # token 0 moved 1.0 from its old 0 (clip 0.5): the clipped term (0.5 - 2)^2 = 2.25 is the larger, and its gradient is 0
    assert loss.item() == pytest.approx(0.5 * (2.25 + 0.0) / 2) and metrics["value_clip_fraction"] == 0.5
    assert values.grad.tolist() == [[0.0, 0.0]]
    values.grad = None
    unclipped, _ = value_loss(values, old, returns, mask, clip=None)
    unclipped.backward()
    assert values.grad[0].tolist() == pytest.approx([(1.0 - 2.0) / 2, 0.0])  # 0.5 * 2 (V - R) / tokens


def test_the_value_loss_over_uneven_micro_batches_is_the_whole_minibatchs_mean():
    """num_items: two micro-batches (or two processes, each averaged by DDP) with 3 and 1 tokens give the gradient of one
    mean over the 4 tokens; a per-micro-batch mean would weigh the lone token three times as much."""
    old, returns = torch.zeros(2, 3), torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    whole = torch.zeros(2, 3, requires_grad=True)
    value_loss(whole, old, returns, mask, clip=None)[0].backward()
    for processes in (1, 2):
        split = torch.zeros(2, 3, requires_grad=True)
        for row in (0, 1):  # each micro-batch (or process) a row; accumulation divides by 2, DDP averages 2 processes
            loss, _ = value_loss(split[row : row + 1], old[row : row + 1], returns[row : row + 1], mask[row : row + 1], clip=None,
                                 num_items=mask.sum().item() / (2 // processes), num_processes=processes)
            (loss / (2 // processes) / processes).backward()
        assert torch.allclose(split.grad, whole.grad), processes
    naive = torch.zeros(2, 3, requires_grad=True)
    for row in (0, 1):
        (value_loss(naive[row : row + 1], old[row : row + 1], returns[row : row + 1], mask[row : row + 1], clip=None)[0] / 2).backward()
    assert not torch.allclose(naive.grad, whole.grad)


def test_explained_variance_is_one_for_a_perfect_value_model_and_zero_for_the_mean():
    returns, mask = torch.tensor([[1.0, 2.0, 3.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.0), returns, mask) == pytest.approx(0.0)
    assert explained_variance(torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4)) != explained_variance(torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4))  # NaN


def test_the_policy_loss_takes_one_advantage_per_token():
    logprobs, mask = torch.zeros(2, 3), torch.ones(2, 3)
    per_completion, _ = policy_loss(logprobs, logprobs, torch.tensor([1.0, -1.0]), mask)
    per_token, _ = policy_loss(logprobs, logprobs, torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]), mask)
    assert per_token.item() == per_completion.item()
    varied, _ = policy_loss(logprobs, logprobs, torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), mask)
    assert varied.item() == pytest.approx(-0.5)  # -(3 / 3 tokens + 0) / 2 completions
