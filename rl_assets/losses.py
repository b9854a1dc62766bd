"""Policy-gradient losses as pure tensor functions."""

from __future__ import annotations

import torch


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip_epsilon: float = 0.2, ref_logprobs: torch.Tensor | None = None, beta: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Clipped-ratio GRPO loss with per-sequence aggregation (TRL's `loss_type="grpo"`).

    Args:
        logprobs: (N, T) per-token log-probs under the policy being trained.
        old_logprobs: (N, T) per-token log-probs stored at sampling time.
        advantages: (N,) one advantage per completion.
        mask: (N, T) 1 for completion tokens, 0 for padding.
        clip_epsilon: the ratio is clipped to [1 - eps, 1 + eps].
        ref_logprobs: (N, T) log-probs under the reference policy, needed when beta > 0.
        beta: weight of the k3 estimator of KL(policy || reference).
    Returns:
        (loss scalar, metrics) where metrics holds detached floats: clip_fraction (share of tokens whose
        clipped term is active), kl_old (mean old - new log-prob), kl_ref (mean k3 estimate).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages[:, None]
    clipped = torch.clamp(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * advantages[:, None]
    per_token = -torch.min(unclipped, clipped)
    kl_ref = torch.zeros_like(per_token)
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        kl_ref = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
        per_token = per_token + beta * kl_ref
    lengths = mask.sum(dim=1).clamp(min=1)
    loss = ((per_token * mask).sum(dim=1) / lengths).mean()
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)
        metrics = {
            # as TRL counts it: tokens where the clip is active for the sign of their advantage
            "clip_fraction": ((((ratio < 1 - clip_epsilon) & (advantages[:, None] < 0)) | ((ratio > 1 + clip_epsilon) & (advantages[:, None] > 0))).float() * mask).sum().item() / tokens.item(),
            "kl_old": (((old_logprobs - logprobs) * mask).sum() / tokens).item(),
            "kl_ref": ((kl_ref * mask).sum() / tokens).item(),
        }
    return loss, metrics
