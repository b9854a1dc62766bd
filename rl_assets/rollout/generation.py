"""Batched generation with transformers: G completions per prompt, cut at the end of sequence, nothing inherited.

The one `generate` that rollouts, evaluation, `rl-assets generate` and serving all call; episodes and the
vLLM engine share its sampling config and its `Completions`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from rl_assets.data.prompts import encode_prompts


@dataclass
class Completions:
    """Generated completions, one entry per (prompt, sample), prompt-major order."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # includes the end-of-sequence token when one was produced
    texts: list[str]  # decoded completion without special tokens
    truncated: list[bool]  # no end-of-sequence token within max_new_tokens
    sampler_logprobs: list[list[float]] | None = None  # the sampling engine's own log-probs (vLLM), for the mismatch correction


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and each of the checkpoint's generation-config EOS ids."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, configured):
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    return ids


def sampling_config(eos_ids: list[int], pad_id: int, *, greedy: bool, temperature: float, top_p: float, max_new_tokens: int):
    """The whole GenerationConfig of a sampling call, so nothing is inherited from the checkpoint's own."""
    from transformers import GenerationConfig

    common = {"max_new_tokens": max_new_tokens, "eos_token_id": eos_ids, "pad_token_id": pad_id}
    if greedy:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(do_sample=True, temperature=temperature, top_p=top_p, top_k=0, **common)


@contextlib.contextmanager
def plain_generation_defaults(model):
    """generate() fills every field left unset with the checkpoint's generation_config (repetition penalty, top_k, ...): hide it."""
    from transformers import GenerationConfig

    saved, model.generation_config = model.generation_config, GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def cut_at_eos(completion: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """(the completion up to and including its first end-of-sequence id, whether it was truncated)."""
    for index, token in enumerate(completion):
        if token in eos_ids:
            return completion[: index + 1], False
    return completion, True


def shared_prompt_cache(model, rows: list[list[int]], input_ids: torch.Tensor, attention: torch.Tensor):
    """The KV cache of every row's prompt but its last token, each distinct prompt computed once; None where nothing is shared.

    G samples of a prompt are G equal rows: generate() would run the prompt's forward G times. Here each run of equal
    rows is computed once and its cache repeated (`batch_select_indices`), and generate() goes on from it with the
    last prompt token. Positions are the ones generate() gives a left-padded row (the attention mask's cumulative sum),
    so the samples are those of the unshared call up to float rounding (a batch of other shape rounds differently).
    """
    firsts = [i for i, ids in enumerate(rows) if i == 0 or ids != rows[i - 1]]
    if len(firsts) == len(rows) or input_ids.shape[1] < 2 or model.config.is_encoder_decoder:
        return None
    from transformers import Cache

    index = torch.tensor(firsts, device=input_ids.device)
    ids, mask = input_ids[index, :-1], attention[index, :-1]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1).cache
    if not isinstance(cache, Cache):  # a model with a cache of its own kind: no sharing
        return None
    owner = torch.zeros(len(rows), dtype=torch.long)
    owner[firsts] = 1
    cache.batch_select_indices((owner.cumsum(0) - 1).to(input_ids.device))  # each row takes its run's first row's cache
    return cache


def generate(model, tokenizer, prompts: list[str], samples_per_prompt: int, *, greedy: bool, temperature: float = 1.0,
             top_p: float = 1.0, max_new_tokens: int = 16, batch_size: int = 256, seed: int = 0, progress: bool = False,
             autocast=None) -> Completions:
    """Sample (or greedily decode) `samples_per_prompt` completions for each prompt, in batches.

    Sampling follows an explicit GenerationConfig; a completion ends at the first of any EOS id
    (`eos_token_ids`). `autocast` is the precision context of the forward passes (see precision.py).
    """
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    encoded = encode_prompts(tokenizer, prompts)
    expanded = [ids for ids in encoded for _ in range(samples_per_prompt)]
    eos = eos_token_ids(model, tokenizer)
    ends = set(eos)
    config = sampling_config(eos, tokenizer.pad_token_id, greedy=greedy, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    out = Completions([], [], [], [])
    batches = range(0, len(expanded), batch_size)
    with plain_generation_defaults(model), autocast or contextlib.nullcontext():
        for start in tqdm(batches, desc="generate", disable=None if progress else True, leave=False):  # None: only on a terminal
            chunk = expanded[start : start + batch_size]
            width = max(map(len, chunk))
            input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids)) + ids for ids in chunk])  # generation pads on the left
            attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk])
            with torch.no_grad():
                shared = shared_prompt_cache(model, chunk, input_ids.to(device), attention.to(device))
                sequences = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                                           **({"cache": shared} if shared is not None else {}))
            for ids, row in zip(chunk, sequences[:, width:].tolist()):
                completion, truncated = cut_at_eos(row, ends)
                out.prompt_ids.append(list(ids))
                out.completion_ids.append(completion)
                out.texts.append(tokenizer.decode(completion, skip_special_tokens=True))
                out.truncated.append(truncated)
    return out
