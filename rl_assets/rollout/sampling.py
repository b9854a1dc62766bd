"""rollouts: sample G completions per prompt from a policy and store them with their log-probs.

The stored log-probs are the per-token log-probabilities under the sampling policy at the sampling
temperature, recomputed with one forward pass so that training's first ratio is exactly 1.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa
import torch

from rl_assets.core.config import RolloutsParams
from rl_assets.core.logprobs import completion_logprobs
from rl_assets.core.schemas import ROLLOUTS
from rl_assets.core.vision import is_vision_model
from rl_assets.data.images import open_images
from rl_assets.rollout.generation import eos_token_ids, generate
from rl_assets.rollout.selection import choose_prompts


def sample_rollouts(model, tokenizer, prompts: pa.Table, params: RolloutsParams, *, round_number: int, seed: int,
                    policy_id: str, prompts_hash: str, progress: bool = True, model_path: str | None = None, autocast=None,
                    loaded=None, images_dir: Path | None = None, processor=None, pass_counts: dict | None = None) -> pa.Table:
    """The `ROLLOUTS` table of one round: G samples for each of B prompts from `model` (sampled by vLLM from `model_path` when chosen).

    The stored log-probs are recomputed by `model` in micro-batches of `logprob_batch_size` under
    `autocast`, the trainer's precision, so training's first ratio is 1 whichever engine sampled.
    With `loaded` (rl_assets.run.loaded), the vLLM engine is kept there for the next round.
    A vision-language `model` sees each prompt's images (read from `images_dir`, turned into pixel inputs by `processor`).
    `pass_counts` ({prompt_id: (correct, completions)} of the rounds so far) steer `params.selection` (rl_assets.rollout.selection).
    """
    from rl_assets.rollout.vllm_sampling import VllmEngine, resolve_engine

    chosen = choose_prompts(prompts, params.prompts_per_round, round_number, seed, params.selection, pass_counts)
    sample_seed = seed * 1000 + round_number
    G = params.samples_per_prompt
    device = str(next(model.parameters()).device)
    images, vision = None, is_vision_model(model.config)
    if vision and "image_ids" in chosen.column_names:
        images = open_images([ids or [] for ids in chosen["image_ids"].to_pylist()], images_dir)
    if params.episodes is not None:  # tools or an environment: multi-turn episodes (rl_assets.rollout.episodes)
        from rl_assets.rollout.environments import load_environment
        from rl_assets.rollout.episodes import sample_episodes

        name, options = params.episodes
        result = sample_episodes(model, tokenizer, chosen.to_pylist(), G, load_environment(name, options), name, greedy=False,
                                 temperature=params.temperature, top_p=params.top_p, max_new_tokens=params.max_new_tokens,
                                 max_turns=params.max_turns, max_tokens=params.max_episode_tokens, batch_size=params.batch_size,
                                 seed=sample_seed, eos_ids=eos_token_ids(model, tokenizer), autocast=autocast, images=images, processor=processor)
    elif model_path is not None and resolve_engine(params.engine, device, vision=vision) == "vllm":
        engine = loaded.engine if loaded is not None and loaded.engine is not None else VllmEngine(model_path, seed=sample_seed)
        if loaded is not None:
            loaded.engine = engine
        result = engine.generate(model, policy_id, tokenizer, chosen["prompt"].to_pylist(), G, temperature=params.temperature,
                                 top_p=params.top_p, max_new_tokens=params.max_new_tokens, seed=sample_seed, eos_ids=eos_token_ids(model, tokenizer))
    else:
        result = generate(model, tokenizer, chosen["prompt"].to_pylist(), G, greedy=False, temperature=params.temperature,
                          top_p=params.top_p, max_new_tokens=params.max_new_tokens, batch_size=params.batch_size,
                          seed=sample_seed, progress=progress, autocast=autocast, images=images, processor=processor,
                          compiled=params.decode == "compiled")
    logprobs = []
    with torch.no_grad(), autocast or contextlib.nullcontext():
        for start in range(0, len(result.texts), params.logprob_batch_size):
            stop = start + params.logprob_batch_size
            lp, mask = completion_logprobs(model, result.prompt_ids[start:stop], result.completion_ids[start:stop],
                                           tokenizer.pad_token_id, params.temperature,
                                           vision=result.vision[start:stop] if getattr(result, "vision", None) else None)
            logprobs += [row[: int(m.sum())].tolist() for row, m in zip(lp.cpu(), mask.cpu())]
    n = len(result.texts)
    episodes = getattr(result, "completion_mask", None) is not None
    if episodes:  # an environment's tokens are not the policy's: no log-prob of theirs is kept
        logprobs = [[value if keep else 0.0 for value, keep in zip(row, mask)] for row, mask in zip(logprobs, result.completion_mask)]
    episode_column = lambda name: getattr(result, name) if episodes else [None] * n  # noqa: E731
    repeat = lambda column: [v for v in chosen[column].to_pylist() for _ in range(G)]  # noqa: E731
    return pa.table(
        {
            "round": [round_number] * n,
            "prompt_id": repeat("prompt_id"),
            "sample_idx": [i % G for i in range(n)],
            "prompt": repeat("prompt"),
            "answer": repeat("answer"),
            "extra": repeat("extra"),
            "completion": result.texts,
            "prompt_ids": result.prompt_ids,
            "completion_ids": result.completion_ids,
            "logprobs": logprobs,
            "sampler_logprobs": result.sampler_logprobs if result.sampler_logprobs is not None else [None] * n,
            "truncated": result.truncated,
            "policy_id": [policy_id] * n,
            "temperature": [params.temperature] * n,
            "top_p": [params.top_p] * n,
            "max_new_tokens": [params.max_new_tokens] * n,
            "seed": [sample_seed] * n,
            "prompts_hash": [prompts_hash] * n,
            "completion_mask": episode_column("completion_mask"),
            "turns": episode_column("turns"),
            "tool_calls": episode_column("tool_calls"),
            "num_turns": result.num_turns if episodes else [1] * n,
            "environment": [params.episodes[0]] * n if episodes else [None] * n,
            "environment_rewards": episode_column("environment_rewards"),
            "image_ids": [ids or [] for ids in repeat("image_ids")] if "image_ids" in chosen.column_names else [[]] * n,
            "prior_pass_rate": repeat("prior_pass_rate"),
            "prior_samples": repeat("prior_samples"),
        },
        schema=ROLLOUTS,
    )
