"""rollouts.py: generation, stored log-probs against a one-sequence-at-a-time computation, the table."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch

from rl_assets.core.config import RolloutsParams
from rl_assets.rollout.generation import generate
from rl_assets.core.logprobs import completion_logprobs
from rl_assets.rollout.sampling import sample_rollouts
from rl_assets.rollout.selection import choose_prompts
from rl_assets.core.schemas import ROLLOUTS, read_table, write_table
from rl_assets.core.tokenizer import build_tiny_tokenizer

from rl_assets_support import prompts_table, shared_tiny_model

PROMPTS = ["1+1=", "12+7=", "3*4=", "100-42="]


def naive_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """One unpadded sequence at a time: log-softmax of the logits that predict each completion token."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].double() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[len(prompt) - 1 + j, token].item() for j, token in enumerate(completion)]


@pytest.mark.parametrize("head", ["plain", "fused"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logprobs_match_one_sequence_at_a_time(temperature, head, monkeypatch):
    """Both ways to the log-probs are exact: the completion positions' logits (a small pass on CPU) and TRL's fused head."""
    if head == "fused":
        monkeypatch.setattr("rl_assets.core.logprobs.PLAIN_LOGITS_MAX", 0)
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    completion_ids = [[5, 6, 2], [7], [8, 9, 10, 11, 12], []]  # ragged lengths force right padding; one empty
    with torch.no_grad():
        logprobs, mask = completion_logprobs(tiny_model, prompt_ids, completion_ids, tokenizer.pad_token_id, temperature)
    assert logprobs.shape == mask.shape == (4, 5)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        expected = naive_logprobs(tiny_model, p, c, temperature)
        assert logprobs[i, : len(c)].tolist() == pytest.approx(expected, abs=1e-5)
        assert (logprobs[i, len(c):] == 0).all()


def test_both_heads_give_the_same_entropy_and_gradients(monkeypatch):
    from rl_assets_support import new_tiny_model

    tokenizer = build_tiny_tokenizer()
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    completion_ids = [[5, 6, 2], [7], [8, 9, 10, 11, 12]]
    results = []
    for budget in (2**25, 0):  # plain, then fused
        monkeypatch.setattr("rl_assets.core.logprobs.PLAIN_LOGITS_MAX", budget)
        model = new_tiny_model(0)  # a fresh one each: a deep copy of a patched model would run the original's forward
        logprobs, mask, entropy = completion_logprobs(model, prompt_ids, completion_ids, tokenizer.pad_token_id, 0.7, with_entropy=True)
        (logprobs * mask).sum().backward()
        results.append((logprobs.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain_lp, plain_entropy, plain_grads), (fused_lp, fused_entropy, fused_grads) = results
    assert torch.allclose(plain_lp, fused_lp, atol=1e-5) and torch.allclose(plain_entropy, fused_entropy, atol=1e-5)
    assert plain_grads.keys() == fused_grads.keys() and all(torch.allclose(plain_grads[n], fused_grads[n], atol=1e-5) for n in plain_grads)


def test_completion_logprobs_keep_the_graph_for_training():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    logprobs, mask = completion_logprobs(tiny_model, [tokenizer("1+1=")["input_ids"]], [[6, 2]], tokenizer.pad_token_id)
    assert logprobs.requires_grad
    (logprobs * mask).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tiny_model.parameters())
    tiny_model.zero_grad(set_to_none=True)


def test_generate_shapes_and_truncation_flags():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    out = generate(tiny_model, tokenizer, PROMPTS, 3, greedy=False, max_new_tokens=6, seed=1, batch_size=8)  # two batches
    n = 3 * len(PROMPTS)
    assert len(out.prompt_ids) == len(out.completion_ids) == len(out.texts) == len(out.truncated) == n
    eos = tokenizer.eos_token_id
    for i, (prompt_ids, completion, text, truncated) in enumerate(zip(out.prompt_ids, out.completion_ids, out.texts, out.truncated)):
        assert prompt_ids == tokenizer(PROMPTS[i // 3])["input_ids"]  # no left padding left in the stored prompt
        assert 1 <= len(completion) <= 6
        assert eos not in completion[:-1]  # nothing is kept after the end-of-sequence token
        assert truncated == (completion[-1] != eos)
        if truncated:
            assert len(completion) == 6
        assert text == tokenizer.decode(completion, skip_special_tokens=True)
    assert any(out.truncated) and not all(out.truncated)  # the random model does sometimes stop


def test_greedy_decoding_is_deterministic():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    first = generate(tiny_model, tokenizer, PROMPTS, 2, greedy=True, max_new_tokens=5, seed=0)
    second = generate(tiny_model, tokenizer, PROMPTS, 2, greedy=True, max_new_tokens=5, seed=123)
    assert first == second
    assert first.completion_ids[0::2] == first.completion_ids[1::2]  # the G greedy samples of a prompt agree


def test_sampling_is_seeded():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    sample = lambda seed: generate(tiny_model, tokenizer, PROMPTS, 4, greedy=False, max_new_tokens=5, seed=seed)  # noqa: E731
    assert sample(7) == sample(7)
    assert sample(7).completion_ids != sample(8).completion_ids



def _left_padded(rows: list[list[int]], pad_id: int):
    width = max(map(len, rows))
    return (torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in rows]),
            torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in rows]))


