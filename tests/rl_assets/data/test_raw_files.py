"""Static sources through `read_source`: JSONL, CSV, Parquet and datasets folders, column mappings,
extra columns, and the exact error (or, with skip, the dropped message) for every kind of bad row."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_assets.core.config import SourceParams
from rl_assets.data.raw_data import RawDataError, read_source

MAPPING = {"prompt": "question", "answer": "solution"}
GOOD = {"question": "1+1=", "solution": "2"}


def source(kind: str, path: str, **columns) -> SourceParams:
    return SourceParams(kind=kind, path=path, columns={**MAPPING, **columns})


def jsonl(tmp_path, lines: list, name="extra.jsonl", **columns) -> SourceParams:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    (tmp_path / name).write_text(text)
    return source("jsonl", name, **columns)


def rows_of(src, root):
    """The rows of a text source (no image column: every row's image_ids is [], left out here)."""
    rows, dropped = read_source(src, root, seed=0)
    assert dropped == []
    assert all(row.pop("image_ids") == [] for row in rows)
    return rows


# --- JSONL ----------------------------------------------------------------------------------------


def test_jsonl_with_column_mapping_and_extra_columns(tmp_path):
    src = jsonl(tmp_path, [{"question": " 6+3= ", "solution": 9, "id": 1, "tags": ["a"]}, "", {"question": "1-2=", "solution": "-1", "id": 2, "tags": []}],
                extra=["tags", "id"])
    assert rows_of(src, tmp_path) == [
        {"source_row": 1, "prompt": "6+3=", "answer": "9", "extra": '{"id": 1, "tags": ["a"]}'},  # stripped; a number becomes text
        {"source_row": 3, "prompt": "1-2=", "answer": "-1", "extra": '{"id": 2, "tags": []}'},  # blank lines are skipped but counted
    ]


def test_default_mapping_is_prompt_and_answer_without_extra(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "2+2=", "answer": "4", "other": 1}) + "\n")
    assert rows_of(SourceParams(kind="jsonl", path="d.jsonl"), tmp_path) == [{"source_row": 1, "prompt": "2+2=", "answer": "4", "extra": "{}"}]


