"""tracking.py: event files TensorBoard reads back, with one point per round for each metric."""

from __future__ import annotations

import json

from ops_support import make_fake_project
from rl_assets.eval.curves import export_tensorboard, round_rows, write_round_plots, write_scalars


def read_events(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    return {tag: [(e.step, round(e.value, 4)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_write_scalars_uses_the_step_column_and_skips_non_numbers(tmp_path):
    assert write_scalars(tmp_path, [{"step": 3, "loss": 0.5, "name": "x", "done": True}, {"step": 4, "loss": 0.25}], prefix="train/") == 2
    assert read_events(tmp_path) == {"train/loss": [(3, 0.5), (4, 0.25)]}


def test_export_gives_step_curves_per_round_and_a_curve_per_metric_over_rounds(tmp_path):
    make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.5})
    card_path = tmp_path / "data/r01/checkpoint/lineage.json"
    card = json.loads(card_path.read_text())
    card_path.write_text(json.dumps({**card, "history": [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]}))
    assert [row["step"] for row in round_rows(tmp_path / "data")] == [0, 1, 2]
    export_tensorboard(tmp_path / "data")
    logdir = export_tensorboard(tmp_path / "data")  # rewritten, not appended to
    assert sorted(p.name for p in logdir.iterdir()) == ["r01", "rounds"]
    assert read_events(logdir / "r01") == {"train/loss": [(1, 0.5), (2, 0.25)]}
    scalars = read_events(logdir / "rounds")
    assert scalars["eval/sampled_accuracy"] == [(0, 0.3), (1, 0.4), (2, 0.5)]
    assert scalars["train/kl"] == [(1, 0.01), (2, 0.01)] and [s for s, _ in scalars["train/entropy"]] == [1, 2]


def test_round_plots_are_one_csv_per_metric_for_dvc(tmp_path):
    make_fake_project(tmp_path, sampled={0: 0.3, 1: 0.4, 2: 0.5})
    folder = write_round_plots(tmp_path / "data")
    files = {p.name for p in folder.iterdir()}
    assert {"eval_sampled_accuracy.csv", "train_kl.csv", "train_entropy.csv", "train_loss.csv", "train_reward_mean.csv"} <= files
    assert (folder / "eval_sampled_accuracy.csv").read_text() == "round,value\n0,0.3\n1,0.4\n2,0.5\n"
    assert (folder / "train_kl.csv").read_text() == "round,value\n1,0.01\n2,0.01\n"