@pytest.mark.parametrize("batch_size", [12, 5])  # 5: a prompt's samples split over two batches
def test_greedy_decoding_gives_what_transformers_generate_gives(batch_size, monkeypatch):
    """The decode loop (one prefill per distinct prompt, rows leaving as they end) against model.generate, prompts of
    different lengths (left padding) included."""
    import rl_assets.rollout.generation as generation

    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    ours = generate(tiny_model, tokenizer, PROMPTS, 3, greedy=True, max_new_tokens=8, batch_size=batch_size)
    monkeypatch.setattr(generation, "decode", lambda *args, **kwargs: None)  # what a model with a cache of its own kind gets
    theirs = generate(tiny_model, tokenizer, PROMPTS, 3, greedy=True, max_new_tokens=8, batch_size=batch_size)
    assert len({len(tokenizer(p)["input_ids"]) for p in PROMPTS}) > 1
    assert ours == theirs


def test_prefill_computes_each_prompt_once_and_holds_each_row_as_its_prompt_alone_would():
    """Each row's keys and values (rotary positions included) and next-token logits are those of its prompt run
    unpadded, one row at a time; equal rows share one forward."""
    from rl_assets.rollout.generation import prefill

    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(2)]
    input_ids, attention = _left_padded(encoded, tokenizer.pad_token_id)
    forwarded = []
    hook = tiny_model.register_forward_pre_hook(lambda module, args, kwargs: forwarded.append(len(kwargs["input_ids"])), with_kwargs=True)
    try:
        with torch.no_grad():
            cache, logits = prefill(tiny_model, encoded, input_ids, attention)
    finally:
        hook.remove()
    assert forwarded == [len(PROMPTS)]
    with torch.no_grad():
        for row, ids in enumerate(encoded):
            alone = tiny_model(input_ids=torch.tensor([ids]), use_cache=True)
            start = input_ids.shape[1] - len(ids)  # the row's left padding
            for layer, expected in zip(cache.layers, alone.cache.layers):
                assert torch.allclose(layer.keys[row, :, start:], expected.keys[0], atol=1e-5)
                assert torch.allclose(layer.values[row, :, start:], expected.values[0], atol=1e-5)
            assert torch.allclose(logits[row], alone.logits[0, -1], atol=1e-5)


