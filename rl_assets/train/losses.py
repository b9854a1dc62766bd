"""Policy-gradient losses as pure tensor functions, aggregated the ways TRL's GRPO offers.

One clipped-ratio objective; the loss types differ only in how token terms are averaged:

    grpo     mean over each completion's tokens, then over completions (long answers weigh less per token)
    bnpo     mean over all tokens of the (local) batch
    dr_grpo  sum over tokens / (completions * max_completion_length): no length bias (Dr. GRPO)
    dapo     sum over tokens / tokens of the whole global minibatch (DAPO's token-level loss)
"""

from __future__ import annotations

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                loss_type: str = "grpo", epsilon: float = 0.2, epsilon_high: float | None = None,
                ref_logprobs: torch.Tensor | None = None, beta: float = 0.0, max_completion_length: int | None = None,
                num_items: float | None = None, num_processes: int = 1, sampler_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Clipped-ratio policy-gradient loss with an optional k3 KL penalty to a reference policy.

    Args:
        logprobs: (N, T) per-token log-probs under the policy being trained.
        old_logprobs: (N, T) per-token log-probs stored at sampling time.
        advantages: (N,) one advantage per completion, or (N, T) one per token (PPO's GAE).
        mask: (N, T) 1 for completion tokens that count, 0 for padding and masked (e.g. truncated) completions.
        loss_type: one of LOSS_TYPES (see the module docstring).
        epsilon: lower clip, the ratio is clipped to [1 - epsilon, 1 + epsilon_high].
        epsilon_high: upper clip (DAPO's clip-higher); None means epsilon.
        ref_logprobs: (N, T) log-probs under the reference policy, needed when beta > 0.
        beta: weight of the k3 estimator of KL(policy || reference).
        max_completion_length: dr_grpo's constant denominator (rollouts.max_new_tokens).
        num_items: dapo's denominator, the completion tokens of the global minibatch (all processes).
        num_processes: data-parallel processes; dapo multiplies by it because DDP averages gradients.
        sampler_weights: (N, T) truncated importance weights for a sampler that is not the trainer (vLLM), see
            `sampler_importance_weights`; they scale the policy term, not the KL penalty (as in TRL).
    Returns:
        (loss scalar, metrics): detached floats, token means over this call's unmasked tokens:
        clip_low / clip_high / clip_fraction (tokens whose clipped term is active, as TRL counts them),
        kl_old (mean old - new log-prob), kl_ref (mean k3 estimate; 0 when beta is 0).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, not {loss_type!r}")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    advantages = advantages[:, None] if advantages.ndim == 1 else advantages
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    if sampler_weights is not None:
        per_token = per_token * sampler_weights
    kl_ref = torch.zeros_like(per_token)
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        kl_ref = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
        per_token = per_token + beta * kl_ref

    masked = per_token * mask
    if loss_type == "grpo":
        loss = (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
        loss = masked.sum() / (per_token.shape[0] * max_completion_length)
    else:  # dapo
        total = mask.sum().item() * num_processes if num_items is None else num_items
        loss = masked.sum() / (max(total, 1.0) / num_processes)

    with torch.no_grad():
        tokens = mask.sum().clamp(min=1).item()
        low = (ratio < 1 - epsilon) & (advantages < 0)
        high = (ratio > 1 + epsilon_high) & (advantages > 0)
        metrics = {
            "clip_low": (low.float() * mask).sum().item() / tokens,
            "clip_high": (high.float() * mask).sum().item() / tokens,
            "clip_fraction": ((low | high).float() * mask).sum().item() / tokens,
            "kl_old": ((old_logprobs - logprobs) * mask).sum().item() / tokens,
            "kl_ref": (kl_ref * mask).sum().item() / tokens,
        }
    return loss, metrics


def sampler_importance_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                               cap: float = 3.0) -> torch.Tensor:
    """Truncated importance weights min(pi_old / pi_sampler, cap) per token (TRL's token_truncate vLLM correction).

    The sampler (vLLM, its own kernels and precision) and the trainer's recomputation of the same
    policy disagree a little; weighting each token by their ratio, capped, keeps the gradient that
    of the trainer's policy. A NaN sampler log-prob (not reported) gets weight 1.

    Args:
        old_logprobs: (N, T) stored log-probs recomputed by the trainer's policy.
        sampler_logprobs: (N, T) the sampling engine's log-probs of the same tokens.
        mask: (N, T) 1 on completion tokens.
    Returns:
        (N, T) weights, 1 on padding.

    >>> sampler_importance_weights(torch.tensor([[0.0, 0.0, -1.0]]), torch.tensor([[-0.5, -5.0, float("nan")]]), torch.ones(1, 3))
    tensor([[1.6487, 3.0000, 1.0000]])
    """
    difference = torch.nan_to_num((old_logprobs - sampler_logprobs) * mask, nan=0.0)
    return torch.exp(difference).clamp(max=cap)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, num_items: float | None = None, num_processes: int = 1) -> tuple[torch.Tensor, dict]:
    """PPO's clipped value loss: 0.5 x max((V - R)^2, (clip(V, V_old +- clip) - R)^2), the mean over masked tokens.

    With `num_items` (the masked tokens of the global minibatch per micro-step, all processes) the sum is divided by it,
    times `num_processes` as DDP averages gradients: micro-batches and processes holding different token counts then give
    the update of one process on the whole minibatch, as dapo's loss does (a per-micro-batch mean would not).

    Args:
        values: (N, T) the value model's estimates now (with gradients).
        old_values: (N, T) its estimates before this round's update (GAE's baseline).
        returns: (N, T) the targets, GAE's advantages + old values.
        mask: (N, T) 1 on the policy's tokens.
        clip: how far an estimate may move from the old one before its loss stops pulling (train.value_clip); None: unclipped.
    Returns:
        (loss scalar, metrics): value_clip_fraction (tokens whose clipped term is the larger), value_mean, return_mean.

    >>> loss, metrics = value_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, 1.0]]), torch.ones(1, 2), clip=0.5)
    >>> loss.item(), metrics["value_clip_fraction"]
    (0.8125, 0.5)
    """
    mask = mask.float()
    unclipped = (values - returns) ** 2
    if clip is None:
        worst = unclipped
    else:
        clipped = (old_values + torch.clamp(values - old_values, -clip, clip) - returns) ** 2
        worst = torch.maximum(unclipped, clipped)
    tokens = mask.sum().clamp(min=1.0)
    loss = 0.5 * (worst * mask).sum() / (tokens if num_items is None else max(num_items, 1.0) / num_processes)
    with torch.no_grad():
        clipped_share = ((worst > unclipped).float() * mask).sum().item() / tokens.item() if clip is not None else 0.0
        metrics = {"value_clip_fraction": clipped_share, "value_mean": ((values * mask).sum() / tokens).item(),
                   "return_mean": ((returns * mask).sum() / tokens).item()}
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens: 1 is a perfect value model, 0 no better than a constant.

    Args:
        values: (N, T) the value model's estimates; returns: (N, T) its targets; mask: (N, T).
    Returns:
        a float; NaN when the returns do not vary (nothing to explain).

    >>> explained_variance(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 4.0]]), torch.ones(1, 3))
    0.857...
    """
    mask = mask.float()
    tokens = mask.sum()
    if tokens < 2:
        return float("nan")

    def variance(x):
        mean = (x * mask).sum() / tokens
        return (((x - mean) * mask) ** 2).sum() / tokens

    spread = variance(returns)
    return float("nan") if spread <= 0 else (1 - variance(returns - values) / spread).item()
