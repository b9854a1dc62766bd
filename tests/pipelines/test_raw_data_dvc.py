"""Raw inputs under DVC: every configured source (files, a datasets folder, a generator module) is a
dep of the raw_data stage, and the hash in each row is the one DVC recorded for that file."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import dvc, python
from rl_assets.core.schemas import read_table

pytestmark = pytest.mark.e2e

GENERATOR_MODULE = "def rows(count, seed):\n    return [{'prompt': f'{seed + i}+1=', 'answer': str(seed + i + 1), 'level': i} for i in range(count)]\n"


@pytest.fixture()
def project(micro_copy):
    datasets = pytest.importorskip("datasets")
    raw = micro_copy / "data" / "raw"
    (raw / "extra.csv").write_text("question,solution,level\n7+7=,14,hard\n")
    datasets.Dataset.from_dict({"q": ["8+8=", "9+9="], "a": ["16", "18"]}).save_to_disk(str(raw / "ds"))
    (micro_copy / "micro_gen.py").write_text(GENERATOR_MODULE)
    params = yaml.safe_load((micro_copy / "params.yaml").read_text())
    params["raw_data"]["sources"] += [
        {"kind": "csv", "path": "data/raw/extra.csv", "columns": {"prompt": "question", "answer": "solution", "extra": ["level"]}},
        {"kind": "hf_dataset", "path": "data/raw/ds", "columns": {"prompt": "q", "answer": "a"}},
        {"kind": "python", "function": "micro_gen:rows", "count": 3, "columns": {"extra": ["level"]}},
    ]
    (micro_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], micro_copy, timeout=180)
    return micro_copy


def test_every_source_is_a_dep_and_rows_carry_the_hash_dvc_recorded(project):
    deps = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]["raw_data"]["deps"]
    inputs = ["data/raw/arithmetic_extra.jsonl", "data/raw/ds", "data/raw/extra.csv", "data/raw/math_problems.json", "micro_gen.py"]
    assert set(inputs) <= set(deps)

    dvc(["repro", "raw_data"], project, timeout=600)
    recorded = {d["path"]: d["md5"] for d in yaml.safe_load((project / "dvc.lock").read_text())["stages"]["raw_data"]["deps"]}
    table = read_table(project / "data" / "raw_data.parquet", "raw_data")
    hashes = dict(zip(table["source"].to_pylist(), table["source_hash"].to_pylist()))
    assert hashes["data/raw/extra.csv"] == recorded["data/raw/extra.csv"]
    assert hashes["python:micro_gen:rows"] == recorded["micro_gen.py"]
    assert hashes["generator:data/raw/math_problems.json"] == recorded["data/raw/math_problems.json"]
    assert recorded["data/raw/ds"].endswith(".dir")  # DVC hashes folders its own way; the row carries our folder hash
    rows = [r for r in table.to_pylist() if r["source"] in ("data/raw/extra.csv", "python:micro_gen:rows")]
    assert [json.loads(r["extra"]) for r in rows] == [{"level": "hard"}, {"level": 0}, {"level": 1}, {"level": 2}]

    (project / "micro_gen.py").write_text(GENERATOR_MODULE.replace("+1=", "+2="))
    changed = json.loads(dvc(["status", "--json", "raw_data"], project, timeout=180).stdout or "{}")
    assert changed == {"raw_data": [{"changed deps": {"micro_gen.py": "modified"}}]}


@pytest.fixture()
def image_project(micro_copy):
    """The micro project with a JSONL source whose rows name images beside it."""
    from PIL import Image

    raw = micro_copy / "data" / "raw"
    (raw / "img").mkdir()
    for color in ("red", "blue"):
        Image.new("RGB", (6, 4), color).save(raw / "img" / f"{color}.png")
    (raw / "colors.jsonl").write_text("".join(json.dumps({"prompt": "Name the color.", "answer": c, "image": f"img/{c}.png"}) + "\n"
                                              for c in ("red", "blue")))
    params = yaml.safe_load((micro_copy / "params.yaml").read_text())
    params["raw_data"]["sources"] += [{"kind": "jsonl", "path": "data/raw/colors.jsonl", "columns": {"image": "image"}}]
    (micro_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], micro_copy, timeout=180)
    return micro_copy


def test_images_are_a_dvc_output_of_raw_data_and_a_damaged_one_is_not_up_to_date(image_project):
    import hashlib

    stage = yaml.safe_load((image_project / "dvc.yaml").read_text())["stages"]["raw_data"]
    assert stage["outs"] == ["data/raw_data.parquet", "data/images"]
    dvc(["repro", "raw_data"], image_project, timeout=600)
    table = read_table(image_project / "data" / "raw_data.parquet", "raw_data")
    ids = [ids[0] for ids in table["image_ids"].to_pylist() if ids]
    assert len(ids) == 2
    for identifier in ids:  # each id is the SHA-256 of the stored file's bytes
        assert hashlib.sha256((image_project / "data" / "images" / f"{identifier}.png").read_bytes()).hexdigest() == identifier
    outs = {o["path"]: o for o in yaml.safe_load((image_project / "dvc.lock").read_text())["stages"]["raw_data"]["outs"]}
    assert outs["data/images"]["md5"].endswith(".dir") and outs["data/images"]["nfiles"] == 2
    (image_project / "data" / "images" / f"{ids[0]}.png").write_bytes(b"damaged")
    changed = json.loads(dvc(["status", "--json", "raw_data"], image_project, timeout=180).stdout or "{}")
    assert changed == {"raw_data": [{"changed outs": {"data/images": "modified"}}]}
