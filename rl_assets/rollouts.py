"""rollouts: sample G completions per prompt from a policy and store them with their log-probs.

The stored log-probs are the per-token log-probabilities under the sampling policy at the sampling
temperature, recomputed with one forward pass so that training's first ratio is exactly 1.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass

import pyarrow as pa
import torch
from tqdm.auto import tqdm

from rl_assets.config import RolloutsParams
from rl_assets.prompts import encode_prompts
from rl_assets.schemas import ROLLOUTS


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
def _plain_generation_defaults(model):
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
    with _plain_generation_defaults(model), autocast or contextlib.nullcontext():
        for start in tqdm(batches, desc="generate", disable=None if progress else True, leave=False):  # None: only on a terminal
            chunk = expanded[start : start + batch_size]
            width = max(map(len, chunk))
            input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids)) + ids for ids in chunk])  # generation pads on the left
            attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk])
            with torch.no_grad():
                sequences = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config)
            for ids, row in zip(chunk, sequences[:, width:].tolist()):
                completion, truncated = cut_at_eos(row, ends)
                out.prompt_ids.append(list(ids))
                out.completion_ids.append(completion)
                out.texts.append(tokenizer.decode(completion, skip_special_tokens=True))
                out.truncated.append(truncated)
    return out


def _right_padded(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, device):
    """(input_ids, attention_mask, labels), right-padded so positions need no correction; labels are -100 but on completions."""
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    input_ids = torch.full((len(lengths), max(lengths)), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        input_ids[i, : lengths[i]] = torch.tensor(p + c)
        attention[i, : lengths[i]] = 1
        labels[i, len(p) : lengths[i]] = torch.tensor(c, dtype=torch.long)
    return input_ids.to(device), attention.to(device), labels.to(device)


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


def _innermost(model):
    """The transformers model under DDP/FSDP/Accelerate wrappers and PEFT, whose forward TRL's fused head replaces."""
    while hasattr(model, "module"):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def use_fused_head(model, temperature: float) -> None:
    """Give the model TRL's fused LM head at `temperature` (once): log-probs and entropy without (N, T, V) logits.

    `add_fused_lm_head` replaces the instance's forward; calls without `fused_lm_head=True`
    (generate) run the original one. A new temperature re-patches from the class's forward.
    """
    from trl.trainer.utils import add_fused_lm_head

    target = _innermost(model)
    patched = getattr(target, "_rl_assets_fused", None)  # (temperature, the forward it installed)
    # Accelerate's autocast wrapper, undone after a mixed-precision round, puts back a forward without the head.
    if patched is not None and patched[0] == temperature and target.__dict__.get("forward") is patched[1]:
        return
    target.__dict__.pop("forward", None)
    add_fused_lm_head(target, temperature=temperature, outputs=("log_probs", "entropy"))
    target._rl_assets_fused = (temperature, target.__dict__["forward"])


PLAIN_LOGITS_MAX = 2**25  # logits (rows x kept positions x vocabulary) up to which a CPU pass computes them plainly (128 MB fp32)


def completion_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                        temperature: float = 1.0, with_entropy: bool = False):
    """Per-token log-probs of each completion given its prompt, at `temperature`.

    On GPUs, and wherever the logits would pass PLAIN_LOGITS_MAX values, TRL's fused LM head projects
    the hidden states through the head in tiles, so memory grows with the completion tokens of this
    call, never with tokens x vocabulary. On CPU TRL's head scores every position, prompt included:
    a small pass (the usual micro-batch) asks the model for the logits of the completion positions only
    (`logits_to_keep`): on SmolLM2-135M the fused pass ran at 0.55-0.63x of that (bench/real_model.py). Both are exact; a pass that
    switches between them moves a log-prob by float rounding (~1e-6). Call it through a wrapped model
    (DDP, FSDP) so gradients synchronise; run it under the step's autocast.
    Returns (logprobs, mask), both (N, T) with T the longest completion; padding has mask 0. With
    `with_entropy`, a third (N, T) tensor holds the policy's (detached) entropy at each position.
    """
    device = next(model.parameters()).device
    input_ids, attention, labels = _right_padded(prompt_ids, completion_ids, pad_id, device)
    width = input_ids.shape[1]
    keep = width - min(map(len, prompt_ids)) + 1  # the positions from the shortest prompt's last token on predict completions
    vocab = _innermost(model).config.get_text_config().vocab_size  # under DDP or FSDP: the wrapped model's
    if device.type == "cuda" or len(prompt_ids) * keep * vocab > PLAIN_LOGITS_MAX:
        use_fused_head(model, temperature)
        out = model(input_ids=input_ids, attention_mask=attention, labels=labels, fused_lm_head=True)
        token_logprobs, token_entropy = out.log_probs.float(), out.entropy
    else:  # few enough logits: only those of the completion positions, no head on the prompt (TRL's CPU head scores them all)
        logits = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=keep).logits[:, :-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)  # (N, keep - 1, V): columns width - keep .. width - 2, each predicting the next
        targets = labels[:, width - keep + 1 :].clamp(min=0)
        token_logprobs = logits.new_zeros((len(prompt_ids), width - 1))  # the fused head's layout: column j predicts token j + 1
        token_logprobs[:, width - keep :] = logp.gather(-1, targets[..., None])[..., 0]
        token_entropy = logits.new_zeros((len(prompt_ids), width - 1))
        token_entropy[:, width - keep :] = -(logp.exp() * logp).sum(-1).detach() if with_entropy else 0.0
    logprobs, mask = _completion_positions(token_logprobs, prompt_ids, completion_ids)  # (N, width - 1) -> (N, T)
    if not with_entropy:
        return logprobs, mask
    entropy, _ = _completion_positions(token_entropy.detach().float(), prompt_ids, completion_ids)
    return logprobs, mask, entropy


