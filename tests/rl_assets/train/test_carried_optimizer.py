"""train_state.py: AdamW's moments carried across rounds live in run-state files keyed by checkpoint id, never in a checkpoint."""

from __future__ import annotations

import pytest
import torch

from rl_assets.core.checkpoints import LINEAGE_FILE, master_weights_path
from rl_assets.train.train_state import MissingRunState, carried_optimizer_path, load_carried_optimizer, lost_run_state, save_carried_optimizer


def moments(step: float) -> dict:
    return {"state": {"w": {"step": torch.tensor(step)}}, "param_groups": []}


def test_each_checkpoint_keeps_its_own_moments_until_it_is_gone(tmp_path):
    save_carried_optimizer(moments(1.0), "r01-id", 1, tmp_path)
    save_carried_optimizer(moments(2.0), "r02-id", 2, tmp_path, keep=frozenset({"r01-id"}))
    # a rerun of round 2 (killed after round 2 saved its moments, before it was reported) continues round 1's, not round 2's own
    assert load_carried_optimizer("r01-id", tmp_path)["state"]["w"]["step"] == 1
    assert load_carried_optimizer("r02-id", tmp_path)["state"]["w"]["step"] == 2
    save_carried_optimizer(moments(3.0), "r02-new", 2, tmp_path, keep=frozenset({"r01-id"}))  # r02 replaced by another model
    assert sorted(p.stem for p in carried_optimizer_path("x", tmp_path).parent.iterdir()) == ["r01-id", "r02-new"]
    assert load_carried_optimizer("r02-id", tmp_path) is None
    assert carried_optimizer_path("r01-id", tmp_path).relative_to(tmp_path).parts[:1] == ("run_state",)  # outside every asset folder


def test_a_file_holding_another_checkpoints_moments_is_refused(tmp_path):
    save_carried_optimizer(moments(1.0), "r01-id", 1, tmp_path)
    carried_optimizer_path("r01-id", tmp_path).rename(carried_optimizer_path("r02-id", tmp_path))
    with pytest.raises(MissingRunState, match="holds the moments of checkpoint r01-id, not r02-id"):
        load_carried_optimizer("r02-id", tmp_path)


def test_lost_run_state_is_what_a_card_promises_and_the_disk_lacks(tmp_path):
    card = tmp_path / "r01" / "checkpoint" / LINEAGE_FILE  # tmp_path: the experiment's data folder
    card.parent.mkdir(parents=True)
    card.write_text('{"checkpoint_id": "r01-id", "carries_optimizer_state": true}')
    assert "carried optimizer moments are gone" in lost_run_state(1, tmp_path)
    assert lost_run_state(1, tmp_path, moments=False) is None  # the next round's sampling does not need them
    save_carried_optimizer(moments(1.0), "r01-id", 1, tmp_path)
    assert lost_run_state(1, tmp_path) is None
    card.write_text('{"checkpoint_id": "r01-id", "carries_optimizer_state": false}')
    carried_optimizer_path("r01-id", tmp_path).unlink()
    assert lost_run_state(1, tmp_path) is None  # e.g. a DPO round, or carry off: the next round starts fresh, as it always did
    assert lost_run_state(2, tmp_path) is None  # no checkpoint
    card.write_text('{"checkpoint_id": "r01-id", "checkpoint_dtype": "bfloat16", "master_weights": "float32"}')
    assert "float32 weights are gone" in lost_run_state(1, tmp_path, moments=False)  # a compact checkpoint: sampling needs them too
    master_weights_path("r01-id", tmp_path).parent.mkdir(parents=True)
    master_weights_path("r01-id", tmp_path).write_bytes(b"weights")
    assert lost_run_state(1, tmp_path) is None