def test_rows_leave_the_batch_as_they_end():
    from rl_assets.rollout.generation import decode

    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(4)]
    input_ids, attention = _left_padded(encoded, tokenizer.pad_token_id)
    ends = set(range(0, tiny_model.config.vocab_size, 3))  # a third of the vocabulary ends a row: rows end at different steps
    batch_sizes = []
    hook = tiny_model.register_forward_pre_hook(lambda module, args, kwargs: batch_sizes.append(len(kwargs["input_ids"])), with_kwargs=True)
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            completions = decode(tiny_model, encoded, input_ids, attention, ends=ends, greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=6)
    finally:
        hook.remove()
    assert all(c[-1] in ends or len(c) == 6 for c in completions) and all(t not in ends for c in completions for t in c[:-1])
    # the prefill (one row per prompt), then at step k the rows whose completion goes beyond k tokens
    expected = [len(PROMPTS)] + [sum(len(c) > k for c in completions) for k in range(1, 6)]
    assert batch_sizes == [size for size in expected if size]
    assert len(set(map(len, completions))) > 1 and batch_sizes[-1] < len(encoded)


def test_each_step_sees_the_logits_of_its_whole_sequence_run_alone(monkeypatch):
    """Every logits row a draw sees is the unpadded, uncached forward's of that row's prompt and completion so far:
    positions, masks and the dropped rows' cache all line up."""
    import rl_assets.rollout.generation as generation

    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(3)]
    input_ids, attention = _left_padded(encoded, tokenizer.pad_token_id)
    seen, draw = [], generation.next_tokens
    monkeypatch.setattr(generation, "next_tokens", lambda logits, **kwargs: seen.append(logits.clone()) or draw(logits, **kwargs))
    torch.manual_seed(0)
    ends = set(range(0, tiny_model.config.vocab_size, 4))
    with torch.no_grad():
        completions = generation.decode(tiny_model, encoded, input_ids, attention, ends=ends, greedy=False, temperature=1.0, top_p=1.0,
                                        max_new_tokens=7)
        assert len(set(map(len, completions))) > 1  # some rows left early
        for step, logits in enumerate(seen):
            rows = [r for r, c in enumerate(completions) if len(c) > step]
            assert len(rows) == len(logits)
            for logit, row in zip(logits, rows):
                alone = tiny_model(input_ids=torch.tensor([encoded[row] + completions[row][:step]])).logits[0, -1]
                assert torch.allclose(logit, alone, atol=1e-4), (step, row)


@pytest.mark.e2e  # compiling the decode step takes ~10-20 s on a CPU
def test_the_compiled_static_decode_sees_the_eager_logits_and_gives_the_eager_completions(monkeypatch):
    """rollouts.decode: compiled keeps every row in a static cache and runs a torch.compile'd step: each step's logits of
    the rows still going are the eager loop's (so positions, masks and the cache line up), and the completions are the
    same for a seed, sampled and greedy, rows ending at different steps, over batches of two sizes."""
    import rl_assets.rollout.generation as generation

    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(3)]
    input_ids, attention = _left_padded(encoded, tokenizer.pad_token_id)
    ends = set(range(0, tiny_model.config.vocab_size, 3))  # rows end at different steps
    seen, draw = [], generation.next_tokens
    monkeypatch.setattr(generation, "next_tokens", lambda logits, **kwargs: seen.append(logits.clone()) or draw(logits, **kwargs))
    with torch.no_grad():
        torch.manual_seed(0)
        eager = generation.decode(tiny_model, encoded, input_ids, attention, ends=ends, greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=7)
        eager_logits, seen[:] = list(seen), []
        torch.manual_seed(0)
        static = generation.static_decode(tiny_model, encoded, input_ids, attention, ends=ends, greedy=False, temperature=1.0, top_p=1.0,
                                          max_new_tokens=7, cache_length=input_ids.shape[1] + 9)  # longer than this batch needs
    assert static == eager and len(set(map(len, eager))) > 1
    assert len(seen) == len(eager_logits)
    for step, (all_rows, going_rows) in enumerate(zip(seen, eager_logits)):
        going = [row for row, completion in enumerate(eager) if len(completion) > step]
        assert torch.allclose(all_rows[going], going_rows, atol=1e-5), step
    monkeypatch.setattr(generation, "next_tokens", draw)

    saved, calls = tiny_model.generation_config.eos_token_id, []
    tiny_model.generation_config.eos_token_id = sorted(ends)
    static_decode = generation.static_decode
    monkeypatch.setattr(generation, "static_decode", lambda *args, **kwargs: calls.append(len(args[1])) or static_decode(*args, **kwargs))
    try:
        for greedy in (False, True):
            expected = generate(tiny_model, tokenizer, PROMPTS, 3, greedy=greedy, max_new_tokens=7, batch_size=8, seed=5)
            compiled = generate(tiny_model, tokenizer, PROMPTS, 3, greedy=greedy, max_new_tokens=7, batch_size=8, seed=5, compiled=True)
            assert compiled.completion_ids == expected.completion_ids and compiled.truncated == expected.truncated
    finally:
        tiny_model.generation_config.eos_token_id = saved
    assert calls == [8, 4] * 2  # the compiled path ran, for every batch


