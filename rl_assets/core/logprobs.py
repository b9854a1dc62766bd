"""Per-token log-probabilities of completions under a policy, and the KL to a reference, in memory-bounded passes.

Rollouts store them (the ratio's denominator), training recomputes them, evaluation and DPO use them:
one implementation, with the completion positions only (`logits_to_keep`) and TRL's fused head where it pays.
"""

from __future__ import annotations

import torch


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


class _EmbeddingIntoGrad(torch.autograd.Function):
    """`nn.Embedding`'s lookup whose backward adds into the weight's `.grad` in place.

    Autograd's embedding backward builds a (V, D) gradient of its own, and with tied weights (SmolLM2, Qwen2.5,
    Llama 3.2) sums it with the LM head's out of place: three (V, D) tensors at the end of every backward, the
    peak of a full fine-tuning step (bench/train_memory.py measures what this saves). The sum is the same; only
    the order of additions in a row (index_add_ against the dense backward) can move a gradient by float rounding.
    The head's gradient still reaches AccumulateGrad after this one: it waits for every use of the weight.
    """

    @staticmethod
    def forward(ctx, input_ids, weight, padding_idx):
        ctx.save_for_backward(input_ids)
        ctx.weight, ctx.padding_idx = weight, padding_idx
        return torch.nn.functional.embedding(input_ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_output):
        (input_ids,) = ctx.saved_tensors
        ids, rows = input_ids.reshape(-1), grad_output.reshape(-1, grad_output.shape[-1])
        if ctx.padding_idx is not None:  # nn.Embedding gives its padding row no gradient
            kept = ids != ctx.padding_idx
            ids, rows = ids[kept], rows[kept]
        if ctx.weight.grad is None:
            ctx.weight.grad = torch.zeros_like(ctx.weight)
        ctx.weight.grad.index_add_(0, ids, rows.to(ctx.weight.grad.dtype))
        return None, None, None