@pytest.mark.parametrize("second_line,expected", [
    ("{not json", "extra.jsonl:2: invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("[1, 2]", "extra.jsonl:2: expected a JSON object, got list"),
    ('"text"', "extra.jsonl:2: expected a JSON object, got str"),
    ({"prompt": "1+1=", "solution": "2"}, "extra.jsonl:2: missing column 'question' (mapped to prompt)"),
    ({"question": "1+1="}, "extra.jsonl:2: missing column 'solution' (mapped to answer)"),
    ({"question": "   ", "solution": "2"}, "extra.jsonl:2: empty prompt in column 'question'"),
    ({"question": None, "solution": "2"}, "extra.jsonl:2: column 'question' must be text or a number, got NoneType"),
    ({"question": "1+1=", "solution": True}, "extra.jsonl:2: column 'solution' must be text or a number, got bool"),
    ({"question": "1+1=", "solution": [2]}, "extra.jsonl:2: column 'solution' must be text or a number, got list"),
], ids=["invalid json", "array line", "string line", "missing prompt column", "missing answer column", "empty prompt",
        "null value", "bool value", "list value"])
def test_jsonl_errors_name_file_and_line_and_skip_drops_exactly_that_row(tmp_path, second_line, expected):
    src = jsonl(tmp_path, [GOOD, second_line, GOOD])
    with pytest.raises(RawDataError) as caught:
        read_source(src, tmp_path, seed=0)
    assert str(caught.value) == expected
    rows, dropped = read_source(src, tmp_path, seed=0, on_bad_rows="skip")
    assert [r["source_row"] for r in rows] == [1, 3] and dropped == [expected]


def test_missing_extra_column_is_a_bad_row(tmp_path):
    src = jsonl(tmp_path, [{**GOOD, "level": 1}, GOOD], extra=["level"])
    with pytest.raises(RawDataError, match=r"^extra\.jsonl:2: missing column 'level' \(mapped to extra\)$"):
        read_source(src, tmp_path, seed=0)


def test_jsonl_that_is_not_utf8_names_the_line(tmp_path):
    lines = [json.dumps({"question": f"{i}+1=", "solution": str(i + 1)}) for i in range(900)]
    (tmp_path / "extra.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'{"question": "\xff", "solution": "1"}\n')
    with pytest.raises(RawDataError, match=r"^extra\.jsonl:901: not UTF-8 text \(invalid start byte at column 15\)$"):
        read_source(source("jsonl", "extra.jsonl"), tmp_path, seed=0)
    rows, dropped = read_source(source("jsonl", "extra.jsonl"), tmp_path, seed=0, on_bad_rows="skip")
    assert len(rows) == 900 and len(dropped) == 1


def test_a_source_without_rows_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(RawDataError, match=r"^empty\.jsonl: no rows$"):
        read_source(source("jsonl", "empty.jsonl"), tmp_path, seed=0)
    src = jsonl(tmp_path, ["{bad", "[]"])
    with pytest.raises(RawDataError, match=r"^extra\.jsonl: no rows left after skipping 2 bad rows$"):
        read_source(src, tmp_path, seed=0, on_bad_rows="skip")


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_missing_file(tmp_path, kind):
    with pytest.raises(RawDataError, match=rf"^nope\.{kind}: file not found$"):
        read_source(SourceParams(kind=kind, path=f"nope.{kind}"), tmp_path, seed=0)


# --- CSV ------------------------------------------------------------------------------------------


def test_csv_with_mapping_quotes_and_extra(tmp_path):
    (tmp_path / "d.csv").write_text('question,solution,level\n"3+4=",7,easy\n\n"a ""quoted""\nprompt",x,hard\n', encoding="utf-8")
    assert rows_of(source("csv", "d.csv", extra=["level"]), tmp_path) == [
        {"source_row": 2, "prompt": "3+4=", "answer": "7", "extra": '{"level": "easy"}'},
        {"source_row": 4, "prompt": 'a "quoted"\nprompt', "answer": "x", "extra": '{"level": "hard"}'},  # the line a record starts on
    ]


@pytest.mark.parametrize("content,expected", [
    (b"", "d.csv: empty file (no header line)"),
    (b"question,answer\n1+1=,2\n", "d.csv: no column 'solution' (mapped to answer) in the header; it has: question, answer"),
    (b"question,solution\n1+1=,2\n2+2=\n", "d.csv:3: expected 2 fields as in the header, got 1"),
    (b"question,solution\n1+1=,2\n,4\n", "d.csv:3: empty prompt in column 'question'"),
    (b"question,solution\n1+1=,2\n\xe9=,1\n", "d.csv:3: not UTF-8 text (invalid continuation byte)"),
    (b'question,solution\n1+1=,2\n"2+2=,4\n', "d.csv:3: not valid CSV (unexpected end of data)"),
], ids=["empty", "header lacks a mapped column", "short row", "empty prompt", "latin-1 byte", "unclosed quote"])
def test_csv_errors(tmp_path, content, expected):
    (tmp_path / "d.csv").write_bytes(content)
    with pytest.raises(RawDataError) as caught:
        read_source(source("csv", "d.csv"), tmp_path, seed=0)
    assert str(caught.value) == expected


# --- Parquet --------------------------------------------------------------------------------------


def test_parquet_source_with_mapping_and_extra(tmp_path):
    pq.write_table(pa.table({"q": ["2*3=", "7-9="], "a": [6, -2], "w": [0.5, None], "other": [[1], [2]]}), tmp_path / "p.parquet")
    src = SourceParams(kind="parquet", path="p.parquet", columns={"prompt": "q", "answer": "a", "extra": ["w"]})
    assert rows_of(src, tmp_path) == [
        {"source_row": 0, "prompt": "2*3=", "answer": "6", "extra": '{"w": 0.5}'},
        {"source_row": 1, "prompt": "7-9=", "answer": "-2", "extra": '{"w": null}'},
    ]


@pytest.mark.parametrize("table,columns,expected", [
    ({"q": ["2*3=", ""], "a": ["6", "0"]}, {"prompt": "q", "answer": "a"}, "p.parquet: row 1: empty prompt in column 'q'"),
    ({"q": ["2*3=", None], "a": ["6", "0"]}, {"prompt": "q", "answer": "a"}, "p.parquet: row 1: column 'q' must be text or a number, got NoneType"),
    ({"q": ["2*3="], "a": [[6]]}, {"prompt": "q", "answer": "a"}, "p.parquet: column 'a' has type list<element: int64>; prompt and answer columns must be text or numbers"),
    ({"q": ["2*3="], "a": ["6"]}, {"prompt": "question", "answer": "a"}, "p.parquet: no column 'question' (mapped to prompt) in the file; it has: q, a"),
    ({"q": ["2*3="], "a": ["6"], "b": [b"\x00"]}, {"prompt": "q", "answer": "a", "extra": ["b"]}, "p.parquet: row 0: column 'b' holds bytes, which is not JSON"),
], ids=["empty prompt", "null prompt", "list column", "unknown column", "bytes extra"])
def test_parquet_errors(tmp_path, table, columns, expected):
    pq.write_table(pa.table(table), tmp_path / "p.parquet")
    with pytest.raises(RawDataError) as caught:
        read_source(SourceParams(kind="parquet", path="p.parquet", columns=columns), tmp_path, seed=0)
    assert str(caught.value) == expected


def test_a_file_that_is_not_parquet_is_refused(tmp_path):
    (tmp_path / "p.parquet").write_text("hello")
    with pytest.raises(RawDataError, match=r"^p\.parquet: not a Parquet file"):
        read_source(SourceParams(kind="parquet", path="p.parquet"), tmp_path, seed=0)


# --- datasets folders (save_to_disk) ---------------------------------------------------------------


def test_hf_dataset_folder_and_dataset_dict_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = {"question": ["5+5=", "9-1="], "solution": ["10", "8"], "level": [1, 2]}
    datasets.Dataset.from_dict(data).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(data), "test": datasets.Dataset.from_dict({k: v[:1] for k, v in data.items()})}).save_to_disk(str(tmp_path / "dd"))
    expected = [{"source_row": 0, "prompt": "5+5=", "answer": "10", "extra": '{"level": 1}'},
                {"source_row": 1, "prompt": "9-1=", "answer": "8", "extra": '{"level": 2}'}]
    assert rows_of(source("hf_dataset", "ds", extra=["level"]), tmp_path) == expected
    assert rows_of(SourceParams(kind="hf_dataset", path="dd", split="test", columns={**MAPPING, "extra": ["level"]}), tmp_path) == expected[:1]
    with pytest.raises(RawDataError, match=r"^dd: holds splits \['test', 'train'\]; choose one with split$"):
        read_source(source("hf_dataset", "dd"), tmp_path, seed=0)
    with pytest.raises(RawDataError, match=r"^dd: no split 'dev'; the folder holds \['test', 'train'\]$"):
        read_source(SourceParams(kind="hf_dataset", path="dd", split="dev", columns=MAPPING), tmp_path, seed=0)
    with pytest.raises(RawDataError, match=r"^ds: holds a single Dataset, not a DatasetDict; remove split: train$"):
        read_source(SourceParams(kind="hf_dataset", path="ds", split="train", columns=MAPPING), tmp_path, seed=0)
    with pytest.raises(RawDataError, match=r"^ds: no column 'answer' \(mapped to answer\) in the dataset; it has: question, solution, level$"):
        read_source(SourceParams(kind="hf_dataset", path="ds", columns={"prompt": "question"}), tmp_path, seed=0)


def test_hf_dataset_folder_errors(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(RawDataError, match=r"^plain: not a datasets folder written by save_to_disk"):
        read_source(source("hf_dataset", "plain"), tmp_path, seed=0)
    with pytest.raises(RawDataError, match=r"^absent: folder not found$"):
        read_source(source("hf_dataset", "absent"), tmp_path, seed=0)
