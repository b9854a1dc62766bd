"""The library on real-shaped models: byte-level BPE, chat templates, Llama 3's doubled BOS, several end ids.

The folders come from tests/real_models.py (built locally, no download): Qwen2 / Llama / GPT-2 at a
tiny width with a Qwen2.5- / Llama-3- / GPT-2-shaped tokenizer, and a generation_config.json with
every end-of-turn id plus deliberately odd sampling defaults (repetition_penalty 5, top_k 1,
temperature 0.05) that the library must not inherit, or (one test) a config transformers calls
invalid (sampling flags with do_sample false) that it must still be able to save.

Some tests force the policy's next-token distribution: every input embedding (and GPT-2's position
embeddings) is set to one vector, so every position has the same final hidden state h, and the
output head is replaced so that the logits are exactly the values a test asks for. That is an
ordinary model with ordinary weights; nothing in the library is patched.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from rl_assets.core.checkpoints import save_checkpoint
from rl_assets.core.config import EvaluationParams, ModelParams, PromptsParams, RewardsParams, RolloutsParams, SFTParams
from rl_assets.eval.evaluation import evaluate_checkpoint
from rl_assets.core.policy import load_base_model, load_policy
from rl_assets.data.prompts import build_prompts, render
from rl_assets.rollout.generation import generate
from rl_assets.rollout.sampling import sample_rollouts
from rl_assets.train.sft import warm_start
from rl_assets.core.tokenizer import build_tiny_tokenizer, load_tokenizer

from real_models import (ARCHS, ODD_GENERATION_DEFAULTS, STRICTLY_INVALID_GENERATION_DEFAULTS, TOKENIZER_STYLE, end_token_ids, expected_prompt_ids, leading_count,
                         real_vocab_qwen2_config, save_real_model)
from rl_assets_support import prompts_table

PROBLEMS = ["7*8=", "take 3 from 9:", "sum of 4 and 5?", "Natalia sold 48 clips in April. How many?"]
CHAT_ARCHS = ["qwen2", "llama"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """arch -> a saved model folder (built once for the module; tests only read them)."""
    root = tmp_path_factory.mktemp("real-models")
    return {arch: save_real_model(root / arch, arch, seed=0) for arch in ARCHS}


def policy(folders, arch):
    """(model, tokenizer) as the pipeline sees a checkpoint: weights through load_policy, the tokenizer through
    load_tokenizer (which gives Llama 3 and GPT-2 their pad = eos, as the pipeline's r00 checkpoint does)."""
    model, _ = load_policy(folders[arch])
    return model, load_tokenizer(ModelParams(name_or_path=str(folders[arch])))


def ends(arch, tokenizer) -> list[int]:
    return end_token_ids(tokenizer, TOKENIZER_STYLE[arch])


def rendered(tokenizer, chat: bool) -> list[str]:
    return [render(p, PromptsParams(chat_template=chat), tokenizer) for p in PROBLEMS]


def force_logits(model, logits: dict[int, float]):
    """Make `model` predict exactly `logits` (token id -> value, every other id 0) at every position, in place.

    Every input embedding gets the same vector (GPT-2's position embeddings: zero), so all positions
    carry identical values through attention and the MLP and end in one final hidden state h; a new,
    untied output head with rows c * h / |h|^2 then gives logit c to each chosen id and 0 elsewhere.
    """
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        embeddings.copy_(torch.randn(embeddings.shape[1], generator=torch.Generator().manual_seed(0)).expand_as(embeddings))
        if hasattr(model, "transformer") and hasattr(model.transformer, "wpe"):
            model.transformer.wpe.weight.zero_()
        h = model.model(input_ids=torch.tensor([[0, 1, 2]])).last_hidden_state[0, -1] if hasattr(model, "model") else \
            model.transformer(input_ids=torch.tensor([[0, 1, 2]])).last_hidden_state[0, -1]
        head = torch.zeros_like(embeddings)
        for token, value in logits.items():
            head[token] = value * h / h.dot(h)
    model.lm_head.weight = torch.nn.Parameter(head)  # unties it from the input embeddings
    with torch.no_grad():
        check = model(input_ids=torch.tensor([[3, 4, 5, 6]])).logits[0]
    expected = torch.zeros(check.shape[-1])
    expected[list(logits)] = torch.tensor(list(logits.values()))
    assert torch.allclose(check, expected.expand_as(check), atol=1e-3), "the forced head does not give the requested logits"
    return model


# --- loading -------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_saved_folders_load_through_the_library(folders, arch):
    model, tokenizer = load_policy(folders[arch])
    assert not model.training and model.config.model_type == arch
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer) > 1000  # byte-level BPE, special tokens at the end
    assert min(ends(arch, tokenizer)) >= len(tokenizer) - 5
    generation = json.loads((folders[arch] / "generation_config.json").read_text())
    assert model.generation_config.eos_token_id == generation["eos_token_id"] == ends(arch, tokenizer)
    assert model.generation_config.repetition_penalty == ODD_GENERATION_DEFAULTS["repetition_penalty"]
    if arch != "gpt2":
        assert len(generation["eos_token_id"]) == 2 and tokenizer.eos_token_id == generation["eos_token_id"][0]
        assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA
    loaded = load_tokenizer(ModelParams(name_or_path=str(folders[arch])))
    assert loaded.pad_token_id is not None
    if arch == "qwen2":
        assert (loaded.bos_token_id, loaded.pad_token) == (None, "<|endoftext|>")
    else:  # Llama 3 and GPT-2 ship no pad token: the project pads with eos
        assert tokenizer.pad_token is None and loaded.pad_token_id == loaded.eos_token_id
    base, base_tokenizer = load_base_model(ModelParams(name_or_path=str(folders[arch])), seed=0)
    assert base.config.model_type == arch and base_tokenizer.pad_token_id == loaded.pad_token_id


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_base_model_with_a_strictly_invalid_generation_config_warm_starts_and_saves(tmp_path, arch):
    """r00 of a checkpoint whose generation_config.json transformers calls invalid (sampling flags with do_sample
    false, as Llama-2-chat shipped): loading only warns, but once anything changes that config (the Trainer
    aligns its pad_token_id with the tokenizer's pad = eos) model.save_pretrained raises. The base model must
    still warm-start and be saved as a checkpoint."""
    path = save_real_model(tmp_path / "base", arch, generation_defaults=STRICTLY_INVALID_GENERATION_DEFAULTS)
    model, tokenizer = load_base_model(ModelParams(name_or_path=str(path)), seed=0)
    chat = arch != "gpt2"
    problems = [(render(f"{a}+{b}=", PromptsParams(chat_template=chat), tokenizer), str(a + b)) for a in range(3) for b in range(3)]
    warm_start(model, tokenizer, prompts_table(problems, ["sft"] * len(problems)), SFTParams(max_steps=1, batch_size=4), seed=0)
    save_checkpoint(model, tokenizer, tmp_path / "r00", {"round": 0})
    reloaded, _ = load_policy(tmp_path / "r00")
    assert reloaded.generation_config.eos_token_id == ends(arch, tokenizer)


