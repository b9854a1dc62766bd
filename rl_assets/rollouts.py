"""rollouts: sample G completions per prompt from a policy and store them with their log-probs.

The stored log-probs are the per-token log-probabilities under the sampling policy at the sampling
temperature, recomputed with one forward pass so that training's first ratio is exactly 1.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pyarrow as pa
import torch
from tqdm.auto import tqdm

from rl_assets.config import RolloutsParams
from rl_assets.losses import token_entropy
from rl_assets.schemas import ROLLOUTS


@dataclass
class Completions:
    """Generated completions, one entry per (prompt, sample), prompt-major order."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # includes the end-of-sequence token when one was produced
    texts: list[str]  # decoded completion without special tokens
    truncated: list[bool]  # no end-of-sequence token within max_new_tokens


def generate(model, tokenizer, prompts: list[str], samples_per_prompt: int, *, greedy: bool, temperature: float = 1.0,
             top_p: float = 1.0, max_new_tokens: int = 16, batch_size: int = 256, seed: int = 0, progress: bool = False) -> Completions:
    """Sample (or greedily decode) `samples_per_prompt` completions for each prompt, in batches."""
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    expanded = [p for p in prompts for _ in range(samples_per_prompt)]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    out = Completions([], [], [], [])
    saved_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # decoder-only generation pads on the left
    batches = range(0, len(expanded), batch_size)
    for start in tqdm(batches, desc="generate", disable=not progress, leave=False):
        chunk = expanded[start : start + batch_size]
        encoded = tokenizer(chunk, return_tensors="pt", padding=True).to(device)
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        with torch.no_grad():
            sequences = model.generate(**encoded, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, **sampling)
        width = encoded["input_ids"].shape[1]
        for row, mask in zip(sequences.tolist(), encoded["attention_mask"].tolist()):
            prompt_ids = [t for t, m in zip(row[:width], mask) if m]
            completion = row[width:]
            ended = eos in completion
            completion = completion[: completion.index(eos) + 1] if ended else completion
            out.prompt_ids.append(prompt_ids)
            out.completion_ids.append(completion)
            out.texts.append(tokenizer.decode(completion, skip_special_tokens=True))
            out.truncated.append(not ended)
    tokenizer.padding_side = saved_side
    return out


def _completion_forward(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, temperature: float):
    """One right-padded forward pass: (logits (N, width - 1, V) predicting each next token, targets (N, width - 1))."""
    device = next(model.parameters()).device
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    input_ids = torch.full((len(lengths), max(lengths)), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        input_ids[i, : lengths[i]] = torch.tensor(p + c)
        attention[i, : lengths[i]] = 1
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits.float() / temperature
    return logits[:, :-1], input_ids[:, 1:].to(device)


def _completion_positions(values: torch.Tensor, prompt_ids: list[list[int]], completion_ids: list[list[int]]):
    """The completion positions of per-position `values` (N, width - 1, ...), left-aligned: ((N, T, ...), mask (N, T))."""
    span = max(1, max(len(c) for c in completion_ids))
    out = values.new_zeros((len(prompt_ids), span, *values.shape[2:]))
    mask = values.new_zeros((len(prompt_ids), span))
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if c:
            out[i, : len(c)] = values[i, len(p) - 1 : len(p) - 1 + len(c)]
            mask[i, : len(c)] = 1
    return out, mask


def completion_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                        temperature: float = 1.0, with_entropy: bool = False):
    """Per-token log-probs of each completion given its prompt.

    Sequences are right-padded so positions need no correction.
    Returns (logprobs, mask), both (N, T) with T the longest completion; padding has mask 0. With
    `with_entropy`, a third (N, T) tensor holds the policy's (detached) entropy at each position.
    """
    logits, targets = _completion_forward(model, prompt_ids, completion_ids, pad_id, temperature)
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, width - 1)
    logprobs, mask = _completion_positions(token_logprobs, prompt_ids, completion_ids)
    if not with_entropy:
        return logprobs, mask
    with torch.no_grad():
        entropy, _ = _completion_positions(token_entropy(logits), prompt_ids, completion_ids)
    return logprobs, mask, entropy


def completion_distributions(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                             temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole next-token log-distribution at each completion position: ((N, T, V) log-probs, (N, T) mask)."""
    logits, _ = _completion_forward(model, prompt_ids, completion_ids, pad_id, temperature)
    return _completion_positions(torch.log_softmax(logits, dim=-1), prompt_ids, completion_ids)


def choose_prompts(prompts: pa.Table, count: int, round_number: int, seed: int) -> pa.Table:
    """The round's B prompts: a seeded draw without replacement from the `rl` split."""
    train = prompts.filter(pa.compute.equal(prompts["split"], "rl"))
    if train.num_rows == 0:
        raise ValueError("prompts table has no 'rl' split rows; lower prompts.sft_fraction or add data")
    indices = random.Random(seed * 1000 + round_number).sample(range(train.num_rows), min(count, train.num_rows))
    return train.take(sorted(indices))


def sample_rollouts(model, tokenizer, prompts: pa.Table, params: RolloutsParams, *, round_number: int, seed: int,
                    policy_id: str, prompts_hash: str, progress: bool = True, model_path: str | None = None) -> pa.Table:
    """The `ROLLOUTS` table of one round: G samples for each of B prompts from `model` (sampled by vLLM from `model_path` when chosen)."""
    from rl_assets.rollouts_vllm import generate_vllm, resolve_engine

    chosen = choose_prompts(prompts, params.prompts_per_round, round_number, seed)
    sample_seed = seed * 1000 + round_number
    G = params.samples_per_prompt
    device = str(next(model.parameters()).device)
    if model_path is not None and resolve_engine(params.engine, device) == "vllm":
        result = generate_vllm(model_path, tokenizer, chosen["prompt"].to_pylist(), G, temperature=params.temperature, top_p=params.top_p,
                               max_new_tokens=params.max_new_tokens, seed=sample_seed)
    else:
        result = generate(model, tokenizer, chosen["prompt"].to_pylist(), G, greedy=False, temperature=params.temperature,
                          top_p=params.top_p, max_new_tokens=params.max_new_tokens, batch_size=params.batch_size,
                          seed=sample_seed, progress=progress)
    logprobs = []
    with torch.no_grad():
        for start in range(0, len(result.texts), params.batch_size):
            stop = start + params.batch_size
            lp, mask = completion_logprobs(model, result.prompt_ids[start:stop], result.completion_ids[start:stop],
                                           tokenizer.pad_token_id, params.temperature)
            logprobs += [row[: int(m.sum())].tolist() for row, m in zip(lp.cpu(), mask.cpu())]
    n = len(result.texts)
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
            "truncated": result.truncated,
            "policy_id": [policy_id] * n,
            "temperature": [params.temperature] * n,
            "top_p": [params.top_p] * n,
            "max_new_tokens": [params.max_new_tokens] * n,
            "seed": [sample_seed] * n,
            "prompts_hash": [prompts_hash] * n,
        },
        schema=ROLLOUTS,
    )
