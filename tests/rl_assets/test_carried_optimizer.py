"""train_state.py: AdamW's moments carried across rounds live in one run-state file, never in a checkpoint."""

from __future__ import annotations

import torch

from rl_assets.train_state import carried_optimizer_path, load_carried_optimizer, save_carried_optimizer


def test_only_the_latest_rounds_moments_are_kept_and_only_for_their_checkpoint(tmp_path):
    first = {"state": {"w": {"step": torch.tensor(1.0)}}, "param_groups": []}
    second = {"state": {"w": {"step": torch.tensor(2.0)}}, "param_groups": []}
    save_carried_optimizer(first, "r01-id", 1, tmp_path)
    assert load_carried_optimizer("r01-id", tmp_path)["state"]["w"]["step"] == 1
    save_carried_optimizer(second, "r02-id", 2, tmp_path)
    assert [p.name for p in carried_optimizer_path(tmp_path).parent.iterdir()] == ["optimizer.pt"]  # replaced, not accumulated
    assert load_carried_optimizer("r01-id", tmp_path) is None  # a rerun of round 2 starts fresh rather than take round 2's own moments
    assert load_carried_optimizer("r02-id", tmp_path)["state"]["w"]["step"] == 2
    assert carried_optimizer_path(tmp_path).relative_to(tmp_path).parts[:2] == ("data", "run_state")  # outside every asset folder