def test_next_tokens_draws_the_tempered_nucleus_distribution():
    from rl_assets.rollout.generation import next_tokens

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    torch.manual_seed(0)
    for temperature, top_p in [(1.0, 1.0), (0.5, 1.0), (1.5, 0.8)]:
        draws = next_tokens(logits.repeat(40000, 1), greedy=False, temperature=temperature, top_p=top_p)
        expected = torch.softmax(logits / temperature, -1)
        if top_p < 1.0:  # transformers' rule: the most likely tokens until their mass reaches top_p
            order = expected.argsort(descending=True)
            before = expected[order].cumsum(0) - expected[order]
            expected = torch.where(torch.zeros_like(expected).scatter(0, order, (before < top_p).float()) > 0, expected, 0.0)
            expected = expected / expected.sum()
            assert (expected == 0).any()
        frequencies = torch.bincount(draws, minlength=len(logits)).float() / len(draws)
        assert torch.allclose(frequencies, expected, atol=0.01), (temperature, top_p, frequencies, expected)
        assert (frequencies[expected == 0] == 0).all()

SPLITS = ["rl", "eval", "rl", "sft", "rl", "rl"]
PROBLEMS = [(f"{a}+{a + 1}=", str(2 * a + 1)) for a in range(len(SPLITS))]


def test_sample_rollouts_table(tmp_path):
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    prompts = prompts_table(PROBLEMS, SPLITS)
    params = RolloutsParams(prompts_per_round=3, samples_per_prompt=2, max_new_tokens=5, batch_size=4, temperature=0.9, top_p=1.0)
    table = sample_rollouts(tiny_model, tokenizer, prompts, params, round_number=2, seed=3, policy_id="ckpt", prompts_hash="ph", progress=False)
    assert table.schema.equals(ROLLOUTS)
    assert read_table(write_table(table, tmp_path / "rollouts.parquet", ROLLOUTS, "rollouts"), "rollouts").to_pylist() == table.to_pylist()
    rows = table.to_pylist()
    assert len(rows) == 6
    assert [r["sample_idx"] for r in rows] == [0, 1] * 3
    rl_ids = {r["prompt_id"] for r in prompts.to_pylist() if r["split"] == "rl"}
    assert {r["prompt_id"] for r in rows} <= rl_ids and len({r["prompt_id"] for r in rows}) == 3
    for row in rows:
        assert len(row["logprobs"]) == len(row["completion_ids"]) >= 1
        assert all(lp <= 0 for lp in row["logprobs"])
        assert row["prompt_ids"] == tokenizer(row["prompt"])["input_ids"]
        assert row["truncated"] == (row["completion_ids"][-1] != tokenizer.eos_token_id)
        assert (row["round"], row["policy_id"], row["prompts_hash"], row["seed"]) == (2, "ckpt", "ph", 3002)
        assert (row["max_new_tokens"], row["top_p"]) == (5, 1.0) and row["temperature"] == pytest.approx(0.9)
        # The stored log-probs are the sampling policy's, so training's first ratio is 1.
        expected = naive_logprobs(tiny_model, row["prompt_ids"], row["completion_ids"], 0.9)
        assert row["logprobs"] == pytest.approx(expected, abs=1e-5)


