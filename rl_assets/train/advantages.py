"""Advantage estimators as pure tensor functions: one scalar advantage per completion.

Rewards come in prompt-major order, G consecutive samples per prompt, as the rollout table stores them.
"""

from __future__ import annotations

import torch


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)  # (B, G)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean, divided by a std chosen by `scale`.

    Args:
        rewards: (B * G,) rewards in prompt-major order, G consecutive samples per prompt.
        group_size: G.
        scale: "group" divides by the group's std (GRPO), "batch" by the std of the whole batch
            (Dr. GRPO's recommendation when scaling), "none" only centres (Dr. GRPO).
        eps: added to the std so all-equal groups get advantage 0 instead of NaN (TRL's 1e-4).
    Returns:
        (B * G,) advantages.

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=2).tolist()
    [0.7070..., -0.7070..., 0.0, 0.0]
    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=2, scale="none").tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    grouped = _grouped(rewards, group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1) if group_size > 1 else torch.zeros_like(rewards)
    elif scale == "batch":
        std = rewards.std().expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    elif scale == "none":
        return centred
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', not {scale!r}")
    return centred / (std + eps)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO: each reward minus the mean of the other G - 1 rewards of its group (leave-one-out baseline).

    Args:
        rewards: (B * G,) rewards in prompt-major order; G must be at least 2.
    Returns:
        (B * G,) advantages, equal to G / (G - 1) times the group-centred reward.

    >>> rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 2.0]), group_size=2).tolist()
    [1.0, -1.0, -2.0, 2.0]
    """
    if group_size < 2:
        raise ValueError("RLOO needs at least 2 samples per prompt (rollouts.samples_per_prompt >= 2)")
    grouped = _grouped(rewards, group_size)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others_mean).reshape(-1)


def reinforce_pp_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean, then whiten across the whole batch.

    The group mean removes the prompt's difficulty; the batch-level normalisation (instead of GRPO's
    per-group std) keeps easy and hard prompts on one scale (Hu et al., 2025; OpenRLHF's
    `reinforce_baseline`). Whitening here is per completion, as every token of a completion carries
    the same outcome advantage.

    Args:
        rewards: (B * G,) rewards in prompt-major order.
    Returns:
        (B * G,) advantages with mean 0 and std 1 over the batch (all 0 when every group is flat).

    >>> [round(a, 4) for a in reinforce_pp_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), group_size=2).tolist()]
    [1.2247, -1.2247, 0.0, 0.0]
    """
    grouped = _grouped(rewards, group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    std = centred.std() if centred.numel() > 1 else centred.new_zeros(())
    return (centred - centred.mean()) / (std + eps)


def equal_reward_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups have G equal rewards: every estimator here gives their rows advantage 0, so no policy gradient.

    Args:
        rewards: (B * G,) rewards in prompt-major order.
    Returns:
        (B,) bool, True for a group whose rewards are all equal (a group of one always is).

    >>> equal_reward_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), group_size=2).tolist()
    [True, False]
    """
    grouped = _grouped(rewards, group_size)
    return grouped.max(dim=1).values == grouped.min(dim=1).values


def informative_rows(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B * G,) bool: True for the rows of groups whose rewards differ (DAPO's dynamic-sampling filter keeps these).

    Args:
        rewards: (B * G,) rewards in prompt-major order.

    >>> informative_rows(torch.tensor([1.0, 1.0, 0.0, 1.0]), group_size=2).tolist()
    [False, False, True, True]
    """
    return (~equal_reward_groups(rewards, group_size)).repeat_interleave(group_size)


def equal_reward_group_share(rewards: torch.Tensor, group_size: int) -> float:
    """Share of groups whose G rewards are all equal (they carry no group-relative signal).

    Args:
        rewards: (B * G,) rewards in prompt-major order.
    """
    return equal_reward_groups(rewards, group_size).float().mean().item()


# --- PPO with a value model: per-token rewards, GAE, whitening ------------------------------------------------------------


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards of classic RLHF PPO: the sequence's score on its last policy token, minus kl_coef x KL on every token.

    Args:
        scores: (N,) one reward per completion (the rewards table's `reward`).
        mask: (N, T) 1 on the policy's tokens, 0 on padding (and on tool tokens of an episode).
        kl: (N, T) per-token KL estimate to the reference, log pi_old - log pi_ref (k1), or None.
        kl_coef: its weight (train.beta with train.kl_in_reward).
    Returns:
        (N, T) rewards, 0 off the mask. A completion without policy tokens gets none.

    >>> token_rewards(torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])).tolist()
    [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]]
    >>> token_rewards(torch.tensor([1.0]), torch.tensor([[1.0, 1.0]]), kl=torch.tensor([[0.5, -1.0]]), kl_coef=0.5).tolist()
    [[-0.25, 1.5]]
    """
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float() * mask
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=1).values  # (N,): the last policy token, -1 for none
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] += scores[rows].float()
    return rewards


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                   lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each completion's policy tokens (Schulman et al., 2016).

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where t + 1 is the next
    policy token: tokens off the mask (an environment's reply inside an episode, padding) are skipped, as verl
    does for multi-turn rollouts, and the value after the last policy token is 0 (the episode ended).

    Args:
        rewards: (N, T) per-token rewards (`token_rewards`).
        values: (N, T) the value model's estimate at each token, from before this round's update.
        mask: (N, T) 1 on policy tokens.
        gamma: discount per policy token (1.0 for language: the score comes at the end).
        lam: GAE's lambda, the bias/variance trade-off (1.0: Monte-Carlo returns, 0.0: one-step TD).
    Returns:
        (advantages, returns), both (N, T), 0 off the mask; returns = advantages + values are the value model's targets.

    >>> advantages, returns = gae_advantages(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), 1.0, 0.5)
    >>> advantages.tolist(), returns.tolist()
    ([[0.125, 0.75]], [[0.625, 1.0]])
    >>> gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.25]]), torch.tensor([[1.0, 0.0, 1.0]]), 1.0, 0.5)[0].tolist()
    [[0.125, 0.0, 0.75]]
    """
    mask = mask.float()
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    next_value = rewards.new_zeros(rewards.shape[0], dtype=torch.float32)  # (N,): V of the next policy token; 0 after the last
    next_advantage = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        on = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(on > 0, advantage, 0.0)
        next_value = torch.where(on > 0, values[:, t].float(), next_value)  # a skipped token passes the later ones through
        next_advantage = torch.where(on > 0, advantage, next_advantage)
    returns = (advantages + values.float()) * mask
    return advantages, returns


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise `values` to unit variance (and zero mean, with `shift_mean`) over the masked tokens of the batch.

    Args:
        values: (N, T), e.g. GAE advantages.
        mask: (N, T) 1 on the tokens that count.
    Returns:
        (N, T), 0 off the mask.

    >>> whiten(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1.0, 1.0, 0.0]])).tolist()
    [[-0.7071..., 0.7071..., 0.0]]
    """
    mask = mask.float()
    count = mask.sum().clamp(min=1.0)
    mean = (values * mask).sum() / count
    variance = (((values - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1.0)  # unbiased, as verl's masked_whiten
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask
