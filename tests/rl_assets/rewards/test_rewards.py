"""rewards.py: the built-in reward functions, loading user functions, and scoring a stored table."""

from __future__ import annotations

import math
import re
import sys
import textwrap

import pyarrow as pa
import pytest

from rl_assets.core.config import RewardsParams
from rl_assets.rewards import (BUILT_IN, answer_format, arithmetic_answer, resolve_reward_function, reward_config_hash, score_rollouts,
                               summarize_rewards)
from rl_assets.core.schemas import rewards_schema

from rl_assets_support import rollouts_table

USER_MODULE = "rl_assets_test_user_rewards"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user reward module on sys.path, removed from sys.modules afterwards."""
    (tmp_path / f"{USER_MODULE}.py").write_text(textwrap.dedent("""
        import math

        CALLS = []
        NOT_A_FUNCTION = 3

        def length_bonus(completions, **kwargs):
            CALLS.append(sorted(kwargs))
            return [float(len(c)) for c in completions]

        def some_none(completions, **kwargs):
            return [None if i % 2 else 2.0 for i in range(len(completions))]

        def nan_on_third(completions, **kwargs):
            return [math.nan if i == 2 else 0.0 for i in range(len(completions))]

        def inf_on_first(completions, **kwargs):
            return [math.inf if i == 0 else 0.0 for i in range(len(completions))]

        def too_few(completions, **kwargs):
            return [0.0]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, USER_MODULE, raising=False)
    yield
    sys.modules.pop(USER_MODULE, None)


# --- built-in functions (TRL signature: completions plus keyword columns) ------------------------


@pytest.mark.parametrize("completion,answer,expected", [
    ("42", "42", 1.0),
    (" 42 apples", "42", 1.0),
    ("   42", "42", 1.0),
    ("-5", "-5", 1.0),
    (" -5 is it", "-5", 1.0),
    ("5", "-5", 0.0),
    ("-5", "5", 0.0),
    ("3.0", "3", 1.0),
    ("41", "42", 0.0),
    ("7 then 42", "42", 0.0),  # only the first number counts
    ("x=42", "42", 1.0),
    ("no idea", "42", 0.0),
    ("", "42", 0.0),
])
def test_arithmetic_answer(completion, answer, expected):
    assert arithmetic_answer([completion], answer=[answer]) == [expected]


def test_arithmetic_answer_accepts_trl_keyword_columns():
    scores = arithmetic_answer(["1", "2", "3"], answer=["1", "1", "3"], prompts=["a", "b", "c"], completion_ids=[[], [], []])
    assert scores == [1.0, 0.0, 1.0]


def test_arithmetic_answer_with_a_non_numeric_reference_scores_zero():
    assert arithmetic_answer(["5"], answer=["five"]) == [0.0]


def test_arithmetic_answer_distinguishes_large_integers():
    assert arithmetic_answer(["10000000000000001"], answer=["10000000000000000"]) == [0.0]


@pytest.mark.parametrize("completion,expected", [
    ("12", 1.0),
    (" 12 ", 1.0),
    ("12\n", 1.0),
    ("-3", 1.0),
    ("1.5", 1.0),
    ("12 and more", 0.0),
    ("12=12", 0.0),
    ("", 0.0),
    ("abc", 0.0),
    ("1.", 0.0),
])
def test_answer_format(completion, expected):
    assert answer_format([completion]) == [expected]


# --- resolving names ---------------------------------------------------------------------------


def test_resolve_built_ins():
    assert resolve_reward_function("arithmetic_answer") is arithmetic_answer
    assert resolve_reward_function("answer_format") is answer_format
    assert resolve_reward_function("rl_assets.rewards:answer_format") is answer_format


def test_resolve_a_user_function(user_module):
    function = resolve_reward_function(f"{USER_MODULE}:length_bonus")
    assert function.__name__ == "length_bonus" and function(["ab", ""]) == [2.0, 0.0]


@pytest.mark.parametrize("name,expected", [
    ("nope", f"rewards.functions: unknown reward 'nope'; built in: {sorted(BUILT_IN)}, or use 'module:function'"),
    ("no_such_module_xyz:f", "rewards.functions: cannot load 'no_such_module_xyz:f': No module named 'no_such_module_xyz'"),
    (f"{USER_MODULE}:missing", f"rewards.functions: cannot load '{USER_MODULE}:missing'"),
    (f"{USER_MODULE}:NOT_A_FUNCTION", f"rewards.functions: '{USER_MODULE}:NOT_A_FUNCTION' is not callable"),
])
def test_resolve_errors(user_module, name, expected):
    with pytest.raises(ValueError) as caught:
        resolve_reward_function(name)
    assert str(caught.value).startswith(expected)


