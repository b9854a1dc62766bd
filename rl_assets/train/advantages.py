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
