"""Rollouts sampled by an older checkpoint than the one training starts from (`rollouts.staleness`), set up for the
decoupled PPO objective."""

from __future__ import annotations

import contextlib

import pyarrow as pa
import torch

from rl_assets.core.logprobs import completion_logprobs


def with_proximal_logprobs(model, rollouts: pa.Table, parent_id: str, pad_id: int, temperature: float, batch_size: int,
                           autocast=None, vision: list | None = None, trained: torch.Tensor | None = None) -> tuple[pa.Table, int]:
    """Each row an older checkpoint than the parent `parent_id` sampled gets the parent's own log-probs as `logprobs`
    (recomputed here: the ratio and its clip are taken against the policy being trained from), and what sampled it moves
    to `sampler_logprobs` (the sampler's engine's when it reported them, else the stored trainer-precision ones), so
    training weights each token by min(parent / sampler, train.sampler_correction_cap). Rows the parent sampled are left
    as they are, and so are rows outside `trained` ((N,) bool, `policy_gradient.rows_trained_on`; None: every row), which
    training leaves out. Returns (table, how many rows an older checkpoint sampled).
    """
    older = [i for i, policy in enumerate(rollouts["policy_id"].to_pylist()) if policy != parent_id]
    kept = trained.tolist() if trained is not None else None
    stale = [i for i in older if kept is None or kept[i]]
    if not stale:
        return rollouts, len(older)
    prompts, completions = rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist()
    stored, engine = rollouts["logprobs"].to_pylist(), rollouts["sampler_logprobs"].to_pylist()
    proximal, sampler = list(stored), list(engine)
    with torch.no_grad(), autocast or contextlib.nullcontext():
        for start in range(0, len(stale), batch_size):
            rows = stale[start : start + batch_size]
            logprobs, mask = completion_logprobs(model, [prompts[i] for i in rows], [completions[i] for i in rows], pad_id, temperature,
                                                 vision=[vision[i] for i in rows] if vision is not None else None)
            for row, values, kept_tokens in zip(rows, logprobs.float().cpu(), mask.cpu()):
                proximal[row] = values[: int(kept_tokens.sum())].tolist()
                sampler[row] = engine[row] if engine[row] is not None else stored[row]
    table = rollouts.set_column(rollouts.schema.get_field_index("logprobs"), rollouts.schema.field("logprobs"),
                                pa.array(proximal, rollouts.schema.field("logprobs").type))
    table = table.set_column(table.schema.get_field_index("sampler_logprobs"), table.schema.field("sampler_logprobs"),
                             pa.array(sampler, table.schema.field("sampler_logprobs").type))
    return table, len(older)