# --- scoring a stored table ----------------------------------------------------------------------


def small_rollouts():
    """Two prompts x two samples."""
    return rollouts_table([
        {"prompt_id": "p1", "sample_idx": 0, "answer": "5", "completion": "5"},
        {"prompt_id": "p1", "sample_idx": 1, "answer": "5", "completion": "5 apples"},
        {"prompt_id": "p2", "sample_idx": 0, "answer": "-3", "completion": "7"},
        {"prompt_id": "p2", "sample_idx": 1, "answer": "-3", "completion": "no"},
    ])


def rewards_params(*functions) -> RewardsParams:
    return RewardsParams(functions=[{"name": n, "weight": w} for n, w in functions])


def test_score_rollouts_columns_and_weighted_total():
    params = rewards_params(("arithmetic_answer", 1.0), ("answer_format", 0.5))
    table = score_rollouts(small_rollouts(), params, rollouts_hash="abc")
    assert table.schema.equals(rewards_schema(["arithmetic_answer", "answer_format"]))
    assert table["score_arithmetic_answer"].to_pylist() == [1.0, 1.0, 0.0, 0.0]
    assert table["score_answer_format"].to_pylist() == [1.0, 0.0, 1.0, 0.0]
    assert table["reward"].to_pylist() == [1.5, 1.0, 0.5, 0.0]
    assert table["prompt_id"].to_pylist() == ["p1", "p1", "p2", "p2"]
    assert table["sample_idx"].to_pylist() == [0, 1, 0, 1]
    assert set(table["policy_id"].to_pylist()) == {"policy"} and set(table["round"].to_pylist()) == {1}
    assert set(table["rollouts_hash"].to_pylist()) == {"abc"}
    assert set(table["reward_config_hash"].to_pylist()) == {reward_config_hash(params)}


def test_reward_config_hash_follows_names_and_weights():
    base = reward_config_hash(rewards_params(("arithmetic_answer", 1.0)))
    assert base == reward_config_hash(rewards_params(("arithmetic_answer", 1.0)))
    assert base != reward_config_hash(rewards_params(("arithmetic_answer", 2.0)))
    assert base != reward_config_hash(rewards_params(("answer_format", 1.0)))


def test_user_function_gets_the_table_columns_and_a_short_column_name(user_module):
    table = score_rollouts(small_rollouts(), rewards_params((f"{USER_MODULE}:length_bonus", 2.0)), "h")
    assert table.column_names[-1] == "score_length_bonus"
    assert table["score_length_bonus"].to_pylist() == [1.0, 8.0, 1.0, 2.0]
    assert table["reward"].to_pylist() == [2.0, 16.0, 2.0, 4.0]
    assert sys.modules[USER_MODULE].CALLS == [["answer", "completion_ids", "prompt", "prompt_id", "prompts", "truncated"]]


def test_none_scores_stay_null_and_count_as_zero(user_module):
    table = score_rollouts(small_rollouts(), rewards_params((f"{USER_MODULE}:some_none", 1.0), ("arithmetic_answer", 1.0)), "h")
    assert table["score_some_none"].to_pylist() == [2.0, None, 2.0, None]
    assert table["reward"].to_pylist() == [3.0, 1.0, 2.0, 0.0]


@pytest.mark.parametrize("function,value,key", [
    ("nan_on_third", "nan", "prompt_id=p2 sample_idx=0"),
    ("inf_on_first", "inf", "prompt_id=p1 sample_idx=0"),
])
def test_non_finite_score_names_function_and_rollout(user_module, function, value, key):
    with pytest.raises(ValueError) as caught:
        score_rollouts(small_rollouts(), rewards_params((f"{USER_MODULE}:{function}", 1.0)), "h")
    assert str(caught.value) == f"reward '{USER_MODULE}:{function}' returned {value} for rollout {key}"


def test_wrong_number_of_scores(user_module):
    with pytest.raises(ValueError, match=rf"reward '{USER_MODULE}:too_few' returned 1 scores for 4 rollouts"):
        score_rollouts(small_rollouts(), rewards_params((f"{USER_MODULE}:too_few", 1.0)), "h")


# --- summary -------------------------------------------------------------------------------------


