"""Batched generation with transformers: G completions per prompt, cut at the end of sequence, nothing inherited.

The one `generate` that rollouts, evaluation, `rl-assets generate` and serving all call; episodes and the
vLLM engine share its sampling config and its `Completions`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from rl_assets.core.vision import VisionInputs, batched, encode_with_images, has_multimodal_positions, placeholder_ids
from rl_assets.data.prompts import encode_prompts


@dataclass
class Completions:
    """Generated completions, one entry per (prompt, sample), prompt-major order."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # includes the end-of-sequence token when one was produced
    texts: list[str]  # decoded completion without special tokens
    truncated: list[bool]  # no end-of-sequence token within max_new_tokens
    sampler_logprobs: list[list[float]] | None = None  # the sampling engine's own log-probs (vLLM), for the mismatch correction
    vision: list[VisionInputs] | None = None  # each row's pixel inputs (a vision-language policy), for the log-prob pass


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and each of the checkpoint's generation-config EOS ids."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, configured):
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    return ids


def sampling_config(eos_ids: list[int], pad_id: int, *, greedy: bool, temperature: float, top_p: float, max_new_tokens: int,
                    suppress: list[int] = ()):
    """The whole GenerationConfig of a sampling call, so nothing is inherited from the checkpoint's own; `suppress`: ids never sampled."""
    from transformers import GenerationConfig

    common = {"max_new_tokens": max_new_tokens, "eos_token_id": eos_ids, "pad_token_id": pad_id, "suppress_tokens": list(suppress) or None}
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


def prefill(model, rows: list[list[int]], input_ids: torch.Tensor, attention: torch.Tensor, vision: list[VisionInputs] | None = None):
    """(KV cache, (N, V) float32 logits of each row's next token) of a left-padded batch of prompts; None where the model's
    cache is not a transformers `Cache` (decode falls back to `model.generate`).

    G samples of a prompt are G equal rows: each run of equal rows is computed once and its cache repeated
    (`batch_select_indices`). Positions are the attention mask's cumulative sum, as generate() gives a left-padded row.
    `vision`: each row's pixel inputs (a vision-language policy); only the prefill sees the images, decoding reads the cache.
    """
    from transformers import Cache

    if has_multimodal_positions(model.config):  # its forward sets 3-D positions from the image tokens; generate() carries them on
        return None
    firsts = [i for i, ids in enumerate(rows) if i == 0 or ids != rows[i - 1] or (vision is not None and vision[i] is not vision[i - 1])]
    index = torch.tensor(firsts, device=input_ids.device)
    mask = attention[index]
    out = model(input_ids=input_ids[index], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True,
                logits_to_keep=1, **batched([vision[i] for i in firsts] if vision is not None else None, model))
    if not isinstance(out.cache, Cache):
        return None
    owner = torch.zeros(len(rows), dtype=torch.long)
    owner[firsts] = 1
    select = (owner.cumsum(0) - 1).to(input_ids.device)  # each row takes its run's first row's
    if len(firsts) < len(rows):
        out.cache.batch_select_indices(select)
    return out.cache, out.logits[select, -1].float()


