"""raw_generators.py: the seeded templates generator, safe arithmetic, and user `module:function` generators."""

from __future__ import annotations

import json
import operator
import re
import sys
import uuid

import pytest

from rl_assets.data.raw_generators import evaluate_expression, expression_problem, generate_problems, module_file, run_user_generator
from rl_assets.data.raw_files import BadRow, RawDataError

from rl_assets_support import REPO

REPO_TEMPLATES = REPO / "data" / "raw" / "math_problems.json"


PHRASINGS = [  # (pattern, operation on the two numbers in the order they appear)
    (r"(\d+)\+(\d+)=", operator.add), (r"(\d+) plus (\d+) is", operator.add), (r"add (\d+) and (\d+):", operator.add),
    (r"sum of (\d+) and (\d+)\?", operator.add), (r"(\d+)-(\d+)=", operator.sub), (r"(\d+) minus (\d+) is", operator.sub),
    (r"take (\d+) from (\d+):", lambda b, a: a - b), (r"(\d+)-(\d+) is\?", operator.sub), (r"(\d+)\*(\d+)=", operator.mul),
    (r"(\d+) times (\d+) is", operator.mul), (r"multiply (\d+) by (\d+):", operator.mul), (r"(\d+)\*(\d+) is\?", operator.mul),
]


def solve(prompt: str) -> int:
    """Independent answer of a generated prompt in one of the default phrasings."""
    for pattern, operation in PHRASINGS:
        match = re.fullmatch(pattern, prompt)
        if match:
            return operation(int(match.group(1)), int(match.group(2)))
    raise AssertionError(f"unexpected prompt {prompt!r}")


def write_templates(folder, templates) -> str:
    (folder / "templates.json").write_text(json.dumps({"templates": templates}))
    return folder / "templates.json"


# --- templates generator -------------------------------------------------------------------------


def test_generator_is_reproducible_for_a_seed_and_differs_across_seeds():
    first = generate_problems(REPO_TEMPLATES, 200, seed=0)
    assert first == generate_problems(REPO_TEMPLATES, 200, seed=0)
    assert first != generate_problems(REPO_TEMPLATES, 200, seed=1)
    assert [row["source_row"] for row in first] == list(range(200))


def test_generated_answers_are_correct():
    rows = generate_problems(REPO_TEMPLATES, 500, seed=3)
    assert {op for row in rows for op in "+-*" if op in row["prompt"]} == {"+", "-", "*"}  # every template drawn
    for row in rows:
        assert row["answer"] == str(solve(row["prompt"])), row