def test_summarize_rewards(user_module):
    table = score_rollouts(small_rollouts(), rewards_params(("arithmetic_answer", 1.0), (f"{USER_MODULE}:some_none", 0.0)), "h")
    # totals [1, 1, 0, 0]: mean 0.5, sample std sqrt(1/3); both groups all-equal.
    summary = summarize_rewards(table, group_size=2)
    assert summary["rows"] == 4
    assert summary["reward_mean"] == pytest.approx(0.5)
    assert summary["reward_std"] == pytest.approx(math.sqrt(1 / 3))
    assert summary["equal_reward_group_share"] == 1.0
    assert summary["mean_score_arithmetic_answer"] == pytest.approx(0.5)
    assert summary["mean_score_some_none"] == pytest.approx(2.0)  # None scores are left out of the mean
    by_four = summarize_rewards(table, group_size=4)
    assert by_four["equal_reward_group_share"] == 0.0


def test_summarize_rewards_mixed_groups_and_all_none_scores():
    schema = rewards_schema(["f"])
    rows = [{"round": 1, "prompt_id": f"p{i // 2}", "sample_idx": i % 2, "policy_id": "x", "reward": r, "reward_config_hash": "c",
             "rollouts_hash": "h", "score_f": None} for i, r in enumerate([1.0, 0.0, 2.0, 2.0, 0.5, 0.5])]
    summary = summarize_rewards(pa.Table.from_pylist(rows, schema=schema), group_size=2)
    assert summary["equal_reward_group_share"] == pytest.approx(2 / 3)
    assert summary["reward_mean"] == pytest.approx(1.0)
    assert math.isnan(summary["mean_score_f"])


# --- options, load-time validation, extra columns ------------------------------------------------


def test_options_are_bound_and_enter_the_config_hash():
    params = RewardsParams(functions=[{"name": "format_regex", "options": {"pattern": "[0-9]+"}},
                                      {"name": "format_regex", "column": "has_apples", "options": {"pattern": "apples", "search": True},
                                       "weight": 0.5}])
    table = score_rollouts(small_rollouts(), params, "h")
    assert table["score_format_regex"].to_pylist() == [1.0, 0.0, 1.0, 0.0]
    assert table["score_has_apples"].to_pylist() == [0.0, 1.0, 0.0, 0.0]
    assert table["reward"].to_pylist() == [1.0, 0.5, 1.0, 0.0]
    other = RewardsParams(functions=[{"name": "format_regex", "options": {"pattern": "[0-9]*"}},
                                     params.functions[1].model_dump()])
    assert reward_config_hash(params) != reward_config_hash(other)