def completion_kl(model, ref_model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                  temperature: float = 1.0, max_logits: int = 2**25, masks: list[list[int]] | None = None) -> tuple[float, float]:
    """Exact KL(model || ref_model) summed over the vocabulary at every completion position: (sum over tokens, tokens).

    Rows with the same prompt length share their completion columns once right-padded, so each
    forward keeps only those logits (`logits_to_keep`), in chunks of at most `max_logits` values
    per model: memory is bounded whatever the batch, the vocabulary or the completion length.
    """
    by_prompt_length: dict[int, list[int]] = {}
    for row, p in enumerate(prompt_ids):
        if completion_ids[row]:
            by_prompt_length.setdefault(len(p), []).append(row)
    device = next(model.parameters()).device
    total = tokens = 0.0
    with torch.no_grad():
        for rows in by_prompt_length.values():
            span = max(len(completion_ids[r]) for r in rows)
            per_chunk = max(1, max_logits // (span * model.config.get_text_config().vocab_size))
            for start in range(0, len(rows), per_chunk):
                chunk = rows[start : start + per_chunk]
                input_ids, attention, _ = _right_padded([prompt_ids[r] for r in chunk], [completion_ids[r] for r in chunk], pad_id, device)
                logp = [torch.log_softmax(m(input_ids=input_ids, attention_mask=attention, logits_to_keep=span + 1).logits[:, :-1].float()
                                          / temperature, dim=-1) for m in (model, ref_model)]
                per_position = (logp[0].exp() * (logp[0] - logp[1])).sum(dim=-1)  # (n, span)
                mask = torch.tensor([(masks[r] if masks is not None else [1.0] * len(completion_ids[r])) + [0.0] * (span - len(completion_ids[r]))
                                     for r in chunk], device=device, dtype=torch.float32)  # `masks`: the policy's own tokens only
                total += (per_position * mask).sum().item()
                tokens += mask.sum().item()
    return total, tokens


def choose_prompts(prompts: pa.Table, count: int, round_number: int, seed: int) -> pa.Table:
    """The round's B prompts: a seeded draw without replacement from the `rl` split."""
    train = prompts.filter(pa.compute.equal(prompts["split"], "rl"))
    if train.num_rows == 0:
        raise ValueError("prompts table has no 'rl' split rows; lower prompts.sft_fraction or add data")
    indices = random.Random(seed * 1000 + round_number).sample(range(train.num_rows), min(count, train.num_rows))
    return train.take(sorted(indices))


def sample_rollouts(model, tokenizer, prompts: pa.Table, params: RolloutsParams, *, round_number: int, seed: int,
                    policy_id: str, prompts_hash: str, progress: bool = True, model_path: str | None = None, autocast=None,
                    loaded=None) -> pa.Table:
    """The `ROLLOUTS` table of one round: G samples for each of B prompts from `model` (sampled by vLLM from `model_path` when chosen).

    The stored log-probs are recomputed by `model` in micro-batches of `logprob_batch_size` under
    `autocast`, the trainer's precision, so training's first ratio is 1 whichever engine sampled.
    With `loaded` (rl_assets.loaded), the vLLM engine is kept there for the next round.
    """
    from rl_assets.rollouts_vllm import VllmEngine, resolve_engine

    chosen = choose_prompts(prompts, params.prompts_per_round, round_number, seed)
    sample_seed = seed * 1000 + round_number
    G = params.samples_per_prompt
    device = str(next(model.parameters()).device)
    if params.episodes is not None:  # tools or an environment: multi-turn episodes (rl_assets.episodes)
        from rl_assets.environments import load_environment
        from rl_assets.episodes import sample_episodes

        name, options = params.episodes
        result = sample_episodes(model, tokenizer, chosen.to_pylist(), G, load_environment(name, options), name, greedy=False,
                                 temperature=params.temperature, top_p=params.top_p, max_new_tokens=params.max_new_tokens,
                                 max_turns=params.max_turns, max_tokens=params.max_episode_tokens, batch_size=params.batch_size,
                                 seed=sample_seed, eos_ids=eos_token_ids(model, tokenizer), autocast=autocast)
    elif model_path is not None and resolve_engine(params.engine, device) == "vllm":
        engine = loaded.engine if loaded is not None and loaded.engine is not None else VllmEngine(model_path, seed=sample_seed)
        if loaded is not None:
            loaded.engine = engine
        result = engine.generate(model, policy_id, tokenizer, chosen["prompt"].to_pylist(), G, temperature=params.temperature,
                                 top_p=params.top_p, max_new_tokens=params.max_new_tokens, seed=sample_seed, eos_ids=eos_token_ids(model, tokenizer))
    else:
        result = generate(model, tokenizer, chosen["prompt"].to_pylist(), G, greedy=False, temperature=params.temperature,
                          top_p=params.top_p, max_new_tokens=params.max_new_tokens, batch_size=params.batch_size,
                          seed=sample_seed, progress=progress, autocast=autocast)
    logprobs = []
    with torch.no_grad(), autocast or contextlib.nullcontext():
        for start in range(0, len(result.texts), params.logprob_batch_size):
            stop = start + params.logprob_batch_size
            lp, mask = completion_logprobs(model, result.prompt_ids[start:stop], result.completion_ids[start:stop],
                                           tokenizer.pad_token_id, params.temperature)
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
        },
        schema=ROLLOUTS,
    )
