"""raw_data: read every configured source into one table, each row tagged with its source and hash.

Two kinds of source:
- static files (JSONL, Parquet) with a column mapping onto our `prompt` and `answer` fields;
- a seeded generator driven by a templates JSON, e.g.::

    {"templates": [{"prompt": "{a}+{b}=", "answer": "a+b", "ranges": {"a": [0, 99], "b": [0, 99]}}]}

  `answer` is an arithmetic expression over the template's variables (+ - * // % and parentheses).
"""

from __future__ import annotations

import ast
import json
import operator
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rl_assets.config import RawDataParams, SourceParams
from rl_assets.schemas import RAW_DATA
from rl_assets.storage import file_hash


class RawDataError(ValueError):
    """A source that cannot be read; the message names the file and, where known, the row."""


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def evaluate_expression(expression: str, variables: dict[str, int]) -> int:
    """Evaluate an integer arithmetic expression without `eval`.

    >>> evaluate_expression("a * (b - 3)", {"a": 4, "b": 5})
    8
    """

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in variables:
            return variables[node.id]
        raise ValueError(f"unsupported element {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval"))


def generate_problems(templates_path: Path, count: int, seed: int) -> list[dict]:
    """Draw `count` problems from the templates file, reproducibly for a given seed."""
    try:
        spec = json.loads(templates_path.read_text())
        templates = spec["templates"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise RawDataError(f"{templates_path}: not a templates file ({error})") from None
    if not templates:
        raise RawDataError(f"{templates_path}: 'templates' is empty")
    rng = random.Random(seed)
    weights = [t.get("weight", 1.0) for t in templates]
    rows = []
    for index in range(count):
        number = rng.choices(range(len(templates)), weights)[0]
        template = templates[number]
        try:
            variables = {name: rng.randint(low, high) for name, (low, high) in sorted(template["ranges"].items())}
            prompt = template["prompt"].format(**variables)
            answer = str(evaluate_expression(template["answer"], variables))
        except (KeyError, ValueError, TypeError, ZeroDivisionError, SyntaxError) as error:
            raise RawDataError(f"{templates_path}: templates[{number}]: {type(error).__name__}: {error}") from None
        rows.append({"source_row": index, "prompt": prompt, "answer": answer})
    return rows


def _read_jsonl(path: Path, label: str) -> list[dict]:
    rows = []
    with open(path, "rb") as handle:
        for line_number, raw_line in enumerate(handle, start=1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise RawDataError(f"{label}:{line_number}: not UTF-8 text ({error.reason} at column {error.start + 1})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise RawDataError(f"{label}:{line_number}: invalid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise RawDataError(f"{label}:{line_number}: expected a JSON object, got {type(record).__name__}")
            rows.append((line_number, record))
    return rows


def read_static(source: SourceParams, root: Path) -> list[dict]:
    """Rows of a static JSONL or Parquet file, mapped onto `prompt` and `answer`."""
    path = root / source.path
    if not path.is_file():
        raise RawDataError(f"{source.path}: file not found")
    mapping = {"prompt": "prompt", "answer": "answer", **source.columns}
    try:
        if source.kind == "jsonl":
            records = _read_jsonl(path, source.path)
        else:
            records = list(enumerate(pq.read_table(path).to_pylist(), start=0))
    except pa.ArrowInvalid as error:
        raise RawDataError(f"{source.path}: not a Parquet file ({error})") from None
    where = "line" if source.kind == "jsonl" else "row"
    rows = []
    for number, record in records:
        values = {}
        for field, column in mapping.items():
            if column not in record:
                raise RawDataError(f"{source.path}: {where} {number}: missing column {column!r} (mapped to {field})")
            value = record[column]
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise RawDataError(f"{source.path}: {where} {number}: column {column!r} must be text or a number, got {type(value).__name__}")
            values[field] = str(value).strip()
        if not values["prompt"]:
            raise RawDataError(f"{source.path}: {where} {number}: empty prompt in column {mapping['prompt']!r}")
        rows.append({"source_row": number, **values})
    return rows


def load_raw_data(params: RawDataParams, seed: int, root: Path = Path(".")) -> pa.Table:
    """Merge all sources into one `RAW_DATA` table; raises `RawDataError` before anything is written."""
    columns = {name: [] for name in RAW_DATA.names}
    for source in params.sources:
        path = root / source.path
        if source.kind == "generator":
            rows = generate_problems(path, source.count, seed)
            label = f"generator:{source.path}"
        else:
            rows = read_static(source, root)
            label = source.path
        digest = file_hash(path)
        for row in rows:
            columns["source"].append(label)
            columns["source_hash"].append(digest)
            for key in ("source_row", "prompt", "answer"):
                columns[key].append(row[key])
    return pa.table(columns, schema=RAW_DATA)