@pytest.mark.parametrize("functions,message", [
    ([{"name": "nope"}], "rewards.functions[0].name: rewards.functions: unknown reward 'nope'"),
    ([{"name": "arithmetic_answer"}, {"name": "no_such_module_xyz:f"}], "rewards.functions[1].name: rewards.functions: cannot load"),
    ([{"name": "format_regex"}], "rewards.functions[0].options: reward 'format_regex' needs option 'pattern'"),
    ([{"name": "length_penalty", "options": {"target": 1, "max_length": 4, "units": "chars"}}],
     "rewards.functions[0].options: reward 'length_penalty' has no option 'units'"),
    ([{"name": "math_answer", "options": {"completions": []}}], "reward 'math_answer' has no option 'completions'"),
    ([{"name": "math_answer", "options": {"answer": "4"}}], "reward 'math_answer' has no option 'answer'; its options: ['pick']"),
    ([{"name": "format_regex", "options": {"pattern": "a"}}, {"name": "format_regex", "options": {"pattern": "b"}}],
     "repeated: ['format_regex']"),
    ([{"name": "math_answer", "column": "bad name"}], "rewards.functions[0].column: String should match pattern"),
])
def test_params_refuse_unloadable_functions_and_bad_options(functions, message):
    """Parsing checks the shape (repeated columns, a bad column name); the preflight loads the functions and checks their options."""
    from rl_assets.core.config import ParamsError
    from rl_assets.core.params_file import parse_params
    from rl_assets.run.preflight import check_user_code

    raw = {"raw_data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "rewards": {"functions": functions}}
    with pytest.raises(ParamsError) as caught:
        check_user_code(parse_params(raw))
    assert message in str(caught.value)


def test_params_load_a_user_function_and_its_options(user_module, tmp_path):
    from rl_assets.core.config import ParamsError
    from rl_assets.core.params_file import parse_params
    from rl_assets.run.preflight import check_user_code

    raw = {"raw_data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]},
           "rewards": {"functions": [{"name": f"{USER_MODULE}:length_bonus"}]}}
    params = parse_params(raw)
    check_user_code(params)
    assert params.rewards.functions[0].score_name == "length_bonus"
    raw["rewards"]["functions"][0]["options"] = {"scale": 2}
    with pytest.raises(ParamsError, match=rf"reward '{USER_MODULE}:length_bonus' has no option 'scale'"):
        check_user_code(parse_params(raw))


def test_a_misspelt_reward_function_is_named_before_the_correctness_it_breaks(user_module):
    """'module:corect' has score column 'corect', so evaluation.correctness 'length_bonus' misses it too: the function's own
    error is the one reported, and parsing alone (which cannot import it) does not blame correctness first."""
    from rl_assets.core.config import ParamsError
    from rl_assets.core.params_file import parse_params
    from rl_assets.run.preflight import check_user_code

    raw = {"raw_data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]},
           "rewards": {"functions": [{"name": f"{USER_MODULE}:length_bonu"}]}, "evaluation": {"correctness": "length_bonus"}}
    params = parse_params(raw)
    with pytest.raises(ParamsError) as caught:
        check_user_code(params, "my_task/params.yaml")
    assert str(caught.value).startswith(f"my_task/params.yaml: rewards.functions[0].name: rewards.functions: cannot load "
                                        f"'{USER_MODULE}:length_bonu': module '{USER_MODULE}' has no attribute 'length_bonu'")
    assert "evaluation.correctness" not in str(caught.value)
    raw["rewards"]["functions"][0]["name"] = f"{USER_MODULE}:length_bonus"  # fixed: it loads, and correctness names it
    check_user_code(parse_params(raw))
    raw["evaluation"]["correctness"] = "length_bonsu"  # a misspelt correctness is still named, under its own key
    with pytest.raises(ParamsError, match=r"^params\.yaml: evaluation\.correctness: 'length_bonsu' is not one of the reward "
                                          r"functions \['length_bonus'\]$"):
        check_user_code(parse_params(raw))


def test_params_loading_does_not_import_torch():
    import subprocess

    code = ("import sys; from rl_assets.core.params_file import parse_params; from rl_assets.run.preflight import check_user_code; "
            "check_user_code(parse_params({'raw_data': {'sources': [{'kind': 'jsonl', 'path': 'x'}]}, 'rewards': {'functions': ["
            "{'name': 'reward_model', 'options': {'path': 'data/reward_model'}}, {'name': 'code_execution'}]}})); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', 'trl'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_extra_column_keys_become_keyword_arguments(user_module):
    rows = [{"prompt_id": "p1", "sample_idx": 0, "completion": "def f(): return 1", "extra": '{"tests": ["assert f() == 1"], "lang": "py"}'},
            {"prompt_id": "p1", "sample_idx": 1, "completion": "def f(): return 2", "extra": '{"tests": ["assert f() == 1"]}'},
            {"prompt_id": "p2", "sample_idx": 0, "completion": "4", "extra": None},
            {"prompt_id": "p2", "sample_idx": 1, "completion": "4", "extra": '{"answer": "shadowed"}'}]
    table = rollouts_table(rows)
    from rl_assets.rewards import reward_kwargs

    kwargs = reward_kwargs(table)
    assert kwargs["tests"] == [["assert f() == 1"], ["assert f() == 1"], None, None]
    assert kwargs["lang"] == ["py", None, None, None]
    assert kwargs["answer"] == ["2", "2", "2", "2"]  # a column always wins over an extra key
    scored = score_rollouts(table, RewardsParams(functions=[{"name": "code_execution"}]), "h")
    assert scored["score_code_execution"].to_pylist() == [1.0, 0.0, None, None]


def test_a_reward_written_for_trl_gets_prompts_by_trls_name(monkeypatch):
    """TRL calls reward_func(prompts=..., completions=..., completion_ids=..., **columns): the same function runs here."""
    import types

    seen = {}

    def trl_style(prompts, completions, completion_ids, **kwargs):
        seen["prompts"] = prompts
        return [float(c in p) for p, c in zip(prompts, completions)]

    monkeypatch.setitem(sys.modules, "trl_style_rewards", types.SimpleNamespace(trl_style=trl_style))
    table = rollouts_table([{"prompt_id": "p1", "sample_idx": 0, "prompt": "7*8=", "completion": "8"},
                            {"prompt_id": "p1", "sample_idx": 1, "prompt": "7*8=", "completion": "56"}])
    scored = score_rollouts(table, RewardsParams(functions=[{"name": "trl_style_rewards:trl_style"}]), "h")
    assert seen["prompts"] == ["7*8=", "7*8="] and scored["score_trl_style"].to_pylist() == [1.0, 0.0]


def test_extra_that_is_not_an_object_names_the_rollout():
    table = rollouts_table([{"prompt_id": "p9", "sample_idx": 3, "extra": "[1, 2]"}])
    with pytest.raises(ValueError, match=r"rollout prompt_id=p9 sample_idx=3: `extra` is not a JSON object"):
        score_rollouts(table, rewards_params(("arithmetic_answer", 1.0)), "h")


@pytest.mark.parametrize("returned,message", [
    ("'1.0'", "returned '1.0', not a number, for rollout prompt_id=p1 sample_idx=0"),
    ("[1.0]", "returned [1.0], not a number, for rollout prompt_id=p1 sample_idx=0"),
])
def test_non_numeric_scores_name_function_and_rollout(tmp_path, monkeypatch, returned, message):
    (tmp_path / "rl_assets_test_bad_scores.py").write_text(f"def bad(completions, **kwargs):\n    return [{returned}] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=re.escape(f"reward 'rl_assets_test_bad_scores:bad' {message}")):
        score_rollouts(small_rollouts(), rewards_params(("rl_assets_test_bad_scores:bad", 1.0)), "h")
    sys.modules.pop("rl_assets_test_bad_scores", None)


def test_a_failing_function_is_named(user_module):
    with pytest.raises(RuntimeError, match=r"reward 'format_regex' failed: error: missing \), unterminated subpattern"):
        score_rollouts(small_rollouts(), RewardsParams(functions=[{"name": "format_regex", "options": {"pattern": "(a"}}]), "h")


def test_each_score_column_carries_its_function_weight_and_options_through_the_file(tmp_path):
    from rl_assets.core.schemas import read_table, write_table

    params = RewardsParams(functions=[{"name": "arithmetic_answer", "weight": 1.0},
                                      {"name": "format_regex", "weight": -0.25, "options": {"pattern": "[0-9]+"}}])
    table = score_rollouts(small_rollouts(), params, "h")
    write_table(table, tmp_path / "rewards.parquet", table.schema, "rewards")
    schema = read_table(tmp_path / "rewards.parquet", "rewards").schema
    assert schema.field("score_format_regex").metadata == {b"rl_assets.function": b"format_regex", b"rl_assets.weight": b"-0.25",
                                                            b"rl_assets.options": b'{"pattern": "[0-9]+"}'}
    assert schema.field("score_arithmetic_answer").metadata[b"rl_assets.weight"] == b"1.0"


@pytest.mark.parametrize("name,options,expected", [
    ("math_answer", {}, [1.0, 0.0]),
    ("arithmetic_answer", {}, [1.0, 0.0]),
    ("answer_format", {}, [1.0, 0.0]),
    ("format_regex", {"pattern": "[0-9]+"}, [1.0, 0.0]),
    ("required_tags", {"tags": ["a"]}, [0.0, 0.0]),
    ("length_penalty", {"target": 1, "max_length": 3}, [0.0, -0.5]),
    ("repetition_penalty", {"ngram_size": 1, "unit": "chars"}, [0.0, 0.0]),
    ("code_execution", {}, [None, None]),
])
def test_built_ins_take_the_keywords_trl_passes(name, options, expected):
    """GRPOTrainer calls f(prompts=, completions=, completion_ids=, trainer_state=, **dataset columns)."""
    function = resolve_reward_function(name, options)
    scores = function(prompts=["1+1=", "2+2="], completions=["2", "no"], completion_ids=[[5], [6, 7]], trainer_state=None,
                      answer=["2", "4"], log_extra=None, log_metric=None)
    assert scores == expected


def test_a_user_module_that_fails_to_import_is_a_load_error(tmp_path, monkeypatch):
    from rl_assets.core.config import ParamsError
    from rl_assets.core.params_file import parse_params
    from rl_assets.run.preflight import check_user_code

    (tmp_path / "rl_assets_test_broken_rewards.py").write_text("def f(completions, **kwargs)\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = {"raw_data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "rewards": {"functions": [{"name": "rl_assets_test_broken_rewards:f"}]}}
    with pytest.raises(ParamsError, match=r"rewards.functions\[0\].name: .*cannot load 'rl_assets_test_broken_rewards:f': SyntaxError"):
        check_user_code(parse_params(raw))