def next_tokens(logits: torch.Tensor, *, greedy: bool, temperature: float = 1.0, top_p: float = 1.0, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """(A,) the next token of each row from its (A, V) logits: the argmax, or a draw at `temperature` from the
    `top_p` nucleus (transformers' TopPLogitsWarper's rule: the smallest set of most likely tokens holding top_p).

    The draw inverts each row's cumulative distribution at one uniform number, exact up to the float32 rounding of
    the cumulative sum (~1e-7 of probability mass); torch.multinomial draws the same law, much slower on a
    large vocabulary on CPU.

    >>> logits = torch.tensor([[0.0, 2.0, -1.0], [5.0, 0.0, 0.0]])
    >>> next_tokens(logits, greedy=True).tolist()
    [1, 0]
    >>> _ = torch.manual_seed(0); draws = next_tokens(torch.tensor([[0.1, 0.6, 0.3, 0.0]] * 20000).log(), greedy=False)
    >>> [round(float((draws == k).float().mean()), 1) for k in range(4)]
    [0.1, 0.6, 0.3, 0.0]
    >>> next_tokens(torch.tensor([[1.0, 3.0, 2.9]] * 4), greedy=False, top_p=0.4).tolist()   # the nucleus is token 1 alone
    [1, 1, 1, 1]
    """
    if greedy:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_p < 1.0:
        ascending, order = logits.sort(-1)
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False  # the most likely token always stays
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    cdf = logits.softmax(-1).cumsum(-1)
    draw = (torch.rand(len(cdf), device=cdf.device) if uniform is None else uniform.to(cdf.device))[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, draw, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)  # right: a token of probability 0 never


def decode(model, rows: list[list[int]], input_ids: torch.Tensor, attention: torch.Tensor, *, ends: set[int], greedy: bool,
           temperature: float, top_p: float, max_new_tokens: int, vision: list[VisionInputs] | None = None) -> list[list[int]] | None:
    """Each row's completion of a left-padded batch, up to and including its first id in `ends`; None where `prefill` is.

    A row leaves the batch when it ends (its cache rows are dropped): later steps compute only the rows still going,
    where generate() would go on computing every row until the last one ends. Each step draws one uniform number per
    row of the batch, so `static_decode` (which keeps every row) gives the same completions for a seed.
    """
    start = prefill(model, rows, input_ids, attention, vision)
    if start is None:
        return None
    cache, logits = start
    end_ids = torch.tensor(sorted(ends), device=input_ids.device)
    banned = placeholder_ids(model.config)  # a VLM's image tokens
    completions: list[list[int]] = [[] for _ in rows]
    going_rows, mask, positions = list(range(len(rows))), attention, attention.sum(-1)  # positions: of each row's next token
    for step in range(max_new_tokens):
        if banned:
            logits[:, banned] = float("-inf")
        uniform = torch.rand(len(rows), device=logits.device)  # one per row of the batch, going or not: what static_decode draws
        tokens = next_tokens(logits, greedy=greedy, temperature=temperature, top_p=top_p, uniform=uniform[going_rows])
        for row, token in zip(going_rows, tokens.tolist()):
            completions[row].append(token)
        going = ~torch.isin(tokens, end_ids)
        if step == max_new_tokens - 1 or not going.any():
            break
        if not going.all():
            keep = going.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            going_rows = [going_rows[i] for i in keep.tolist()]
            mask, positions, tokens = mask[keep], positions[keep], tokens[keep]
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None], cache=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1].float()
        positions = positions + 1
    return completions


def static_decode(model, rows: list[list[int]], input_ids: torch.Tensor, attention: torch.Tensor, *, ends: set[int], greedy: bool,
                  temperature: float, top_p: float, max_new_tokens: int, cache_length: int,
                  vision: list[VisionInputs] | None = None) -> list[list[int]] | None:
    """`decode`'s completions from a decode step of fixed shapes, compiled (`torch.compile` through transformers'
    `get_compiled_call`; CUDA graphs on a GPU): the same completions for a seed, up to the compiled kernels' rounding.

    The prefill is `decode`'s; its cache is copied into a transformers `StaticCache` of `cache_length` positions (the
    longest prompt of the whole call plus max_new_tokens, so every batch of one size reuses one compiled step), and every
    row stays in the batch to the end (an ended row decodes padding). None where `prefill` is, or where the model has
    sliding-window layers (the caller then decodes eagerly).
    """
    from transformers import CompileConfig, StaticCache

    cache = StaticCache(config=model.config, max_cache_len=cache_length)  # its tensors are allocated by the first update
    if any(layer.is_sliding for layer in cache.layers):
        return None
    start = prefill(model, rows, input_ids, attention, vision)
    if start is None:
        return None
    prefilled, logits = start
    for index, layer in enumerate(prefilled.layers):
        cache.update(layer.keys, layer.values, index)
    del prefilled
    width, count = input_ids.shape[1], len(rows)
    mask = torch.cat([attention, attention.new_zeros(count, cache_length - width)], dim=1)  # one shape for every step
    positions = attention.sum(-1, keepdim=True)
    end_ids = torch.tensor(sorted(ends), device=input_ids.device)
    banned = placeholder_ids(model.config)
    mode = "reduce-overhead" if input_ids.device.type == "cuda" else "default"  # reduce-overhead: CUDA graphs
    step_call = model.get_compiled_call(CompileConfig(mode=mode, dynamic=False))
    completions: list[list[int]] = [[] for _ in rows]
    ended = torch.zeros(count, dtype=torch.bool, device=input_ids.device)
    for step in range(max_new_tokens):
        if banned:
            logits[:, banned] = float("-inf")
        tokens = next_tokens(logits, greedy=greedy, temperature=temperature, top_p=top_p, uniform=torch.rand(count, device=logits.device))
        for row in (~ended).nonzero().squeeze(1).tolist():
            completions[row].append(int(tokens[row]))
        ended |= torch.isin(tokens, end_ids)
        if step == max_new_tokens - 1 or ended.all():
            break
        mask[:, width + step] = 1
        logits = step_call(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions + step, cache=cache, use_cache=True,
                           logits_to_keep=1).logits[:, -1].float()
    return completions


def generate(model, tokenizer, prompts: list[str], samples_per_prompt: int, *, greedy: bool, temperature: float = 1.0,
             top_p: float = 1.0, max_new_tokens: int = 16, batch_size: int = 256, seed: int = 0, progress: bool = False,
             autocast=None, images: list[list] | None = None, processor=None, compiled: bool = False) -> Completions:
    """Sample (or greedily decode) `samples_per_prompt` completions for each prompt, in batches.

    Each batch is prefilled once per distinct prompt and decoded step by step (`decode`: rows that end leave the
    batch; `next_tokens` draws; `compiled`: `static_decode`, a compiled step of fixed shapes, for a GPU, where an
    eager step is bound by kernel launches); a completion ends at the first of any EOS id (`eos_token_ids`). `autocast` is the
    precision context of the forward passes (see precision.py). `images`: each prompt's PIL images, which a
    vision-language policy's `processor` turns into image tokens and pixel inputs (rl_assets.core.vision).
    """
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    vision = None
    if images is not None:
        encoded, vision = encode_with_images(processor, prompts, images)
        vision = [inputs for inputs in vision for _ in range(samples_per_prompt)]  # a prompt's samples share its tensors
    else:
        encoded = encode_prompts(tokenizer, prompts)
    expanded = [ids for ids in encoded for _ in range(samples_per_prompt)]
    eos = eos_token_ids(model, tokenizer)
    ends = set(eos)
    config = sampling_config(eos, tokenizer.pad_token_id, greedy=greedy, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                             suppress=placeholder_ids(model.config))
    out = Completions([], [], [], [], vision=vision)
    batches = range(0, len(expanded), batch_size)
    cache_length = max(map(len, expanded), default=0) + max_new_tokens  # static_decode's, the same for every batch
    with plain_generation_defaults(model), autocast or contextlib.nullcontext():
        for start in tqdm(batches, desc="generate", disable=None if progress else True, leave=False):  # None: only on a terminal
            chunk = expanded[start : start + batch_size]
            width = max(map(len, chunk))
            input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids)) + ids for ids in chunk])  # generation pads on the left
            attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk])
            with torch.no_grad():
                chunk_vision = vision[start : start + batch_size] if vision else None
                rows = None
                if compiled and not model.config.is_encoder_decoder:
                    rows = static_decode(model, chunk, input_ids.to(device), attention.to(device), ends=ends, greedy=greedy,
                                         temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, cache_length=cache_length,
                                         vision=chunk_vision)
                if rows is None and not model.config.is_encoder_decoder:
                    rows = decode(model, chunk, input_ids.to(device), attention.to(device), ends=ends, greedy=greedy, temperature=temperature,
                                  top_p=top_p, max_new_tokens=max_new_tokens, vision=chunk_vision)
                if rows is None:  # a model with a cache of its own kind
                    rows = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                                          **batched(chunk_vision, model, input_ids))[:, width:].tolist()
            for ids, row in zip(chunk, rows):
                completion, truncated = cut_at_eos(row, ends)
                out.prompt_ids.append(list(ids))
                out.completion_ids.append(completion)
                out.texts.append(tokenizer.decode(completion, skip_special_tokens=True))
                out.truncated.append(truncated)
    return out
