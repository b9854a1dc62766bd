"""losses.py: the policy loss against a per-token Python loop and against TRL's own GRPO loss."""

from __future__ import annotations

import math

import pytest
import torch

from rl_assets.train.losses import LOSS_TYPES, policy_loss, sampler_importance_weights


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
    loss, metrics = policy_loss(fast_in, old, advantages, mask, epsilon=eps, ref_logprobs=ref if beta else None, beta=beta)
    (fast_grad,) = torch.autograd.grad(loss, fast_in)

    slow_in = logprobs.clone().requires_grad_(True)
    expected = naive_loss(slow_in, old, advantages, mask, eps, ref, beta)
    (slow_grad,) = torch.autograd.grad(expected, slow_in)

    assert loss.item() == pytest.approx(expected.item(), rel=1e-12, abs=1e-12)
    assert torch.allclose(fast_grad, slow_grad, rtol=1e-10, atol=1e-12)
    assert (fast_grad[mask == 0] == 0).all()
    expected_metrics = naive_metrics(logprobs, old, mask, eps, ref, beta, advantages)
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_clip_fraction_counts_tokens_where_the_clip_is_active():
    old = torch.zeros(2, 3, dtype=torch.float64)
    logprobs = torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 9.0]], dtype=torch.float64))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    _, metrics = policy_loss(logprobs, old, torch.tensor([1.0, -1.0], dtype=torch.float64), mask, epsilon=0.2)
    # 1.5 with A > 0 and 0.7 with A < 0 are clipped; 0.5 with A > 0 is outside the range but its
    # unclipped term is the minimum (TRL's definition); 9.0 is padding
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)


def test_at_ratio_one_the_loss_is_minus_the_mean_advantage():
    logprobs, _, advantages, mask, _ = random_batch(5)
    leaf = logprobs.clone().requires_grad_(True)
    loss, metrics = policy_loss(leaf, logprobs, advantages, mask)
    loss.backward()
    assert loss.item() == pytest.approx(-advantages.mean().item())
    expected_grad = -advantages[:, None] * mask / mask.sum(dim=1, keepdim=True) / len(advantages)
    assert torch.allclose(leaf.grad, expected_grad)
    assert metrics["clip_fraction"] == 0.0 and metrics["kl_old"] == 0.0 and metrics["kl_ref"] == 0.0


def test_padding_values_do_not_change_the_loss():
    logprobs, old, advantages, mask, ref = random_batch(7)
    noisy = logprobs + (1 - mask) * 123.0
    first, _ = policy_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.1)
    second, _ = policy_loss(noisy, old, advantages, mask, ref_logprobs=ref, beta=0.1)
    assert first.item() == pytest.approx(second.item(), rel=1e-12)


def test_beta_without_reference_raises():
    logprobs, old, advantages, mask, _ = random_batch(0)
    with pytest.raises(ValueError, match="beta > 0 needs ref_logprobs"):
        policy_loss(logprobs, old, advantages, mask, beta=0.1)


def test_reference_is_ignored_when_beta_is_zero():
    logprobs, old, advantages, mask, ref = random_batch(1)
    with_ref, metrics = policy_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.0)
    without, _ = policy_loss(logprobs, old, advantages, mask)
    assert with_ref.item() == without.item() and metrics["kl_ref"] == 0.0


def test_k3_penalty_is_zero_at_the_reference_and_positive_elsewhere():
    logprobs, old, advantages, mask, ref = random_batch(2)
    base, _ = policy_loss(logprobs, old, advantages, mask)
    same, metrics_same = policy_loss(logprobs, old, advantages, mask, ref_logprobs=logprobs.clone(), beta=1.0)
    other, metrics_other = policy_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=1.0)
    assert same.item() == pytest.approx(base.item()) and metrics_same["kl_ref"] == 0.0
    assert other.item() > base.item() and metrics_other["kl_ref"] > 0


# --- against TRL: its GRPOTrainer._compute_loss, run unbound on a stand-in trainer that hands it our tensors.


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def trl_loss(loss_type, logprobs, old, advantages, mask, epsilon, epsilon_high, ref=None, beta=0.0, num_items=None):
    """TRL's own GRPO loss on these tensors (float64), through the trainer method itself."""
    from collections import defaultdict
    from types import SimpleNamespace

    from trl import GRPOTrainer

    N, T = logprobs.shape
    stand_in = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        loss_type=loss_type, epsilon_low=epsilon, epsilon_high=epsilon_high, use_vllm=False, max_completion_length=T,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, accelerator=_Accelerator(),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics={"train": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long), "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long), "completion_mask": mask,
        "advantages": advantages, "old_per_token_logps": old,
        "num_items_in_batch": torch.tensor(mask.sum().item() if num_items is None else num_items, dtype=torch.float64),
    }
    if beta:
        inputs["ref_per_token_logps"] = ref
    loss = GRPOTrainer._compute_loss(stand_in, None, inputs)
    return loss, stand_in._metrics["train"]


