"""raw_data.py: merging sources, lineage hashes, mixing weights, skipped bad rows, DVC inputs."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_assets.core.config import RawDataParams, SourceParams
from rl_assets.core.params_file import load_params
from rl_assets.data.raw_data import RawDataError, labelled_location, load_raw_data, mix, source_inputs
from rl_assets.core.schemas import RAW_DATA
from rl_assets.core.storage import content_hash, dir_hash

from rl_assets_support import REPO
from test_raw_generators import solve, write_templates

MAPPING = {"prompt": "question", "answer": "solution"}
md5 = lambda p: hashlib.md5(p.read_bytes()).hexdigest()  # noqa: E731


def write_jsonl(path, records) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def test_load_raw_data_tags_rows_with_source_and_md5(tmp_path):
    templates = write_templates(tmp_path, [{"prompt": "{a}+{b}=", "answer": "a+b", "ranges": {"a": [0, 9], "b": [0, 9]}}])
    write_jsonl(tmp_path / "extra.jsonl", [{"question": "1+1=", "solution": "2"}, {"question": "2+2=", "solution": "4"}])
    params = RawDataParams(sources=[
        SourceParams(kind="generator", path="templates.json", count=5),
        SourceParams(kind="jsonl", path="extra.jsonl", columns=MAPPING),
    ])
    table, dropped = load_raw_data(params, seed=0, root=tmp_path)
    assert table.schema.equals(RAW_DATA) and dropped == []
    assert table["source"].to_pylist() == ["generator:templates.json"] * 5 + ["extra.jsonl"] * 2
    assert table["source_hash"].to_pylist() == [md5(templates)] * 5 + [md5(tmp_path / "extra.jsonl")] * 2
    assert table["source_row"].to_pylist() == [0, 1, 2, 3, 4, 1, 2]
    assert table["prompt"].to_pylist()[5:] == ["1+1=", "2+2="]
    assert table["extra"].to_pylist() == ["{}"] * 7
    alone, _ = load_raw_data(RawDataParams(sources=params.sources[:1]), seed=0, root=tmp_path)
    assert table.slice(0, 5).to_pylist() == alone.to_pylist()


def test_every_kind_reaches_the_table_with_its_content_hash(tmp_path):
    datasets = pytest.importorskip("datasets")
    write_jsonl(tmp_path / "a.jsonl", [{"question": "1+1=", "solution": "2"}])
    (tmp_path / "b.csv").write_text("question,solution\n2+2=,4\n")
    pq.write_table(pa.table({"question": ["3+3="], "solution": ["6"]}), tmp_path / "c.parquet")
    datasets.Dataset.from_dict({"question": ["4+4="], "solution": ["8"]}).save_to_disk(str(tmp_path / "d"))
    (tmp_path / "lineage_gen.py").write_text("def rows(count, seed):\n    return [{'question': f'{seed}+5=', 'solution': str(seed + 5)}] * count\n")
    sources = [SourceParams(kind=k, path=p, columns=MAPPING) for k, p in (("jsonl", "a.jsonl"), ("csv", "b.csv"), ("parquet", "c.parquet"), ("hf_dataset", "d"))]
    sources.append(SourceParams(kind="python", function="lineage_gen:rows", count=2, columns=MAPPING))
    table, _ = load_raw_data(RawDataParams(sources=sources), seed=3, root=tmp_path)
    assert list(zip(table["source"].to_pylist(), table["source_hash"].to_pylist(), table["prompt"].to_pylist())) == [
        ("a.jsonl", md5(tmp_path / "a.jsonl"), "1+1="),
        ("b.csv", md5(tmp_path / "b.csv"), "2+2="),
        ("c.parquet", md5(tmp_path / "c.parquet"), "3+3="),
        ("d", dir_hash(tmp_path / "d"), "4+4="),
        ("python:lineage_gen:rows", md5(tmp_path / "lineage_gen.py"), "3+5="),
        ("python:lineage_gen:rows", md5(tmp_path / "lineage_gen.py"), "3+5="),
    ]
    assert source_inputs(RawDataParams(sources=sources), tmp_path) == ["a.jsonl", "b.csv", "c.parquet", "d", "lineage_gen.py"]
    # lineage and the sources_unchanged check find each source again from its label alone
    for label, digest in set(zip(table["source"].to_pylist(), table["source_hash"].to_pylist())):
        assert content_hash(labelled_location(label, tmp_path)) == digest, label


def test_source_inputs_leave_out_modules_outside_the_project(tmp_path):
    params = RawDataParams(sources=[SourceParams(kind="python", function="json:loads", count=1),  # the standard library's json
                                    SourceParams(kind="python", function="not_there_xyz:rows", count=1),
                                    SourceParams(kind="generator", path="data/t.json", count=1)])
    assert source_inputs(params, tmp_path) == ["data/t.json"]


def test_skip_collects_bad_rows_of_every_source_and_a_source_can_override(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"question": "1+1=", "solution": "2"}, "{oops", {"question": "", "solution": "0"}])
    (tmp_path / "b.csv").write_text("question,solution\n2+2=,4\n3+3=\n")
    skip_all = RawDataParams(on_bad_rows="skip", sources=[SourceParams(kind="jsonl", path="a.jsonl", columns=MAPPING),
                                                          SourceParams(kind="csv", path="b.csv", columns=MAPPING)])
    table, dropped = load_raw_data(skip_all, seed=0, root=tmp_path)
    assert table["prompt"].to_pylist() == ["1+1=", "2+2="]
    assert dropped == ["a.jsonl:2: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
                       "a.jsonl:3: empty prompt in column 'question'", "b.csv:3: expected 2 fields as in the header, got 1"]
    strict_csv = RawDataParams(on_bad_rows="skip", sources=[skip_all.sources[0], skip_all.sources[1].model_copy(update={"on_bad_rows": "error"})])
    with pytest.raises(RawDataError, match=r"^b\.csv:3: expected 2 fields as in the header, got 1$"):
        load_raw_data(strict_csv, seed=0, root=tmp_path)


def test_mix_shares_follow_the_weights_and_the_draw_is_seeded():
    assert [len(k) for k in mix([100, 100, 100], [1.0, 1.0, 2.0], 10, seed=0)] == [3, 2, 5]  # 2.5, 2.5, 5: remainders to the first
    assert [len(k) for k in mix([100, 1], [1.0, 1.0], 10, seed=0)] == [5, 1]  # a small source gives all it has
    first = mix([100, 100], [1.0, 3.0], 40, seed=0)
    assert first == mix([100, 100], [1.0, 3.0], 40, seed=0) != mix([100, 100], [1.0, 3.0], 40, seed=1)
    assert all(kept == sorted(set(kept)) for kept in first)  # without replacement, in source order


def test_max_rows_mixes_sources_by_weight(tmp_path):
    write_templates(tmp_path, [{"prompt": "{a}+{b}=", "answer": "a+b", "ranges": {"a": [0, 99], "b": [0, 99]}}])
    write_jsonl(tmp_path / "s.jsonl", [{"question": f"{i}*2=", "solution": str(2 * i)} for i in range(50)])
    sources = [SourceParams(kind="generator", path="templates.json", count=200, weight=3.0),
               SourceParams(kind="jsonl", path="s.jsonl", columns=MAPPING, weight=1.0)]
    table, _ = load_raw_data(RawDataParams(sources=sources, max_rows=40), seed=0, root=tmp_path)
    sources_column = table["source"].to_pylist()
    assert (sources_column.count("generator:templates.json"), sources_column.count("s.jsonl")) == (30, 10)
    full, _ = load_raw_data(RawDataParams(sources=sources[1:2]), seed=0, root=tmp_path)
    assert set(table.filter(pa.compute.equal(table["source"], "s.jsonl"))["prompt"].to_pylist()) < set(full["prompt"].to_pylist())


def test_load_raw_data_on_the_repo_params_is_unchanged():
    params = load_params(REPO / "params.yaml")
    table, dropped = load_raw_data(params.raw_data, params.seed, root=REPO)
    extra_lines = sum(1 for line in (REPO / "data/raw/arithmetic_extra.jsonl").read_text().splitlines() if line.strip())
    assert table.num_rows == params.raw_data.sources[0].count + extra_lines and dropped == []
    generated = table.filter(pa.compute.starts_with(table["source"], "generator:")).to_pylist()
    assert all(row["answer"] == str(solve(row["prompt"])) for row in generated)
    # the seeded draw of the documented default run (seed 0) must not move
    assert [(r["prompt"], r["answer"]) for r in generated[:3]] == [("multiply 6 by 0:", "0"), ("sum of 8 and 7?", "15"), ("4-7=", "-3")]
