"""prompts.py: stable ids, deduplication, a stable hash split and the token-length filter."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from rl_assets.core.config import PromptsParams
from rl_assets.data.prompts import ChatTemplateError, build_prompts, prompt_id, split_of
from rl_assets.core.schemas import PROMPTS, RAW_DATA
from rl_assets.core.tokenizer import build_tiny_tokenizer


def raw_table(pairs: list[tuple[str, str]], extras: list[str] | None = None) -> pa.Table:
    extras = extras or ["{}"] * len(pairs)
    return pa.Table.from_pylist(
        [{"source": "s.jsonl", "source_hash": "f" * 32, "source_row": i, "prompt": p, "answer": a, "extra": e} for i, ((p, a), e) in enumerate(zip(pairs, extras))],
        schema=RAW_DATA,
    )


def test_prompt_id_is_a_stable_content_hash():
    assert prompt_id("12+7=", "19") == hashlib.sha256("12+7=\x0019".encode()).hexdigest()[:16]
    assert prompt_id("12+7=", "19") == prompt_id("12+7=", "19")
    assert prompt_id("12+7=", "19") != prompt_id("12+7=", "20")
    assert prompt_id("ab", "c") != prompt_id("a", "bc")  # the separator keeps fields apart


IDS = [prompt_id(f"{i}+{i}=", str(2 * i)) for i in range(2000)]


def splits_of(eval_fraction: float, sft_fraction: float) -> dict[str, set[str]]:
    out = {"eval": set(), "sft": set(), "rl": set()}
    for pid in IDS:
        out[split_of(pid, eval_fraction, sft_fraction)].add(pid)
    return out


def test_split_is_stable_and_matches_the_fractions_roughly():
    assert [split_of(pid, 0.1, 0.25) for pid in IDS] == [split_of(pid, 0.1, 0.25) for pid in IDS]
    shares = {name: len(ids) / len(IDS) for name, ids in splits_of(0.1, 0.25).items()}
    # eval_fraction of all ids; sft_fraction of the rest; each within ~4 binomial standard deviations.
    assert shares["eval"] == pytest.approx(0.1, abs=0.03)
    assert shares["sft"] == pytest.approx(0.25 * 0.9, abs=0.04)
    assert shares["rl"] == pytest.approx(0.75 * 0.9, abs=0.04)


def test_raising_eval_fraction_only_adds_rows_to_eval():
    small, large = splits_of(0.1, 0.25)["eval"], splits_of(0.3, 0.25)["eval"]
    assert small < large
    assert len(large) / len(IDS) == pytest.approx(0.3, abs=0.04)


def test_raising_sft_fraction_only_moves_rl_rows_into_sft():
    low, high = splits_of(0.1, 0.2), splits_of(0.1, 0.5)
    assert low["eval"] == high["eval"]
    assert low["sft"] < high["sft"] and high["rl"] < low["rl"]


def test_sft_fraction_zero_leaves_no_sft_rows():
    assert splits_of(0.2, 0.0)["sft"] == set()


def test_build_prompts_dedupes_and_counts():
    tokenizer = build_tiny_tokenizer()
    raw = raw_table([("1+1=", "2"), ("2+2=", "4"), ("1+1=", "2"), ("3+3=", "6"), ("1+1=", "2")])
    table, dropped = build_prompts(raw, PromptsParams(eval_fraction=0.5, max_prompt_tokens=64), tokenizer)
    assert dropped == {"duplicates": 2, "too_long": 0, "conflicting": 0}
    assert table.num_rows == 3
    assert table["source_row"].to_pylist() == [0, 1, 3]  # the first occurrence is kept
    assert len(set(table["prompt_id"].to_pylist())) == 3


def test_build_prompts_columns():
    tokenizer = build_tiny_tokenizer()
    raw = raw_table([("1+1=", "2"), ("12*3=", "36")])
    table, _ = build_prompts(raw, PromptsParams(eval_fraction=0.5, max_prompt_tokens=64, template="Q: {prompt} {x} A:"), tokenizer)
    assert table.schema.equals(PROMPTS)
    rows = table.to_pylist()
    assert [r["problem"] for r in rows] == ["1+1=", "12*3="]
    assert [r["prompt"] for r in rows] == ["Q: 1+1= {x} A:", "Q: 12*3= {x} A:"]  # other braces stay literal
    assert [r["prompt_id"] for r in rows] == [prompt_id("1+1=", "2"), prompt_id("12*3=", "36")]  # id of the problem, not the template
    assert [r["split"] for r in rows] == [split_of(r["prompt_id"], 0.5, PromptsParams().sft_fraction) for r in rows]
    assert [r["n_tokens"] for r in rows] == [len(tokenizer(r["prompt"])["input_ids"]) for r in rows]
    assert [(r["source"], r["source_hash"]) for r in rows] == [("s.jsonl", "f" * 32)] * 2


@pytest.mark.parametrize("limit,kept", [(5, 1), (7, 2), (100, 3)])
def test_token_length_filter(limit, kept):
    tokenizer = build_tiny_tokenizer()
    raw = raw_table([("1+2=", "3"), ("12+34=", "46"), ("123+456+789=", "1368")])  # 5, 7 and 13 tokens: one per character plus BOS
    table, dropped = build_prompts(raw, PromptsParams(max_prompt_tokens=limit), tokenizer)
    assert table.num_rows == kept and dropped["too_long"] == 3 - kept
    assert all(n <= limit for n in table["n_tokens"].to_pylist())


def test_a_limit_that_drops_every_prompt_is_refused_naming_it_and_the_longest_prompt():
    tokenizer = build_tiny_tokenizer()
    raw = raw_table([("1+2=", "3"), ("12+34=", "46"), ("123+456+789=", "1368")])  # 5, 7 and 13 tokens
    with pytest.raises(ValueError, match=r"prompts.max_prompt_tokens: 4 drops every prompt \(3 of 3\); the shortest has 5 tokens, "
                                         r"the longest 13 \(s.jsonl row 2: '123\+456\+789='\); raise it to 13"):
        build_prompts(raw, PromptsParams(max_prompt_tokens=4), tokenizer)


def test_build_prompts_of_an_empty_table():
    tokenizer = build_tiny_tokenizer()
    table, dropped = build_prompts(raw_table([]), PromptsParams(), tokenizer)
    assert table.num_rows == 0 and table.schema.equals(PROMPTS)
    assert dropped == {"duplicates": 0, "too_long": 0, "conflicting": 0}


def test_extra_is_carried_and_does_not_enter_the_id():
    tokenizer = build_tiny_tokenizer()
    raw = raw_table([("1+1=", "2"), ("2+2=", "4"), ("1+1=", "2")], extras=['{"level": 1}', "{}", '{"level": 9}'])
    table, dropped = build_prompts(raw, PromptsParams(max_prompt_tokens=64), tokenizer)
    assert table["extra"].to_pylist() == ['{"level": 1}', "{}"]  # the duplicate (same problem and answer) is dropped, extra and all
    assert table["prompt_id"].to_pylist()[0] == prompt_id("1+1=", "2") and dropped["duplicates"] == 1


CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


def test_chat_template_true_needs_a_tokenizer_that_has_one():
    tokenizer = build_tiny_tokenizer()
    assert not tokenizer.chat_template
    with pytest.raises(ChatTemplateError, match=r"^prompts\.chat_template: the policy tokenizer \(\w+\) has no chat template; "
                                                r"set chat_template to a Jinja template string, or to false$"):
        build_prompts(raw_table([("1+1=", "2")]), PromptsParams(chat_template=True), tokenizer)


def test_chat_template_of_the_tokenizer_or_given_in_params():
    tokenizer = build_tiny_tokenizer()
    params = PromptsParams(eval_fraction=0.5, max_prompt_tokens=64, template="Q: {prompt}", chat_template=CHAT)
    table, _ = build_prompts(raw_table([("1+1=", "2")]), params, tokenizer)
    assert table["prompt"].to_pylist() == ["<user>Q: 1+1=<assistant>"]
    assert table["problem"].to_pylist() == ["1+1="] and table["prompt_id"].to_pylist() == [prompt_id("1+1=", "2")]
    assert table["n_tokens"].to_pylist() == [len(tokenizer("<user>Q: 1+1=<assistant>")["input_ids"])]
    tokenizer.chat_template = CHAT  # a tokenizer that brings its own template, as most chat models' do
    own, _ = build_prompts(raw_table([("1+1=", "2")]), params.model_copy(update={"chat_template": True}), tokenizer)
    assert own["prompt"].to_pylist() == ["<user>Q: 1+1=<assistant>"]


CONFLICTING = [("3+4=", "7"), ("3+4=", "6"), ("3+4=", "7"), ("3+4=", "8"), ("2+2=", "4")]


def test_a_problem_with_different_answers_stops_the_step_naming_its_rows():
    with pytest.raises(ValueError, match=r"(?s)1 problems appear with different answers.*'3\+4=': '7' \(s.jsonl:0, s.jsonl:2\), '6' \(s.jsonl:1\)"):
        build_prompts(raw_table(CONFLICTING), PromptsParams(), build_tiny_tokenizer())


@pytest.mark.parametrize("policy, problems, answers, dropped", [("drop", ["2+2="], ["4"], 4), ("first", ["3+4=", "2+2="], ["7", "4"], 2)])
def test_conflicting_answers_dropped_or_first_are_counted(policy, problems, answers, dropped):
    table, counts = build_prompts(raw_table(CONFLICTING), PromptsParams(conflicting_answers=policy), build_tiny_tokenizer())
    assert table["problem"].to_pylist() == problems and table["answer"].to_pylist() == answers
    assert counts["conflicting"] == dropped
