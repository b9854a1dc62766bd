"""losses.py: the GRPO loss, its gradients and metrics against a per-sample, per-token Python loop."""

from __future__ import annotations

import math

import pytest
import torch

from rl_assets.losses import grpo_loss


def random_batch(seed: int, N: int = 6, T: int = 7):
    """float64 inputs whose ratios fall both inside and outside the clip range, with ragged masks."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    logprobs = old + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.4
    ref = old + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.3
    advantages = torch.randn(N, generator=g, dtype=torch.float64)
    advantages[0], advantages[1] = abs(advantages[0]) + 0.1, -abs(advantages[1]) - 0.1  # both signs
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mask[2] = (torch.rand(T, generator=g) < 0.5).double()  # a non-prefix mask too
    mask[2, 0] = 1.0
    return logprobs, old, advantages, mask, ref


def naive_loss(logprobs, old, advantages, mask, eps, ref=None, beta=0.0):
    per_sample = []
    for i in range(logprobs.shape[0]):
        terms = []
        for t in range(logprobs.shape[1]):
            if mask[i, t] == 0:
                continue
            ratio = torch.exp(logprobs[i, t] - old[i, t])
            clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
            term = -torch.min(ratio * advantages[i], clipped * advantages[i])
            if beta:
                d = ref[i, t] - logprobs[i, t]
                term = term + beta * (torch.exp(d) - d - 1)
            terms.append(term)
        per_sample.append(sum(terms) / len(terms))
    return sum(per_sample) / len(per_sample)


def naive_metrics(logprobs, old, mask, eps, ref=None, beta=0.0, advantages=None):
    tokens = clipped = kl_old = kl_ref = 0.0
    for i in range(logprobs.shape[0]):
        for t in range(logprobs.shape[1]):
            if mask[i, t] == 0:
                continue
            tokens += 1
            ratio = math.exp(logprobs[i, t].item() - old[i, t].item())
            advantage = advantages[i].item()
            clipped += (ratio < 1 - eps and advantage < 0) or (ratio > 1 + eps and advantage > 0)
            kl_old += old[i, t].item() - logprobs[i, t].item()
            if beta:
                d = ref[i, t].item() - logprobs[i, t].item()
                kl_ref += math.exp(d) - d - 1
    return {"clip_fraction": clipped / tokens, "kl_old": kl_old / tokens, "kl_ref": kl_ref / tokens}


CASES = [(seed, eps, beta) for seed in range(3) for eps, beta in [(0.2, 0.0), (0.1, 0.0), (0.2, 0.05), (0.3, 1.0)]]


@pytest.mark.parametrize("seed,eps,beta", CASES)
def test_grpo_loss_and_gradient_match_a_naive_loop(seed, eps, beta):
    logprobs, old, advantages, mask, ref = random_batch(seed)
    ratio = torch.exp(logprobs - old)[mask.bool()]
    assert ((ratio - 1).abs() > eps).any() and ((ratio - 1).abs() <= eps).any()  # both clip regimes exercised

    fast_in = logprobs.clone().requires_grad_(True)
    loss, metrics = grpo_loss(fast_in, old, advantages, mask, clip_epsilon=eps, ref_logprobs=ref if beta else None, beta=beta)
    (fast_grad,) = torch.autograd.grad(loss, fast_in)

    slow_in = logprobs.clone().requires_grad_(True)
    expected = naive_loss(slow_in, old, advantages, mask, eps, ref, beta)
    (slow_grad,) = torch.autograd.grad(expected, slow_in)

    assert loss.item() == pytest.approx(expected.item(), rel=1e-12, abs=1e-12)
    assert torch.allclose(fast_grad, slow_grad, rtol=1e-10, atol=1e-12)
    assert (fast_grad[mask == 0] == 0).all()
    expected_metrics = naive_metrics(logprobs, old, mask, eps, ref, beta, advantages)
    assert metrics.keys() == expected_metrics.keys()
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_clip_fraction_counts_tokens_where_the_clip_is_active():
    old = torch.zeros(2, 3, dtype=torch.float64)
    logprobs = torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 9.0]], dtype=torch.float64))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    _, metrics = grpo_loss(logprobs, old, torch.tensor([1.0, -1.0], dtype=torch.float64), mask, clip_epsilon=0.2)
    # 1.5 with A > 0 and 0.7 with A < 0 are clipped; 0.5 with A > 0 is outside the range but its
    # unclipped term is the minimum (TRL's definition); 9.0 is padding
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)


def test_at_ratio_one_the_loss_is_minus_the_mean_advantage():
    logprobs, _, advantages, mask, _ = random_batch(5)
    leaf = logprobs.clone().requires_grad_(True)
    loss, metrics = grpo_loss(leaf, logprobs, advantages, mask)
    loss.backward()
    assert loss.item() == pytest.approx(-advantages.mean().item())
    expected_grad = -advantages[:, None] * mask / mask.sum(dim=1, keepdim=True) / len(advantages)
    assert torch.allclose(leaf.grad, expected_grad)
    assert metrics["clip_fraction"] == 0.0 and metrics["kl_old"] == 0.0 and metrics["kl_ref"] == 0.0


def test_padding_values_do_not_change_the_loss():
    logprobs, old, advantages, mask, ref = random_batch(7)
    noisy = logprobs + (1 - mask) * 123.0
    first, _ = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.1)
    second, _ = grpo_loss(noisy, old, advantages, mask, ref_logprobs=ref, beta=0.1)
    assert first.item() == pytest.approx(second.item(), rel=1e-12)


def test_beta_without_reference_raises():
    logprobs, old, advantages, mask, _ = random_batch(0)
    with pytest.raises(ValueError, match="beta > 0 needs ref_logprobs"):
        grpo_loss(logprobs, old, advantages, mask, beta=0.1)


def test_reference_is_ignored_when_beta_is_zero():
    logprobs, old, advantages, mask, ref = random_batch(1)
    with_ref, metrics = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.0)
    without, _ = grpo_loss(logprobs, old, advantages, mask)
    assert with_ref.item() == without.item() and metrics["kl_ref"] == 0.0


def test_k3_penalty_is_zero_at_the_reference_and_positive_elsewhere():
    logprobs, old, advantages, mask, ref = random_batch(2)
    base, _ = grpo_loss(logprobs, old, advantages, mask)
    same, metrics_same = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=logprobs.clone(), beta=1.0)
    other, metrics_other = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=1.0)
    assert same.item() == pytest.approx(base.item()) and metrics_same["kl_ref"] == 0.0
    assert other.item() > base.item() and metrics_other["kl_ref"] > 0