def test_real_vocabulary_config_builds_a_small_model():
    from transformers import AutoModelForCausalLM

    from rl_assets.core.logprobs import completion_logprobs

    config = real_vocab_qwen2_config()
    model = AutoModelForCausalLM.from_config(config).eval()
    assert model.config.vocab_size == 151936 and model.get_input_embeddings().weight.shape == (151936, 64)
    assert sum(p.numel() for p in model.parameters()) < 12_000_000
    prompts, completions = [[151643, 5, 6], [7, 8]], [[151645], [9, 10, 151645]]
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, prompts, completions, pad_id=151643)
    assert logprobs.shape == (2, 3) and mask.sum() == 4 and torch.isfinite(logprobs).all() and (logprobs[mask.bool()] < 0).all()


# --- prompts and their token ids -----------------------------------------------------------------


def test_chat_templates_render_like_the_real_models(folders):
    _, qwen = policy(folders, "qwen2")
    _, llama = policy(folders, "llama")
    text = render("7*8=", PromptsParams(chat_template=True), qwen)
    assert text == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n7*8=<|im_end|>\n<|im_start|>assistant\n"
    text = render("7*8=", PromptsParams(chat_template=True), llama)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>") and text.count("<|begin_of_text|>") == 1
    assert text.endswith("<|start_header_id|>user<|end_header_id|>\n\n7*8=<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    # the case under test exists: the tokenizer prepends its BOS to a text that already starts with one
    assert llama(text)["input_ids"][:2] == [llama.bos_token_id] * 2
    assert llama("7*8=")["input_ids"][0] == llama.bos_token_id


@pytest.mark.parametrize("arch,chat", [("qwen2", True), ("qwen2", False), ("llama", True), ("llama", False), ("gpt2", False)])
def test_encode_prompts_gives_one_bos(folders, arch, chat):
    from rl_assets.data.prompts import encode_prompts

    _, tokenizer = policy(folders, arch)
    texts = rendered(tokenizer, chat)
    encoded = encode_prompts(tokenizer, texts)
    assert encoded == [expected_prompt_ids(tokenizer, t) for t in texts]
    for ids, text in zip(encoded, texts):
        if arch == "llama":
            assert leading_count(ids, tokenizer.bos_token_id) == 1
            assert tokenizer.decode(ids) == (text if chat else tokenizer.bos_token + text)
        else:
            assert tokenizer.decode(ids) == text


def test_encode_prompts_keeps_the_tiny_tokenizers_bos():
    from rl_assets.data.prompts import encode_prompts

    tokenizer = build_tiny_tokenizer()
    assert encode_prompts(tokenizer, ["1+2=", "7*8="]) == [tokenizer("1+2=")["input_ids"], tokenizer("7*8=")["input_ids"]]


@pytest.mark.parametrize("arch,chat", [("qwen2", True), ("llama", True), ("llama", False), ("gpt2", False)])
def test_generate_feeds_prompts_with_one_bos(folders, arch, chat):
    model, tokenizer = policy(folders, arch)
    texts = rendered(tokenizer, chat)
    out = generate(model, tokenizer, texts, 2, greedy=False, max_new_tokens=2, seed=0)
    assert out.prompt_ids == [expected_prompt_ids(tokenizer, t) for t in texts for _ in range(2)]
    if arch == "llama":
        assert all(leading_count(ids, tokenizer.bos_token_id) == 1 for ids in out.prompt_ids)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_prompt_length_filter_counts_the_tokens_generation_feeds(folders, arch):
    """n_tokens (what prompts.max_prompt_tokens is compared with) is the length of the prompt ids the policy is given."""
    model, tokenizer = policy(folders, arch)
    raw = prompts_table([(p, "1") for p in PROBLEMS])
    table, dropped = build_prompts(raw, PromptsParams(chat_template=True, max_prompt_tokens=1000, eval_fraction=0.1), tokenizer)
    assert dropped == {"duplicates": 0, "too_long": 0, "conflicting": 0}
    out = generate(model, tokenizer, table["prompt"].to_pylist(), 1, greedy=True, max_new_tokens=1)
    assert table["n_tokens"].to_pylist() == [len(ids) for ids in out.prompt_ids]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_sft_examples_feed_the_prompt_ids_generation_feeds(folders, arch):
    """The warm start trains on exactly the prompt ids rollouts are sampled after (one BOS), then answer + eos.
    Left to TRL, a Llama 3 chat prompt string is tokenized with special tokens added: two BOS."""
    from rl_assets.train.sft import sft_examples  # the lead's tokenization for the warm start

    _, tokenizer = policy(folders, arch)
    prompts, answers = rendered(tokenizer, True), ["56", "6", "9", "48"]
    examples = sft_examples(tokenizer, prompts, answers)
    for ids, mask, prompt, answer in zip(examples["input_ids"], examples["completion_mask"], prompts, answers):
        expected = expected_prompt_ids(tokenizer, prompt)
        completion = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert ids == expected + completion and mask == [0] * len(expected) + [1] * len(completion)
        assert leading_count(ids, tokenizer.bos_token_id) == (1 if arch == "llama" else 0)


# --- where completions end -----------------------------------------------------------------------


def assert_cut_at_first_end(out, end_ids: list[int], max_new_tokens: int):
    """Every completion ends at its first end-of-turn id, whichever of them it is, and only then is it not truncated."""
    for ids, truncated, text in zip(out.completion_ids, out.truncated, out.texts):
        assert not any(t in end_ids for t in ids[:-1]), f"an end id before the last token: {ids}"
        if ids and ids[-1] in end_ids:
            assert truncated is False, ids
        else:
            assert truncated is True and len(ids) == max_new_tokens, ids
        assert "<|" not in text


@pytest.mark.parametrize("arch,which", [("qwen2", 1), ("llama", 1), ("qwen2", 0), ("llama", 0), ("gpt2", 0)])
def test_greedy_completion_stops_at_any_end_id(folders, arch, which):
    """The policy's argmax is end id number `which` of the generation config (1: not the tokenizer's eos_token)."""
    model, tokenizer = policy(folders, arch)
    end = ends(arch, tokenizer)[which]
    force_logits(model, {end: 10.0})
    out = generate(model, tokenizer, rendered(tokenizer, arch != "gpt2"), 1, greedy=True, max_new_tokens=6)
    assert out.completion_ids == [[end]] * len(PROBLEMS)
    assert out.truncated == [False] * len(PROBLEMS) and out.texts == [""] * len(PROBLEMS)


def digits_or_either_end(folders, arch):
    """(model, tokenizer, first end id, second end id): a policy that says 1, 2 or 3 or either end id, equally likely."""
    model, tokenizer = policy(folders, arch)
    first, second = ends(arch, tokenizer)
    digits = [tokenizer.convert_tokens_to_ids(d) for d in "123"]
    force_logits(model, {**{d: 8.0 for d in digits}, first: 8.0, second: 8.0})
    return model, tokenizer, first, second


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_sampled_completions_end_at_the_first_end_id(folders, arch):
    model, tokenizer, first, second = digits_or_either_end(folders, arch)
    out = generate(model, tokenizer, rendered(tokenizer, True)[:2], 16, greedy=False, max_new_tokens=6, seed=0)
    assert_cut_at_first_end(out, [first, second], 6)
    last = Counter(ids[-1] for ids in out.completion_ids)
    assert last[first] > 0 and last[second] > 0  # both kinds of end occurred, so both were tested


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_rollouts_table_on_a_chat_model(folders, arch):
    """The stored table: one BOS, completions cut at the first end id of either kind, one log-prob per completion token."""
    model, tokenizer, first, second = digits_or_either_end(folders, arch)
    problems = [(render(p, PromptsParams(chat_template=True), tokenizer), "1") for p in PROBLEMS]
    params = RolloutsParams(prompts_per_round=4, samples_per_prompt=8, max_new_tokens=5, batch_size=16, engine="transformers")
    table = sample_rollouts(model, tokenizer, prompts_table(problems), params, round_number=1, seed=0, policy_id="p",
                            prompts_hash="h", progress=False)
    rows = table.to_pylist()
    for row in rows:
        assert row["prompt_ids"] == expected_prompt_ids(tokenizer, row["prompt"])
        ids = row["completion_ids"]
        assert not any(t in (first, second) for t in ids[:-1]) and row["truncated"] == (ids[-1] not in (first, second))
        assert len(row["logprobs"]) == len(ids)
    assert {row["completion_ids"][-1] for row in rows} >= {first, second}


def test_evaluation_counts_completions_to_the_first_end_id(folders):
    model, tokenizer = policy(folders, "qwen2")
    force_logits(model, {ends("qwen2", tokenizer)[1]: 30.0})  # (nearly: 1 - 1e-10) always <|endoftext|>, the second end id
    held_out = prompts_table([(p, "1") for p in rendered(tokenizer, True)], splits=["eval"] * len(PROBLEMS))
    params = EvaluationParams(max_prompts=4, samples_per_prompt=2, max_new_tokens=6)
    rows = evaluate_checkpoint(model, tokenizer, held_out, params, seed=0, rewards=RewardsParams(functions=[{"name": "arithmetic_answer"}]))
    assert [row["mean_completion_tokens"] for row in rows] == [1.0, 1.0]


# --- the checkpoint's generation_config is not the sampler's -------------------------------------


def manual_greedy(model, prompt_ids: list[int], steps: int) -> list[int]:
    """Argmax of the policy's logits, one unpadded forward pass per token: the definition of greedy decoding."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def cut_at_end(ids: list[int], end_ids: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in end_ids:
            return ids[: i + 1]
    return ids


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_is_the_policys_argmax_whatever_the_checkpoint_defaults(folders, arch):
    model, tokenizer = policy(folders, arch)
    end_ids, steps = ends(arch, tokenizer), 10
    texts = rendered(tokenizer, arch != "gpt2")
    sensitive = False
    for text in texts:  # one prompt at a time: no padding, so the comparison is exact
        out = generate(model, tokenizer, [text], 1, greedy=True, max_new_tokens=steps)
        assert cut_at_end(out.completion_ids[0], end_ids) == cut_at_end(manual_greedy(model, out.prompt_ids[0], steps), end_ids)
        # the fixture is able to catch the bug: the checkpoint's own defaults decode differently here
        inherited = model.generate(input_ids=torch.tensor([out.prompt_ids[0]]), max_new_tokens=steps, pad_token_id=tokenizer.pad_token_id)
        sensitive |= inherited[0, len(out.prompt_ids[0]):].tolist() != manual_greedy(model, out.prompt_ids[0], steps)[: inherited.shape[1] - len(out.prompt_ids[0])]
    assert sensitive, "the saved generation_config does not change greedy decoding of these prompts; the test proves nothing"


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_at_t1_is_not_collapsed_by_the_checkpoint_defaults(folders, arch):
    model, tokenizer = policy(folders, arch)
    out = generate(model, tokenizer, rendered(tokenizer, arch != "gpt2")[:1], 8, greedy=False, temperature=1.0, max_new_tokens=6, seed=0)
    assert len({tuple(ids) for ids in out.completion_ids}) > 1


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_draws_from_the_policys_distribution(folders, arch):
    """Two digit tokens with equal logits, only '1' in the prompt: at T=1 each is drawn half the time, first and
    second token alike. A repetition penalty taken from the checkpoint would all but forbid the digit the prompt
    contains and a repeat of the first token."""
    model, tokenizer = policy(folders, arch)
    prompt = render("1+", PromptsParams(chat_template=arch != "gpt2"), tokenizer)
    prompt_tokens = set(tokenizer(prompt)["input_ids"])
    one = tokenizer.convert_tokens_to_ids("1")
    two = next(t for t in map(tokenizer.convert_tokens_to_ids, "23456789") if t not in prompt_tokens)
    assert one in prompt_tokens
    force_logits(model, {one: 20.0, two: 20.0})
    n = 64
    out = generate(model, tokenizer, [prompt], n, greedy=False, temperature=1.0, max_new_tokens=4, seed=0)
    assert all(set(ids) <= {one, two} and len(ids) == 4 for ids in out.completion_ids)
    firsts = sum(ids[0] == one for ids in out.completion_ids)
    repeats = sum(ids[1] == ids[0] for ids in out.completion_ids)
    assert 0.25 * n <= firsts <= 0.75 * n, f"first token is '1' in {firsts}/{n} samples, expected about half"
    assert 0.25 * n <= repeats <= 0.75 * n, f"second token repeats the first in {repeats}/{n} samples, expected about half"