def test_sample_rollouts_is_reproducible():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    prompts = prompts_table(PROBLEMS, SPLITS)
    params = RolloutsParams(prompts_per_round=2, samples_per_prompt=3, max_new_tokens=3)
    run = lambda: sample_rollouts(tiny_model, tokenizer, prompts, params, round_number=1, seed=0, policy_id="p", prompts_hash="h", progress=False)  # noqa: E731
    assert run().equals(run())


def test_choose_prompts_picks_rl_rows_only_and_is_seeded():
    splits = [["eval", "sft", "rl"][i % 3] for i in range(60)]
    prompts = prompts_table([(f"{i}+0=", str(i)) for i in range(60)], splits)
    chosen = choose_prompts(prompts, 10, round_number=1, seed=0)
    assert chosen.num_rows == 10
    assert set(chosen["split"].to_pylist()) == {"rl"}
    assert len(set(chosen["prompt_id"].to_pylist())) == 10
    assert chosen.equals(choose_prompts(prompts, 10, round_number=1, seed=0))
    assert chosen["prompt_id"].to_pylist() != choose_prompts(prompts, 10, round_number=2, seed=0)["prompt_id"].to_pylist()
    assert chosen["prompt_id"].to_pylist() != choose_prompts(prompts, 10, round_number=1, seed=1)["prompt_id"].to_pylist()
    assert choose_prompts(prompts, 1000, round_number=1, seed=0).num_rows == 20  # capped at the rl split


def test_choose_prompts_without_rl_rows():
    with pytest.raises(ValueError, match="no 'rl' split rows"):
        choose_prompts(prompts_table([("1+1=", "2"), ("1+2=", "3")], ["eval", "sft"]), 4, round_number=1, seed=0)


def test_choose_prompts_from_an_empty_table():
    with pytest.raises(ValueError, match="no 'rl' split rows"):
        choose_prompts(prompts_table([]), 4, round_number=1, seed=0)


def test_rollout_engine_falls_back_to_transformers_without_a_gpu_or_vllm(monkeypatch):
    from rl_assets.rollout import vllm_sampling

    assert vllm_sampling.resolve_engine("auto", "cpu") == "transformers"
    assert vllm_sampling.resolve_engine("transformers", "cuda") == "transformers"
    monkeypatch.setattr(vllm_sampling, "vllm_available", lambda: False)
    assert vllm_sampling.resolve_engine("auto", "cuda") == "transformers"
    with pytest.raises(ValueError, match=r"rollouts.engine: vllm is not installed \(pip install 'rl-assets\[vllm\]'\)"):
        vllm_sampling.resolve_engine("vllm", "cuda")
    monkeypatch.setattr(vllm_sampling, "vllm_available", lambda: True)
    assert vllm_sampling.resolve_engine("auto", "cuda:0") == "vllm"


class StandInLLM:
    """vLLM is not installed here: a stand-in for the documented API vllm_sampling uses, recording every call."""

    def __init__(self, calls: list, eos: int, **kwargs):
        self.calls, self.eos = calls, eos
        calls.append(("LLM", kwargs))
        runner = types.SimpleNamespace(model=types.SimpleNamespace(load_weights=lambda weights: calls.append(("load_weights", {k: v.clone() for k, v in weights}))))
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests, sampling, use_tqdm):
        self.calls.append(("generate", requests, sampling))
        step = lambda tokens: [{t: types.SimpleNamespace(logprob=-0.5 * (i + 1))} for i, t in enumerate(tokens)]  # noqa: E731
        samples = [[5, 6, self.eos, 9], [7, 8, 9]]  # vLLM may return a token past a stop id; the second never stops
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=s, logprobs=step(s)) for s in samples]) for _ in requests]


