"""checkpoint (rounds >= 1): GRPO on a round's stored rollouts and rewards; never re-samples.

Reads top to bottom: advantages from the rewards table, then `epochs` passes of shuffled
minibatches, each a clipped-ratio step against the log-probs stored at sampling time. With several
processes (torchrun, gloo on CPU) each rank takes an equal slice of every global minibatch and DDP
averages the gradients, so the update matches one process on the same global batch.
"""

from __future__ import annotations

import time

import pyarrow as pa
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from rl_assets.advantages import equal_reward_group_share, group_advantages
from rl_assets.config import TrainParams
from rl_assets.losses import grpo_loss
from rl_assets.rollouts import completion_logprobs


TOKEN_METRICS = ("clip_fraction", "kl_old", "kl_ref")


def join_rewards(rollouts: pa.Table, rewards: pa.Table) -> torch.Tensor:
    """(N,) total reward for each rollout row, matched on (prompt_id, sample_idx)."""
    by_key = {(p, s): r for p, s, r in zip(rewards["prompt_id"].to_pylist(), rewards["sample_idx"].to_pylist(), rewards["reward"].to_pylist())}
    keys = list(zip(rollouts["prompt_id"].to_pylist(), rollouts["sample_idx"].to_pylist()))
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise ValueError(f"rewards table has no score for {len(missing)} rollouts, e.g. prompt_id={missing[0][0]} sample_idx={missing[0][1]}")
    return torch.tensor([by_key[k] for k in keys], dtype=torch.float32)


def _pad(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def train_on_rollouts(model, rollouts: pa.Table, rewards: pa.Table, params: TrainParams, *, group_size: int, temperature: float,
                      pad_id: int, seed: int, ref_model=None, progress: bool = True) -> dict:
    """Update `model` in place with GRPO on the stored table; returns the round's training metrics."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if params.minibatch_size % world:
        raise ValueError(f"train.minibatch_size={params.minibatch_size} must divide evenly over {world} processes")
    reward = join_rewards(rollouts, rewards)
    advantages = group_advantages(reward, group_size, scale=params.scale_rewards)
    prompt_ids, completion_ids = rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist()
    stored = rollouts["logprobs"].to_pylist()
    n = len(prompt_ids)

    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=params.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    steps_per_epoch = max(1, n // params.minibatch_size)
    totals = {"loss": 0.0, "grad_norm": 0.0}  # means over steps
    token_sums = dict.fromkeys(TOKEN_METRICS, 0.0)  # token-weighted, so ranks and steps combine exactly
    local_tokens, started, steps = 0, time.perf_counter(), 0
    model.train()
    bar = tqdm(total=params.epochs * steps_per_epoch, desc="train", disable=not progress or rank != 0, leave=False)
    for _ in range(params.epochs):
        order = torch.randperm(n, generator=generator)
        for step in range(steps_per_epoch):
            batch = order[step * params.minibatch_size : (step + 1) * params.minibatch_size]
            local = batch.tensor_split(world)[rank].tolist()  # this rank's slice of the global minibatch
            logprobs, mask = completion_logprobs(ddp, [prompt_ids[i] for i in local], [completion_ids[i] for i in local], pad_id, temperature)
            old = _pad([stored[i] for i in local], logprobs.shape[1]).to(logprobs.device)
            ref = None
            if ref_model is not None and params.beta > 0:
                with torch.no_grad():
                    ref, _ = completion_logprobs(ref_model, [prompt_ids[i] for i in local], [completion_ids[i] for i in local], pad_id, temperature)
            loss, metrics = grpo_loss(logprobs, old, advantages[local].to(logprobs.device), mask, params.clip_epsilon, ref, params.beta)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), params.max_grad_norm)
            optimizer.step()
            totals["loss"] += loss.item()
            totals["grad_norm"] += grad_norm.item()
            batch_tokens = int(mask.sum().item())
            for key in TOKEN_METRICS:
                token_sums[key] += metrics[key] * batch_tokens
            local_tokens += batch_tokens
            steps += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.4f}", clip=f"{metrics['clip_fraction']:.3f}")
    bar.close()
    model.eval()
    elapsed = time.perf_counter() - started
    tokens = local_tokens
    if world > 1:  # each rank saw its slice; report the whole minibatch (grad_norm is already global)
        sums = torch.tensor([totals["loss"] / world, *token_sums.values(), float(local_tokens)], dtype=torch.float64)
        dist.all_reduce(sums)
        totals["loss"], *values, tokens = sums.tolist()
        token_sums = dict(zip(TOKEN_METRICS, values))
    result = {key: value / max(steps, 1) for key, value in totals.items()}
    result.update({key: value / max(tokens, 1) for key, value in token_sums.items()})
    result.update(
        steps=steps,
        tokens_per_second=tokens / elapsed if elapsed else 0.0,
        reward_mean=reward.mean().item(),
        reward_std=reward.std().item() if n > 1 else 0.0,
        equal_reward_group_share=equal_reward_group_share(reward, group_size),
    )
    return result
