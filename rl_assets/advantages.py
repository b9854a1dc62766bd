"""Advantage estimators as pure tensor functions."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean, divided by the group's std when `scale`.

    Args:
        rewards: (B * G,) rewards in prompt-major order, G consecutive samples per prompt.
        group_size: G.
        scale: divide by the group standard deviation (GRPO); False gives Dr. GRPO's centring only.
        eps: added to the std so all-equal groups get advantage 0 instead of NaN.
    Returns:
        (B * G,) advantages.

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=2).tolist()
    [0.7070..., -0.7070..., 0.0, 0.0]
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)  # (B, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale and group_size > 1:  # a group of one has no spread: its advantage is 0
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def equal_reward_group_share(rewards: torch.Tensor, group_size: int) -> float:
    """Share of groups whose G rewards are all equal (they carry no GRPO signal).

    Args:
        rewards: (B * G,) rewards in prompt-major order.
    """
    grouped = rewards.view(-1, group_size)
    return (grouped.max(dim=1).values == grouped.min(dim=1).values).float().mean().item()
