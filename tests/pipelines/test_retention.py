"""Which round checkpoints retention keeps (pipelines/storage/retention.py), on folders and tables made by hand."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import micro_params
from pipelines.storage.retention import kept_checkpoints
from rl_assets.core.checkpoints import RETIRED_FILE
from rl_assets.core.params_file import parse_params


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """Rounds r00..r05 on disk, r02 promoted then r04 promoted and rolled back, r03 the best by sampled accuracy."""
    monkeypatch.chdir(tmp_path)
    for n in range(6):
        folder = tmp_path / "data" / f"r{n:02d}" / "checkpoint"
        folder.mkdir(parents=True)
        (folder / "lineage.json").write_text(json.dumps({"checkpoint_id": f"id{n}"}))
    models = tmp_path / "models"
    for n in (2, 4):
        (models / "versions" / f"id{n}").mkdir(parents=True)
        (models / "versions" / f"id{n}" / "model_card.json").write_text(json.dumps({"checkpoint_id": f"id{n}"}))
    events = [{"event": "promote", "checkpoint_id": "id2"}, {"event": "promote", "checkpoint_id": "id4"}, {"event": "rollback"}]
    (models / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rows = [{"checkpoint": f"r{n:02d}/checkpoint", "mode": "sampled", "accuracy": acc} for n, acc in enumerate([.1, .2, .3, .6, .4, .5])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / "evaluation.parquet")
    return tmp_path


def params(rounds: int = 5):
    raw = micro_params()
    raw["rounds"] = rounds
    return parse_params(raw)


def test_keeps_r00_the_last_n_the_promotion_history_and_the_best(project):
    kept, retire = kept_checkpoints(params(), keep=1)
    assert set(kept) == {"r00/checkpoint", "r05/checkpoint", "r02/checkpoint", "r03/checkpoint"}
    assert "promoted" in kept["r02/checkpoint"] and "best" in kept["r03/checkpoint"] and "last 1" in kept["r05/checkpoint"]
    assert retire == ["r01/checkpoint", "r04/checkpoint"]  # r04 was rolled back: no longer in the history's stack


def test_keep_n_counts_back_from_the_newest_round_on_disk(project):
    kept, retire = kept_checkpoints(params(), keep=3)
    assert {"r03/checkpoint", "r04/checkpoint", "r05/checkpoint"} <= set(kept) and retire == ["r01/checkpoint"]


def test_a_retired_checkpoint_is_not_retired_twice_and_a_value_model_goes_with_its_round(project):
    (project / "data/r01/checkpoint" / RETIRED_FILE).write_text("{}")
    critic = project / "data/r04/critic"
    critic.mkdir()
    (critic / "lineage.json").write_text(json.dumps({"checkpoint_id": "c4"}))
    _, retire = kept_checkpoints(params(), keep=1)
    assert retire == ["r04/checkpoint", "r04/critic"]
