"""raw_data.py: the seeded generator, safe arithmetic, static sources and their error messages."""

from __future__ import annotations

import hashlib
import json
import operator
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_assets.config import RawDataParams, SourceParams, load_params
from rl_assets.raw_data import RawDataError, evaluate_expression, generate_problems, load_raw_data, read_static
from rl_assets.schemas import RAW_DATA

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


# --- generator -----------------------------------------------------------------------------------


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


@pytest.mark.parametrize("content,expected", [
    ("not json", "not a templates file"),
    (json.dumps({"other": []}), "not a templates file"),
    (json.dumps({"templates": []}), "'templates' is empty"),
    (json.dumps({"templates": [{"prompt": "{a}=", "answer": "a+c", "ranges": {"a": [0, 1]}}]}), "templates[0]: ValueError: unsupported element"),
    (json.dumps({"templates": [{"prompt": "{a}=", "answer": "a", "ranges": {"b": [0, 1]}}]}), "templates[0]: KeyError"),
    (json.dumps({"templates": [{"prompt": "{a}=", "answer": "1//a", "ranges": {"a": [0, 0]}}]}), "templates[0]: ZeroDivisionError"),
    (json.dumps({"templates": [{"prompt": "{a}=", "answer": "a +", "ranges": {"a": [0, 1]}}]}), "templates[0]: SyntaxError"),
], ids=["not json", "no templates key", "empty templates", "unknown variable", "prompt variable without range",
        "division by zero", "answer syntax error"])
def test_bad_templates_files_name_the_file_and_template(tmp_path, content, expected):
    path = tmp_path / "templates.json"
    path.write_text(content)
    with pytest.raises(RawDataError) as caught:
        generate_problems(path, 3, seed=0)
    assert str(caught.value).startswith(f"{path}: ") and expected in str(caught.value)


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


@pytest.mark.parametrize("expression", [
    "c+1",  # a name not given
    "__import__('os')",
    "a**2",
    "a/2",  # true division would give floats
    "a.real",
    "'1'",
    "1.5",
    "[a]",
    "a if a else 1",
])
def test_evaluate_expression_rejects_anything_else(expression):
    with pytest.raises(ValueError, match="unsupported element"):
        evaluate_expression(expression, {"a": 3})


# --- static sources -----------------------------------------------------------------------------


def jsonl(tmp_path, lines: list, name="extra.jsonl") -> SourceParams:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    (tmp_path / name).write_text(text)
    return SourceParams(kind="jsonl", path=name, columns={"prompt": "question", "answer": "solution"})


def test_jsonl_with_column_mapping(tmp_path):
    source = jsonl(tmp_path, [{"question": " 6+3= ", "solution": 9, "id": 1}, "", {"question": "1-2=", "solution": "-1"}])
    assert read_static(source, tmp_path) == [
        {"source_row": 1, "prompt": "6+3=", "answer": "9"},  # stripped; a number becomes text
        {"source_row": 3, "prompt": "1-2=", "answer": "-1"},  # blank lines are skipped but still counted
    ]


GOOD = {"question": "1+1=", "solution": "2"}


@pytest.mark.parametrize("second_line,expected", [
    ("{not json", "extra.jsonl:2: invalid JSON"),
    ("[1, 2]", "extra.jsonl:2: expected a JSON object, got list"),
    ('"text"', "extra.jsonl:2: expected a JSON object, got str"),
    ({"prompt": "1+1=", "solution": "2"}, "extra.jsonl: line 2: missing column 'question' (mapped to prompt)"),
    ({"question": "1+1="}, "extra.jsonl: line 2: missing column 'solution' (mapped to answer)"),
    ({"question": "   ", "solution": "2"}, "extra.jsonl: line 2: empty prompt in column 'question'"),
    ({"question": None, "solution": "2"}, "extra.jsonl: line 2: column 'question' must be text or a number, got NoneType"),
    ({"question": "1+1=", "solution": True}, "extra.jsonl: line 2: column 'solution' must be text or a number, got bool"),
    ({"question": "1+1=", "solution": [2]}, "extra.jsonl: line 2: column 'solution' must be text or a number, got list"),
], ids=["invalid json", "array line", "string line", "missing prompt column", "missing answer column", "empty prompt",
        "null value", "bool value", "list value"])
def test_jsonl_errors_name_file_and_line(tmp_path, second_line, expected):
    source = jsonl(tmp_path, [GOOD, second_line])
    with pytest.raises(RawDataError) as caught:
        read_static(source, tmp_path)
    assert expected in str(caught.value)


def test_jsonl_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    (tmp_path / "extra.jsonl").write_bytes(json.dumps(GOOD).encode() + b'\n{"question": "\xff", "solution": "1"}\n')
    source = SourceParams(kind="jsonl", path="extra.jsonl", columns={"prompt": "question", "answer": "solution"})
    with pytest.raises(RawDataError, match=r"^extra\.jsonl:2: not UTF-8 text"):
        read_static(source, tmp_path)


def test_jsonl_that_is_not_utf8_names_the_line_or_true_offset(tmp_path):
    lines = [json.dumps({"question": f"{i}+1=", "solution": str(i + 1)}) for i in range(900)]
    data = ("\n".join(lines) + "\n").encode() + b'{"question": "\xff", "solution": "1"}\n'
    (tmp_path / "extra.jsonl").write_bytes(data)
    source = SourceParams(kind="jsonl", path="extra.jsonl", columns={"prompt": "question", "answer": "solution"})
    with pytest.raises(RawDataError) as caught:
        read_static(source, tmp_path)
    message, offset = str(caught.value), data.index(b"\xff")
    assert "901" in message or f"byte {offset}" in message


def test_missing_static_file(tmp_path):
    with pytest.raises(RawDataError, match=r"^nope\.jsonl: file not found$"):
        read_static(SourceParams(kind="jsonl", path="nope.jsonl"), tmp_path)


def test_parquet_source_with_column_mapping(tmp_path):
    pq.write_table(pa.table({"q": ["2*3=", "7-9="], "a": [6, -2], "other": [0.5, 1.5]}), tmp_path / "p.parquet")
    source = SourceParams(kind="parquet", path="p.parquet", columns={"prompt": "q", "answer": "a"})
    assert read_static(source, tmp_path) == [
        {"source_row": 0, "prompt": "2*3=", "answer": "6"},
        {"source_row": 1, "prompt": "7-9=", "answer": "-2"},
    ]


def test_parquet_source_errors_name_the_row(tmp_path):
    pq.write_table(pa.table({"q": ["2*3=", ""], "a": ["6", "0"]}), tmp_path / "p.parquet")
    source = SourceParams(kind="parquet", path="p.parquet", columns={"prompt": "q", "answer": "a"})
    with pytest.raises(RawDataError, match=r"^p\.parquet: row 1: empty prompt in column 'q'$"):
        read_static(source, tmp_path)


def test_a_file_that_is_not_parquet_is_refused(tmp_path):
    (tmp_path / "p.parquet").write_text("hello")
    with pytest.raises(RawDataError, match=r"^p\.parquet: not a Parquet file"):
        read_static(SourceParams(kind="parquet", path="p.parquet"), tmp_path)


# --- load_raw_data -------------------------------------------------------------------------------


def test_load_raw_data_tags_rows_with_source_and_md5(tmp_path):
    templates = write_templates(tmp_path, [{"prompt": "{a}+{b}=", "answer": "a+b", "ranges": {"a": [0, 9], "b": [0, 9]}}])
    jsonl(tmp_path, [GOOD, {"question": "2+2=", "solution": "4"}])
    params = RawDataParams(sources=[
        SourceParams(kind="generator", path="templates.json", count=5),
        SourceParams(kind="jsonl", path="extra.jsonl", columns={"prompt": "question", "answer": "solution"}),
    ])
    table = load_raw_data(params, seed=0, root=tmp_path)
    assert table.schema.equals(RAW_DATA)
    md5 = lambda p: hashlib.md5(p.read_bytes()).hexdigest()  # noqa: E731
    assert table["source"].to_pylist() == ["generator:templates.json"] * 5 + ["extra.jsonl"] * 2
    assert table["source_hash"].to_pylist() == [md5(templates)] * 5 + [md5(tmp_path / "extra.jsonl")] * 2
    assert table["source_row"].to_pylist() == [0, 1, 2, 3, 4, 1, 2]
    assert table["prompt"].to_pylist()[5:] == ["1+1=", "2+2="]
    assert table.slice(0, 5).to_pylist() == load_raw_data(RawDataParams(sources=params.sources[:1]), seed=0, root=tmp_path).to_pylist()


def test_load_raw_data_on_the_repo_params():
    params = load_params(REPO / "params.yaml")
    table = load_raw_data(params.raw_data, params.seed, root=REPO)
    extra_lines = sum(1 for line in (REPO / "data/raw/arithmetic_extra.jsonl").read_text().splitlines() if line.strip())
    assert table.num_rows == params.raw_data.sources[0].count + extra_lines
    generated = table.filter(pa.compute.starts_with(table["source"], "generator:")).to_pylist()
    assert all(row["answer"] == str(solve(row["prompt"])) for row in generated)
