"""completion_logprobs' training pass: the embedding's gradient added into .grad in place is autograd's gradient."""

from __future__ import annotations

import copy

import pytest
import torch

from rl_assets.core.logprobs import completion_logprobs

from rl_assets_support import new_tiny_model

PAD = 0  # the tiny tokenizer's pad id (asserted below); in a prompt, as a token nn.Embedding gives no gradient
PROMPTS = [[5, 6, 7, 8], [9, PAD, 10], [5, 6, 7, 8]]
COMPLETIONS = [[11, 12, 13], [14, 5, 5, 15, 16], [11]]  # token 5 repeats: rows of the gradient that sum several positions


def reference_loss(model, pad_id: int) -> torch.Tensor:
    """The same loss through the model's own embedding (autograd's backward), without completion_logprobs."""
    lengths = [len(p) + len(c) for p, c in zip(PROMPTS, COMPLETIONS)]
    ids = torch.full((len(PROMPTS), max(lengths)), pad_id)
    attention = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):
        ids[i, : lengths[i]], attention[i, : lengths[i]] = torch.tensor(p + c), 1
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float() / 0.7, dim=-1)
    total = logp.new_zeros(())
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):
        for j, token in enumerate(c):
            total = total + logp[i, len(p) - 1 + j, token] * (i + 1)  # unequal row weights
    return total


def ours_loss(model, pad_id: int) -> torch.Tensor:
    logprobs, mask = completion_logprobs(model, PROMPTS, COMPLETIONS, pad_id, temperature=0.7)
    return (logprobs * mask * torch.arange(1, len(PROMPTS) + 1)[:, None]).sum()


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("grad_before", [False, True], ids=["grad-none", "grad-accumulating"])
def test_the_embedding_gradient_in_place_equals_autograds(tied, grad_before):
    model = new_tiny_model(seed=3)
    model.train()
    if not tied:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    pad_id = model.config.pad_token_id
    assert pad_id == PAD == model.get_input_embeddings().padding_idx
    reference = copy.deepcopy(model)
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied
    for m in (model, reference):
        if grad_before:  # a later micro-batch: .grad already holds the earlier ones'
            for p in m.parameters():
                p.grad = torch.full_like(p, 0.25)
    ours_loss(model, pad_id).backward()
    reference_loss(reference, pad_id).backward()
    embedding = model.get_input_embeddings().weight.grad
    assert embedding[COMPLETIONS[1][1]].abs().sum() > 0  # the repeated token was trained
    if not tied:
        start = 0.25 if grad_before else 0.0
        assert torch.all(embedding[pad_id] == start)  # nn.Embedding's padding row takes no gradient
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), name


def test_no_grad_and_frozen_embeddings_take_the_token_ids():
    """Passes without a gradient to the embedding go through the model's own embedding (and give the same log-probs)."""
    model = new_tiny_model(seed=3)
    pad_id = model.config.pad_token_id
    with torch.no_grad():
        plain, _ = completion_logprobs(model, PROMPTS, COMPLETIONS, pad_id)
    model.get_input_embeddings().weight.requires_grad_(False)
    frozen, mask = completion_logprobs(model, PROMPTS, COMPLETIONS, pad_id)
    assert torch.equal(plain * mask, frozen.detach() * mask)
    model.get_input_embeddings().weight.requires_grad_(True)
    trained, _ = completion_logprobs(model, PROMPTS, COMPLETIONS, pad_id)
    assert torch.allclose(plain * mask, trained.detach() * mask, atol=1e-6)


def test_a_pass_without_gradients_takes_a_few_rows_at_a_time_within_the_logits_bound(monkeypatch):
    """On a CPU, without a graph to keep, rows go through the model a few at a time so each forward's logits stay
    within PLAIN_LOGITS_MAX (TRL's fused head, past it, makes tile temporaries of GBs): the same log-probs as each row
    alone, one forward per chunk, none through the fused head."""
    import rl_assets.core.logprobs as logprobs

    model = new_tiny_model(seed=3).eval()
    vocab = model.config.vocab_size
    keep = max(len(p) + len(c) for p, c in zip(PROMPTS, COMPLETIONS)) - min(map(len, PROMPTS)) + 1
    monkeypatch.setattr(logprobs, "PLAIN_LOGITS_MAX", 2 * keep * vocab)  # two rows a forward
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *args, **kwargs: calls.append(kwargs) or forward(*args, **kwargs))
    with torch.no_grad():
        together, mask = completion_logprobs(model, PROMPTS, COMPLETIONS, PAD, temperature=0.7)
        assert [call["input_ids"].shape[0] for call in calls] == [2, 1]
        assert not any(call.get("fused_lm_head") for call in calls)
        alone = [completion_logprobs(model, [p], [c], PAD, temperature=0.7) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert together.shape == mask.shape == (3, max(map(len, COMPLETIONS)))
    for i, (row, row_mask) in enumerate(alone):
        n = len(COMPLETIONS[i])
        assert mask[i].tolist() == [1.0] * n + [0.0] * (mask.shape[1] - n)
        torch.testing.assert_close(together[i, :n], row[0, :n])


def test_a_gpu_pass_takes_plain_logits_while_they_fit_a_share_of_its_free_memory(monkeypatch):
    """Where memory allows a GPU computes the head plainly (one matmul, as a plain training loop does); past a quarter
    of the free memory it takes TRL's fused head, whose memory does not grow with the vocabulary."""
    from rl_assets.core import logprobs

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 2**30, 80 * 2**30))  # 8 GiB free
    fits = 2 * 2**30 // logprobs.BYTES_PER_PLAIN_LOGIT  # 2 GiB of it
    cuda = torch.device("cuda", 0)
    assert logprobs.plain_logits_fit(cuda, fits) and not logprobs.plain_logits_fit(cuda, fits + 1)
    # a GSM8K micro-batch, 16 rows x 300 completion positions x Qwen2.5's 151,936-token vocabulary (12 GB at 16 bytes a
    # value), fits an H200's 100 GiB free, not 8 GiB; 64 such rows do not fit 100 GiB either
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * 2**30, 141 * 2**30))
    assert logprobs.plain_logits_fit(cuda, 16 * 300 * 151936) and not logprobs.plain_logits_fit(cuda, 64 * 300 * 151936)