def test_generator_evaluates_nested_expressions_within_ranges(tmp_path):
    path = write_templates(tmp_path, [{"prompt": "({a}+{b})*{c}//{d}=", "answer": "(a+b)*c//d", "ranges": {"a": [0, 9], "b": [5, 5], "c": [-3, 3], "d": [1, 4]}}])
    for row in generate_problems(path, 100, seed=0):
        a, b, c, d = map(int, re.fullmatch(r"\((-?\d+)\+(-?\d+)\)\*(-?\d+)//(-?\d+)=", row["prompt"]).groups())
        assert 0 <= a <= 9 and b == 5 and -3 <= c <= 3 and 1 <= d <= 4
        assert row["answer"] == str((a + b) * c // d)


def test_generator_template_weight_zero_is_never_drawn(tmp_path):
    path = write_templates(tmp_path, [
        {"prompt": "{a}+{b}=", "answer": "a+b", "ranges": {"a": [0, 9], "b": [0, 9]}, "weight": 1},
        {"prompt": "{a}*{b}=", "answer": "a*b", "ranges": {"a": [0, 9], "b": [0, 9]}, "weight": 0},
    ])
    assert all("+" in row["prompt"] for row in generate_problems(path, 100, seed=0))


T = {"prompt": "{a}=", "answer": "a", "ranges": {"a": [0, 1]}}


@pytest.mark.parametrize("content,expected", [
    ("not json", ":1: invalid JSON (Expecting value at column 1)"),
    (json.dumps({"other": []}), ": expected an object with a 'templates' list"),
    (json.dumps({"templates": []}), ": 'templates' is empty"),
    (json.dumps({"templates": ["x"]}), ": templates[0]: expected an object, got str"),
    (json.dumps({"templates": [{**T, "anwser": "a"}]}), ": templates[0]: unknown key 'anwser'; allowed: answer, prompt, ranges, weight"),
    (json.dumps({"templates": [T, {"prompt": "{a}=", "ranges": {"a": [0, 1]}}]}), ": templates[1]: missing key 'answer'"),
    (json.dumps({"templates": [{**T, "answer": "a+c"}]}), ": templates[0].answer: unknown variable 'c'; ranges define: a"),
    (json.dumps({"templates": [{**T, "answer": "a**2"}]}), ": templates[0].answer: unsupported operator ** (allowed: + - * // % unary - and parentheses)"),
    (json.dumps({"templates": [{**T, "answer": "a/2"}]}), ": templates[0].answer: unsupported operator / (allowed: + - * // % unary - and parentheses)"),
    (json.dumps({"templates": [{**T, "answer": "a +"}]}), ": templates[0].answer: not an arithmetic expression (invalid syntax)"),
    (json.dumps({"templates": [{**T, "answer": "f(a)"}]}), ": templates[0].answer: unsupported element Call (allowed: + - * // % unary - and parentheses)"),
    (json.dumps({"templates": [{**T, "prompt": "{b}="}]}), ": templates[0].prompt: placeholder {b} has no range"),
    (json.dumps({"templates": [{**T, "ranges": {"a": [5, 1]}}]}), ": templates[0].ranges.a: expected [low, high] integers with low <= high, got [5, 1]"),
    (json.dumps({"templates": [{**T, "ranges": {"a": [0, 1.5]}}]}), ": templates[0].ranges.a: expected [low, high] integers with low <= high, got [0, 1.5]"),
    (json.dumps({"templates": [{**T, "weight": -1}]}), ": templates[0].weight: expected a number >= 0, got -1"),
    (json.dumps({"templates": [{**T, "weight": 0}]}), ": every template has weight 0"),
    (json.dumps({"templates": [{**T, "answer": "1//a", "ranges": {"a": [0, 0]}}]}), ": templates[0].answer: division by zero with a=0"),
], ids=["not json", "no templates key", "empty templates", "template not an object", "unknown key", "missing answer",
        "unknown variable", "power operator", "true division", "answer syntax error", "function call",
        "prompt variable without range", "reversed range", "float range", "negative weight", "all weights zero", "division by zero"])
def test_bad_templates_files_name_the_file_template_and_key(tmp_path, content, expected):
    path = tmp_path / "templates.json"
    path.write_text(content)
    with pytest.raises(RawDataError) as caught:
        generate_problems(path, 3, seed=0)
    assert str(caught.value) == f"{path}{expected}"


def test_templates_are_all_checked_before_drawing(tmp_path):
    """A broken template that the seed would never draw (weight 0) still fails the load."""
    path = write_templates(tmp_path, [{**T, "weight": 1}, {**T, "answer": "a**2", "weight": 0}])
    with pytest.raises(RawDataError, match=r"templates\[1\]\.answer: unsupported operator \*\*"):
        generate_problems(path, 1, seed=0)


# --- evaluate_expression -------------------------------------------------------------------------


@pytest.mark.parametrize("expression,variables,expected", [
    ("a+b", {"a": 2, "b": 3}, 5),
    ("a-b", {"a": 2, "b": 3}, -1),
    ("a*(b-3)", {"a": 4, "b": 5}, 8),
    ("a//b", {"a": 7, "b": 2}, 3),
    ("a%b", {"a": 7, "b": 3}, 1),
    ("-a+10", {"a": 4}, 6),
    ("-(a*b)", {"a": -2, "b": 3}, 6),
    ("12", {}, 12),
])
def test_evaluate_expression(expression, variables, expected):
    assert evaluate_expression(expression, variables) == expected
    assert expression_problem(expression, set(variables)) is None


@pytest.mark.parametrize("expression", [
    "c+1",  # a name not given
    "__import__('os')",
    "a**2",
    "a/2",  # true division would give floats
    "a.real",
    "'1'",
    "1.5",
    "True",
    "[a]",
    "a if a else 1",
])
def test_evaluate_expression_rejects_anything_else(expression):
    with pytest.raises(ValueError, match="unsupported element"):
        evaluate_expression(expression, {"a": 3})
    assert expression_problem(expression, {"a"}) is not None


# --- user generators (module:function) ----------------------------------------------------------

USER_GENERATOR = '''
import random


def rows(count, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append({"prompt": f"{a}+{b}=", "answer": a + b, "level": "easy"})
    return out


def not_a_list(count, seed):
    return 3


def wrong_count(count, seed):
    return [{"prompt": "1+1=", "answer": "2"}]


def strings(count, seed):
    return ["1+1=" for _ in range(count)]


def fails(count, seed):
    raise RuntimeError("no data today")
'''


@pytest.fixture()
def user_module(tmp_path):
    name = f"user_gen_{uuid.uuid4().hex[:8]}"  # a fresh module name per test
    (tmp_path / f"{name}.py").write_text(USER_GENERATOR)
    return name


def test_user_generator_rows_are_seeded(tmp_path, user_module):
    first = list(run_user_generator(f"{user_module}:rows", 20, seed=0, root=tmp_path))
    assert first == list(run_user_generator(f"{user_module}:rows", 20, seed=0, root=tmp_path))
    assert first != list(run_user_generator(f"{user_module}:rows", 20, seed=1, root=tmp_path))
    assert [n for n, _ in first] == list(range(20))
    assert all(row["answer"] == sum(map(int, row["prompt"][:-1].split("+"))) for _, row in first)


def test_module_file_is_found_under_the_root_without_importing(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('imported')")
    (tmp_path / "pkg" / "sub" / "gen.py").write_text("")
    assert module_file("pkg.sub.gen", tmp_path) == tmp_path / "pkg" / "sub" / "gen.py"
    assert module_file("pkg", tmp_path) == tmp_path / "pkg" / "__init__.py"
    assert module_file("no_such_module_anywhere", tmp_path) is None


@pytest.mark.parametrize("function,expected", [
    ("not_a_list", "returned int; expected a list of row dicts"),
    ("wrong_count", "returned 1 rows; expected count=3"),
    ("fails", "raised RuntimeError: no data today"),
    ("missing", "has no function 'missing'"),
])
def test_user_generator_errors(tmp_path, user_module, function, expected):
    with pytest.raises(RawDataError) as caught:
        list(run_user_generator(f"{user_module}:{function}", 3, seed=0, root=tmp_path))
    assert str(caught.value).startswith(f"python:{user_module}:{function}: ") and str(caught.value).endswith(expected)


def test_user_generator_rows_that_are_not_dicts_are_bad_rows(tmp_path, user_module):
    rows = list(run_user_generator(f"{user_module}:strings", 2, seed=0, root=tmp_path))
    assert [(n, str(r)) for n, r in rows] == [(n, f"python:{user_module}:strings: row {n}: expected a dict, got str") for n in range(2)]
    assert all(isinstance(r, BadRow) for _, r in rows)


def test_user_generator_module_that_fails_to_import(tmp_path):
    (tmp_path / "broken_gen_mod.py").write_text("import no_such_package_xyz\n")
    with pytest.raises(RawDataError, match=r"^python:broken_gen_mod:rows: importing .*broken_gen_mod\.py failed: "
                                           r"ModuleNotFoundError: No module named 'no_such_package_xyz'$"):
        list(run_user_generator("broken_gen_mod:rows", 1, seed=0, root=tmp_path))


def test_user_generator_module_not_found(tmp_path):
    with pytest.raises(RawDataError, match=r"^python:nowhere_mod_xyz:rows: module 'nowhere_mod_xyz' not found in the project or on sys.path$"):
        list(run_user_generator("nowhere_mod_xyz:rows", 1, seed=0, root=tmp_path))


def test_user_generator_may_yield_rows_and_import_its_neighbours_when_called(tmp_path):
    (tmp_path / "gen_helpers_abc.py").write_text("def problem(i):\n    return {'prompt': f'{i}*3=', 'answer': 3 * i}\n")
    (tmp_path / "gen_lazy_abc.py").write_text(
        "def rows(count, seed):\n    from gen_helpers_abc import problem\n    for i in range(count):\n        yield problem(seed + i)\n")
    assert list(run_user_generator("gen_lazy_abc:rows", 2, seed=4, root=tmp_path)) == [
        (0, {"prompt": "4*3=", "answer": 12}), (1, {"prompt": "5*3=", "answer": 15})]
    assert str(tmp_path) not in sys.path  # the project root is on sys.path only while the generator runs
