"""status.py, generate.py and the CLI's query/generate/rollback over a fake project."""

from __future__ import annotations

import json

import pytest

from ops_support import GOOD_METRICS, make_fake_project
from pipelines import cli
from rl_assets.core.checkpoints import read_lineage, save_checkpoint
from rl_assets.core.params_file import load_params
from rl_assets.core.run_params import PromotionParams
from rl_assets.serve.generate import resolve_checkpoint, sample
from rl_assets.eval.lineage import connect_tables
from rl_assets.eval.promotion import run_promotion
from rl_assets.run.status import project_status

from rl_assets_support import new_tiny_model


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RL_ASSETS_PARAMS", raising=False)
    return make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.5, 2: 0.4})


def test_status_reports_round_metrics_evaluation_and_promoted_model(project):
    params = load_params(project / "params.yaml")
    status = project_status(project, params)
    assert status["current_round"] == 2 and status["promoted_model"] is None
    assert status["latest_checkpoint"]["metrics"] == GOOD_METRICS
    assert status["evaluation"]["accuracy"]["r01/checkpoint"] == {"greedy": 0.55, "sampled": 0.5}
    run_promotion(params, None, project, "cpu")
    promoted = project_status(project, params)["promoted_model"]
    assert promoted["source"] == "r01/checkpoint" and promoted["sampled_accuracy"] == 0.5 and promoted["history_events"] == 1
    json.dumps(status)  # plain JSON for probes


def test_each_experiment_reports_its_own_data_folder_and_names_outputs_another_left_there(project):
    from rl_assets.serve.health import assess

    other = make_fake_project(project, sampled={0: 0.1, 1: 0.2}, rounds=1, seed=1, experiment="word-problems")
    status = project_status(project, load_params(other / "params.yaml"))
    assert status["data"] == "data/experiments/word-problems" and status["current_round"] == 1
    assert status["evaluation"]["path"] == "data/experiments/word-problems/evaluation.parquet" and not status["other_experiment_outputs"]
    # a card another experiment wrote into this folder (versions before each experiment had its own): named, unhealthy
    card = project / "data/experiments/word-problems/r01/checkpoint/lineage.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "experiment": "default"}))
    status = project_status(project, load_params(other / "params.yaml"))
    assert status["other_experiment_outputs"] == {"r01/checkpoint": "default"}
    healthy, reasons = assess({**status, "experiment": "word-problems"}, [])
    assert not healthy and reasons == ["data/experiments/word-problems/ holds outputs of another experiment (r01/checkpoint: default), "
                                       "not of word-problems"]


def test_query_has_a_view_per_table(project):
    connection = connect_tables(project / "data", project / "models")
    assert connection.execute("select count(*) from rewards").fetchone() == (8,)
    assert connection.execute("select max(round) from checkpoints").fetchone() == (2,)
    assert connection.execute("select count(distinct checkpoint) from evaluation").fetchone() == (3,)
    assert "promotions" not in {r[0] for r in connection.execute("select table_name from information_schema.tables").fetchall()}


def test_resolve_checkpoint_by_round_id_prefix_and_promoted(project):
    promotion = PromotionParams()
    r01 = project / "data/r01/checkpoint"
    assert resolve_checkpoint("r01", promotion, project) == resolve_checkpoint("r01/checkpoint", promotion, project) == r01
    assert resolve_checkpoint(read_lineage(r01)["checkpoint_id"][:10], promotion, project) == r01
    with pytest.raises(FileNotFoundError, match="no promoted model yet"):
        resolve_checkpoint("promoted", promotion, project)
    with pytest.raises(FileNotFoundError, match="no checkpoint there"):
        resolve_checkpoint("r07", promotion, project)
    with pytest.raises(FileNotFoundError, match="no checkpoint folder or id"):
        resolve_checkpoint("zzz", promotion, project)
    run_promotion(load_params(project / "params.yaml"), None, project, "cpu")
    assert resolve_checkpoint("promoted", promotion, project) == project / "models/promoted"


def test_sample_from_a_saved_checkpoint(tmp_path):
    from rl_assets.core.tokenizer import build_tiny_tokenizer

    path = tmp_path / "checkpoint"
    save_checkpoint(new_tiny_model(), build_tiny_tokenizer(), path, {"round": 0})
    rows = sample(path, ["1+1=", "2+2="], samples=2, temperature=1.0, max_new_tokens=3, seed=0)
    assert [r["prompt"] for r in rows] == ["1+1=", "1+1=", "2+2=", "2+2="]
    assert all(isinstance(r["completion"], str) for r in rows)
    assert sample(path, ["1+1="], 1, 0.0, 3, 0) == sample(path, ["1+1="], 1, 0.0, 3, 5)  # greedy ignores the seed


def test_cli_rollback_restores_the_previous_model_and_refuses_when_there_is_none(project, capsys):
    params = load_params(project / "params.yaml")
    first = run_promotion(params, None, project, "cpu")[0]["checkpoint_id"]
    assert cli.main(["rollback"]) == 2
    assert "nothing to roll back to" in capsys.readouterr().err
    make_fake_project(project, sampled={0: 0.3, 1: 0.5, 2: 0.9}, seed=1)
    assert run_promotion(params, None, project, "cpu")[0]["promoted"]
    assert cli.main(["rollback"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_id"] == first
    assert read_lineage(project / "models/promoted")["checkpoint_id"] == first
    assert cli.main(["query", "select count(*) as n from promotions"]) == 0
    assert "3" in capsys.readouterr().out
