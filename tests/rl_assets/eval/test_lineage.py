"""`rl-assets lineage` (rl_assets/eval/lineage.py through rl_assets/cli.py) on a fake project: which checkpoint it walks.

The walk itself, through a real run's files, is tested in tests/pipelines/test_micro_pipeline.py.
"""

from __future__ import annotations

import argparse
import json

import pytest

from ops_support import make_fake_project
from rl_assets.cli import run_command


def lineage(checkpoint: str) -> int:
    return run_command(argparse.Namespace(command="lineage", checkpoint=checkpoint, json=True), latest_run_id=lambda: None,
                       status_command=None)


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = make_fake_project(tmp_path, rounds=2)
    monkeypatch.chdir(root)
    monkeypatch.delenv("RL_ASSETS_PARAMS", raising=False)
    return root


def test_lineage_takes_the_shorthand_generate_and_serve_take(project, capsys):
    """`r02` (and `r02/checkpoint`, an id prefix) name the checkpoint as `generate --checkpoint r02` and serve's "model" do."""
    assert lineage("data/r02/checkpoint") == 0
    by_folder = json.loads(capsys.readouterr().out)
    assert by_folder[0]["path"] == "data/r02/checkpoint" and [s["round"] for s in by_folder[:3]] == [2, 1, 0]
    for name in ("r02", "r02/checkpoint", by_folder[0]["checkpoint_id"][:10]):
        assert lineage(name) == 0, name
        assert json.loads(capsys.readouterr().out) == by_folder, name


def test_lineage_of_a_round_that_is_not_there_names_its_folder(project, capsys):
    assert lineage("r05") == 2
    assert capsys.readouterr().err == "rl-assets lineage: data/r05/checkpoint: no checkpoint there\n"