@pytest.fixture
def stand_in_vllm(monkeypatch):
    import trl  # noqa: F401  TRL looks for vLLM once, when it is imported (the log-prob pass imports it): the stand-in is not a package to find

    calls: list = []
    eos = build_tiny_tokenizer().eos_token_id
    module = types.SimpleNamespace(LLM=lambda **kwargs: StandInLLM(calls, eos, **kwargs), SamplingParams=lambda **kwargs: kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    return calls


def test_vllm_path_asks_for_its_logprobs_and_ignores_the_checkpoint_generation_config(stand_in_vllm):
    from rl_assets.rollout.vllm_sampling import VllmEngine

    tokenizer = build_tiny_tokenizer()
    eos = tokenizer.eos_token_id
    engine = VllmEngine("ckpt", seed=3)
    out = engine.generate(torch.nn.Linear(2, 2), "policy-a", tokenizer, ["<s>1+1=", "2+2="], 2, temperature=0.7, top_p=0.9,
                          max_new_tokens=4, seed=3, eos_ids=[eos, 99])
    created = stand_in_vllm[0][1]
    assert created["generation_config"] == "vllm" and created["logprobs_mode"] == "processed_logprobs" and created["enable_sleep_mode"]
    requests, sampling = next(c for c in stand_in_vllm if c[0] == "generate")[1:]
    assert requests[0]["prompt_token_ids"][:2] != [tokenizer.bos_token_id] * 2  # one BOS
    assert sampling["logprobs"] == 0 and sampling["seed"] == 3 and sampling["stop_token_ids"] == [eos, 99]
    assert out.completion_ids == [[5, 6, eos], [7, 8, 9]] * 2 and out.truncated == [False, True] * 2
    assert out.sampler_logprobs == [[-0.5, -1.0, -1.5], [-0.5, -1.0, -1.5]] * 2


def test_one_vllm_engine_serves_every_round_with_the_weights_pushed_in_place(stand_in_vllm, monkeypatch):
    """TRL's colocate cycle: asleep (level 2) while training; before sampling, weights in place, prefix cache reset, KV cache woken."""
    from rl_assets.rollout import vllm_sampling
    from rl_assets.run.loaded import Loaded

    monkeypatch.setattr(vllm_sampling, "vllm_available", lambda: True)
    model, tokenizer = copy.deepcopy(shared_tiny_model()), build_tiny_tokenizer()
    params = RolloutsParams(prompts_per_round=2, samples_per_prompt=2, max_new_tokens=3, engine="vllm")
    loaded = Loaded()
    for round_number in (1, 2):
        with torch.no_grad():
            model.model.embed_tokens.weight[0, 0] = float(round_number)  # "trained" between the rounds
        sample_rollouts(model, tokenizer, prompts_table(PROBLEMS, SPLITS), params, round_number=round_number, seed=0, policy_id=f"r{round_number - 1:02d}",
                        prompts_hash="h", model_path="ckpt", loaded=loaded)
    assert [c[0] for c in stand_in_vllm].count("LLM") == 1  # one engine for both rounds
    cycle = ["wake_up", "load_weights", "reset_prefix_cache", "wake_up", "generate", "sleep"]
    assert [c[0] for c in stand_in_vllm] == ["LLM", "sleep", *cycle, *cycle]
    pushed = [c[1] for c in stand_in_vllm if c[0] == "load_weights"]
    assert [float(w["model.embed_tokens.weight"][0, 0]) for w in pushed] == [1.0, 2.0]  # each round samples the weights it was given
    assert loaded.engine.weight_pushes == 2


def test_stored_rollouts_carry_the_sampler_logprobs_column():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    params = RolloutsParams(prompts_per_round=2, samples_per_prompt=2, max_new_tokens=3, logprob_batch_size=3)
    table = sample_rollouts(tiny_model, tokenizer, prompts_table([("1+1=", "2"), ("2+2=", "4")]), params, round_number=1, seed=0,
                            policy_id="p", prompts_hash="h", progress=False)
    assert table["sampler_logprobs"].to_pylist() == [None] * 4  # transformers generate: the stored log-probs are the sampler's
    assert [len(lp) for lp in table["logprobs"].to_pylist()] == [len(c) for c in table["completion_ids"].to_pylist()]