def _token_inputs(model, input_ids: torch.Tensor) -> dict:
    """The token inputs of a forward: `input_ids`, or, where a pass trains a plain fp32 `nn.Embedding` in one
    process, `inputs_embeds` whose gradient goes into `.grad` in place (_EmbeddingIntoGrad).

    Not under DDP or FSDP (their hooks read a parameter's gradient when autograd accumulates it), nor for
    embeddings that scale or renormalise (Gemma's), nor frozen ones (LoRA).
    """
    if not torch.is_grad_enabled() or isinstance(model, torch.nn.parallel.DistributedDataParallel) or (
            torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return {"input_ids": input_ids}
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if (type(embedding) is not torch.nn.Embedding or not embedding.weight.requires_grad or embedding.weight.dtype != torch.float32
            or embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse):
        return {"input_ids": input_ids}
    return {"inputs_embeds": _EmbeddingIntoGrad.apply(input_ids, embedding.weight, embedding.padding_idx)}


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
PLAIN_LOGITS_GPU_SHARE = 0.25  # of a GPU's free memory that a pass's plain logits, their float32 log-softmax and gradient may take
BYTES_PER_PLAIN_LOGIT = 16  # the logits (up to 4 bytes), their float32 copy, log-softmax and its gradient


def plain_logits_fit(device: torch.device, values: int) -> bool:
    """Whether a pass may compute its `values` completion logits plainly rather than through TRL's fused head: on a
    CPU up to PLAIN_LOGITS_MAX; on a GPU while they take at most PLAIN_LOGITS_GPU_SHARE of its free memory, where a
    plain head is one matmul and the fused one a loop of tiles.

    >>> plain_logits_fit(torch.device("cpu"), 2**25), plain_logits_fit(torch.device("cpu"), 2**25 + 1)
    (True, False)
    """
    if device.type != "cuda":
        return values <= PLAIN_LOGITS_MAX
    free, _ = torch.cuda.mem_get_info(device)
    return values * BYTES_PER_PLAIN_LOGIT <= free * PLAIN_LOGITS_GPU_SHARE


def plain_rows(model, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> int:
    """Rows one CPU forward may take so that its completion logits stay within PLAIN_LOGITS_MAX (at least 1); all of
    them on a GPU, where TRL's fused head bounds the memory. Past the bound TRL's head, on a CPU, scores every position
    in tiles whose temporaries reach gigabytes; a few rows at a time through plain logits take less,
    and less time here."""
    keep, vocab = _kept_logits(model, prompt_ids, completion_ids)
    if next(model.parameters()).device.type != "cpu" or plain_logits_fit(torch.device("cpu"), len(prompt_ids) * keep * vocab):
        return len(prompt_ids)
    return max(1, PLAIN_LOGITS_MAX // (keep * vocab))


def _kept_logits(model, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> tuple[int, int]:
    """(kept positions: from the shortest prompt's last token on, they predict completions; the vocabulary size)."""
    keep = max(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)) - min(map(len, prompt_ids)) + 1
    return keep, _innermost(model).config.get_text_config().vocab_size  # under DDP or FSDP: the wrapped model's


def completion_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                        temperature: float = 1.0, with_entropy: bool = False, vision: list | None = None):
    """Per-token log-probs of each completion given its prompt, at `temperature`.

    A pass whose completion logits fit (`plain_logits_fit`: a CPU's PLAIN_LOGITS_MAX, a share of a GPU's free
    memory) asks the model for the logits of the completion positions only (`logits_to_keep`); past that TRL's fused
    LM head projects the hidden states through the head in tiles, so memory grows with the completion tokens of this
    call, never with tokens x vocabulary (on CPU it scores every position, prompt included: on SmolLM2-135M the fused
    pass ran at 0.55-0.63x of the plain one, bench/real_model.py). Both are exact; a pass that
    switches between them moves a log-prob by float rounding (~1e-6). Call it through a wrapped model
    (DDP, FSDP) so gradients synchronise; run it under the step's autocast. A CPU pass without gradients takes its
    rows `plain_rows` at a time (training splits its micro-batches so, rl_assets.train.policy_gradient.train_step).
    Returns (logprobs, mask), both (N, T) with T the longest completion; padding has mask 0. With
    `with_entropy`, a third (N, T) tensor holds the policy's (detached) entropy at each position.
    `vision`: each row's pixel inputs (a vision-language policy, rl_assets.core.vision), its prompt's image tokens in `prompt_ids`.
    """
    from rl_assets.core.vision import batched

    device = next(model.parameters()).device
    rows = plain_rows(model, prompt_ids, completion_ids)
    if rows < len(prompt_ids) and not torch.is_grad_enabled():  # nothing kept for a backward: a few rows at a time
        parts = [completion_logprobs(model, prompt_ids[start : start + rows], completion_ids[start : start + rows], pad_id, temperature,
                                     with_entropy, vision[start : start + rows] if vision is not None else None)
                 for start in range(0, len(prompt_ids), rows)]
        span = max(part[0].shape[1] for part in parts)
        return tuple(torch.cat([torch.nn.functional.pad(part[k], (0, span - part[k].shape[1])) for part in parts]) for k in range(len(parts[0])))
    input_ids, attention, labels = _right_padded(prompt_ids, completion_ids, pad_id, device)
    # A VLM's forward puts the image features at its image tokens' embeddings: it takes the token ids themselves.
    inputs = {"input_ids": input_ids, **batched(vision, model, input_ids)} if vision is not None else _token_inputs(model, input_ids)
    width, (keep, vocab) = input_ids.shape[1], _kept_logits(model, prompt_ids, completion_ids)
    if not plain_logits_fit(device, len(prompt_ids) * keep * vocab):
        use_fused_head(model, temperature)
        out = model(**inputs, attention_mask=attention, labels=labels, fused_lm_head=True)
        token_logprobs, token_entropy = out.log_probs.float(), out.entropy
    else:  # few enough logits: only those of the completion positions, no head on the prompt (TRL's CPU head scores them all)
        logits = model(**inputs, attention_mask=attention, logits_to_keep=keep).logits[:, :-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)  # (N, keep - 1, V): columns width - keep .. width - 2, each predicting the next
        targets = labels[:, width - keep + 1 :].clamp(min=0)
        token_logprobs = logits.new_zeros((len(prompt_ids), width - 1))  # the fused head's layout: column j predicts token j + 1
        token_logprobs[:, width - keep :] = logp.gather(-1, targets[..., None])[..., 0]
        token_entropy = logits.new_zeros((len(prompt_ids), width - 1))
        if with_entropy:  # a metric, outside autograd: nothing of it is kept for the backward pass
            with torch.no_grad():
                token_entropy[:, width - keep :] = -(logp.exp() * logp).sum(-1)
    logprobs, mask = _completion_positions(token_logprobs, prompt_ids, completion_ids)  # (N, width - 1) -> (N, T)
    if not with_entropy:
        return logprobs, mask
    entropy, _ = _completion_positions(token_entropy.detach().float(), prompt_ids, completion_ids)
    return logprobs, mask, entropy


def completion_kl(model, ref_model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                  temperature: float = 1.0, max_logits: int = 2**25, masks: list[list[int]] | None = None,
                  vision: list | None = None) -> tuple[float, float]:
    """Exact KL(model || ref_model) summed over the vocabulary at every completion position: (sum over tokens, tokens).

    Rows with the same prompt length share their completion columns once right-padded, so each
    forward keeps only those logits (`logits_to_keep`), in chunks of at most `max_logits` values
    per model: memory is bounded whatever the batch, the vocabulary or the completion length.
    `vision`: each row's pixel inputs (a vision-language policy).
    """
    from rl_assets.core.vision import batched

    by_prompt_length: dict[int, list[int]] = {}
    for row, p in enumerate(prompt_ids):
        if completion_ids[row]:
            by_prompt_length.setdefault(len(p), []).append(row)
    device = next(model.parameters()).device
    total = tokens = 0.0
    with torch.no_grad():
        for rows in by_prompt_length.values():
            longest = max(len(completion_ids[r]) for r in rows)
            per_chunk = max(1, max_logits // (longest * model.config.get_text_config().vocab_size))
            for start in range(0, len(rows), per_chunk):
                chunk = rows[start : start + per_chunk]
                span = max(len(completion_ids[r]) for r in chunk)  # this chunk's: right padding ends at its own longest row
                input_ids, attention, _ = _right_padded([prompt_ids[r] for r in chunk], [completion_ids[r] for r in chunk], pad_id, device)
                pixels = batched([vision[r] for r in chunk] if vision is not None else None, model, input_ids)
                logp = [torch.log_softmax(m(input_ids=input_ids, attention_mask=attention, logits_to_keep=span + 1, **pixels).logits[:, :-1].float()
                                          / temperature, dim=-1) for m in (model, ref_model)]
                per_position = (logp[0].exp() * (logp[0] - logp[1])).sum(dim=-1)  # (n, span)
                mask = torch.tensor([(masks[r] if masks is not None else [1.0] * len(completion_ids[r])) + [0.0] * (span - len(completion_ids[r]))
                                     for r in chunk], device=device, dtype=torch.float32)  # `masks`: the policy's own tokens only
                total += (per_position * mask).sum().item()
                tokens += mask.sum().item()
    return total, tokens


def completion_values(value_model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, vision: list | None = None):
    """A value model's estimate at each completion token: the output at the position that chose the token.

    `value_model` gives one number per position (a token-classification head with one label, rl_assets.train.critic).
    The value of token t is read where its log-prob is (the position before it): the state the policy was in when it
    chose it. Returns (values, mask), both (N, T) float32 with T the longest completion; padding has mask 0.
    `vision`: each row's pixel inputs (the value model of a vision-language policy).
    """
    from rl_assets.core.vision import batched

    device = next(value_model.parameters()).device
    input_ids, attention, _ = _right_padded(prompt_ids, completion_ids, pad_id, device)
    per_position = value_model(input_ids=input_ids, attention_mask=attention, **batched(vision, value_model, input_ids)).logits[..., 0].float()  # (N, width)
    return _completion_positions(per_position[:, :-1], prompt_ids, completion_ids)