TRL_CASES = [(loss_type, seed, eps, eps_high, beta) for loss_type in LOSS_TYPES for seed in (0, 1)
             for eps, eps_high, beta in [(0.2, 0.2, 0.0), (0.2, 0.28, 0.04), (0.1, 0.3, 0.0)]]


@pytest.mark.parametrize("loss_type,seed,eps,eps_high,beta", TRL_CASES)
def test_loss_and_gradient_match_trl_grpo(loss_type, seed, eps, eps_high, beta):
    logprobs, old, advantages, mask, ref = random_batch(seed)
    ours_in = logprobs.clone().requires_grad_(True)
    ours, metrics = policy_loss(ours_in, old, advantages, mask, loss_type=loss_type, epsilon=eps, epsilon_high=eps_high,
                                ref_logprobs=ref, beta=beta, max_completion_length=logprobs.shape[1], num_items=mask.sum().item())
    (our_grad,) = torch.autograd.grad(ours, ours_in)

    trl_in = logprobs.clone().requires_grad_(True)
    theirs, trl_metrics = trl_loss(loss_type, trl_in, old, advantages, mask, eps, eps_high, ref, beta)
    (trl_grad,) = torch.autograd.grad(theirs, trl_in)

    assert ours.dtype == torch.float64
    assert abs(ours.item() - theirs.item()) < 1e-6
    assert torch.allclose(our_grad, trl_grad, rtol=0, atol=1e-6)
    assert our_grad.abs().sum() > 0  # the comparison is not between two zeros
    assert metrics["clip_low"] == pytest.approx(trl_metrics["clip_ratio/low_mean"][0], abs=1e-9)
    assert metrics["clip_high"] == pytest.approx(trl_metrics["clip_ratio/high_mean"][0], abs=1e-9)
    assert metrics["clip_fraction"] == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=1e-9)
    if beta:
        assert metrics["kl_ref"] == pytest.approx(trl_metrics["kl"][0], abs=1e-9)


def test_loss_types_really_differ_on_ragged_lengths():
    logprobs, old, advantages, mask, _ = random_batch(3)
    values = {t: policy_loss(logprobs, old, advantages, mask, loss_type=t, max_completion_length=7)[0].item() for t in LOSS_TYPES}
    assert len({round(values[t], 9) for t in ("grpo", "bnpo", "dr_grpo")}) == 3
    assert values["dapo"] == pytest.approx(values["bnpo"], rel=1e-12)  # one process: both are the batch token mean


def test_dapo_over_two_processes_sums_to_the_one_process_loss():
    """DDP averages gradients, so dapo's per-rank normaliser is the global token count over the world size."""
    logprobs, old, advantages, mask, _ = random_batch(4)
    whole, _ = policy_loss(logprobs, old, advantages, mask, loss_type="dapo")
    total = mask.sum().item()
    halves = [policy_loss(logprobs[s], old[s], advantages[s], mask[s], loss_type="dapo", num_items=total, num_processes=2)[0]
              for s in (slice(0, 3), slice(3, 6))]
    assert (halves[0] + halves[1]).item() / 2 == pytest.approx(whole.item(), rel=1e-12)


def test_epsilon_high_only_widens_the_upper_clip():
    old = torch.zeros(1, 2, dtype=torch.float64)
    logprobs = torch.log(torch.tensor([[1.25, 0.75]], dtype=torch.float64))
    mask = torch.ones(1, 2, dtype=torch.float64)
    _, symmetric = policy_loss(logprobs, old, torch.tensor([1.0], dtype=torch.float64), mask, epsilon=0.2)
    _, wider = policy_loss(logprobs, old, torch.tensor([1.0], dtype=torch.float64), mask, epsilon=0.2, epsilon_high=0.3)
    assert symmetric["clip_high"] == 0.5 and wider["clip_high"] == 0.0


def test_unknown_loss_type_and_missing_length_are_errors():
    logprobs, old, advantages, mask, _ = random_batch(0)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        policy_loss(logprobs, old, advantages, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="dr_grpo' needs max_completion_length"):
        policy_loss(logprobs, old, advantages, mask, loss_type="dr_grpo")


def test_sampler_weights_scale_the_policy_term_and_cap_at_the_limit():
    torch.manual_seed(0)
    logprobs = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    old, advantages, mask = logprobs.detach() + 0.01, torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64)
    sampler = old - torch.tensor([[0.0, 0.1, 5.0, -0.2]] * 3, dtype=torch.float64)  # the sampler gave these tokens lower/higher prob
    weights = sampler_importance_weights(old, sampler, mask, cap=3.0)
    assert torch.allclose(weights[0], torch.tensor([1.0, math.exp(0.1), 3.0, math.exp(-0.2)], dtype=torch.float64))
    plain, _ = policy_loss(logprobs, old, advantages, mask, loss_type="bnpo")
    weighted, _ = policy_loss(logprobs, old, advantages, mask, loss_type="bnpo", sampler_weights=weights)
    ratio = torch.exp(logprobs - old)
    expected = (-torch.min(ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None]) * weights).mean()
    assert weighted.item() == pytest.approx(expected.item()) and weighted.item() != pytest.approx(plain.item())
