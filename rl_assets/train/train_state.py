"""Resumable training inside a round: save the full state every `save_steps`, resume only a matching one.

A state folder `<data>/rNN/train_state/step-000040/` (paths.train_state_dir) holds what `Accelerator.save_state` writes (model,
optimizer, scheduler, every process's RNG) plus `trainer_state.json` with the step and a fingerprint
of everything that decides the result: the train params, the input tables' hashes, the parent
checkpoint, the world size and the seed. A rerun after a crash continues from the newest state whose
fingerprint matches; one that does not match is refused with the differences, never mixed in.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rl_assets.core.checkpoints import MissingRunState

STATE_FILE = "trainer_state.json"
# Settings that change how often or whether we save, not what is computed.
NOT_FINGERPRINTED = ("save_steps", "keep_last", "resume")


class TrainStateMismatch(RuntimeError):
    """A saved training state that belongs to another run configuration."""


def fingerprint(train: dict, *, inputs: dict[str, str], parent: str, world_size: int, seed: int, sharding: str = "none") -> dict:
    """What must be equal for a saved state to be continued (a sharded state is saved in another form: compute.sharding).

    >>> fingerprint({"learning_rate": 1e-4, "save_steps": 5}, inputs={"rollouts": "ab"}, parent="p", world_size=1, seed=0)["train"]
    {'learning_rate': 0.0001}
    """
    return {"train": {k: v for k, v in train.items() if k not in NOT_FINGERPRINTED}, "inputs": inputs, "parent": parent,
            "world_size": world_size, "seed": seed, **({"compute.sharding": sharding} if sharding != "none" else {})}


def _differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: saved {a!r}, now {b!r}")
    return out


def saved_states(state_dir: Path) -> list[Path]:
    """Complete state folders, oldest first (a folder without its json was cut off mid-save)."""
    if not state_dir.is_dir():
        return []
    return sorted(p for p in state_dir.glob("step-*") if (p / STATE_FILE).is_file())


def latest_state(state_dir: Path, current: dict) -> tuple[Path, dict] | None:
    """The newest complete state and its json, or None; raises TrainStateMismatch when it is another run's."""
    states = saved_states(state_dir)
    if not states:
        return None
    info = json.loads((states[-1] / STATE_FILE).read_text())
    differences = _differences(info["fingerprint"], current)
    if differences:
        raise TrainStateMismatch(
            f"{states[-1]}: saved training state is from another configuration, refusing to continue it:\n  "
            + "\n  ".join(differences) + f"\nDelete {state_dir} or rerun with --set train.resume=false to start this round over.")
    return states[-1], info


def state_path(state_dir: Path, step: int) -> Path:
    return state_dir / f"step-{step:06d}"


def commit_state(tmp: Path, final: Path, info: dict, keep_last: int) -> None:
    """Make a fully written state visible (json last, then rename) and prune older ones to `keep_last`."""
    (tmp / STATE_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in saved_states(final.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


# train.carry_optimizer_state: AdamW's moments continue in the next round. They are run state, not
# part of any checkpoint (2x the weights in fp32: ~56 GB per round for a 7B model), so DVC, the data
# versions and promotion never see them. Each checkpoint's moments sit in a file named by its id, so
# what a round continues from is always the moments its parent was trained with: a run killed after
# round N saved its moments but before round N was reported retrains round N from round N-1's file,
# not from round N's. Files of checkpoints no longer on disk are removed when new moments are saved.
def carried_optimizer_dir(data: Path) -> Path:
    """<data>/run_state/optimizer: carried moments of the experiment whose data folder (paths.data_dir) is `data`."""
    return data / "run_state" / "optimizer"


def carried_optimizer_path(checkpoint_id: str, data: Path) -> Path:
    """Where the moments saved with checkpoint `checkpoint_id` live."""
    return carried_optimizer_dir(data) / f"{checkpoint_id}.pt"


def save_carried_optimizer(state: dict, checkpoint_id: str, round_number: int, data: Path,
                           keep: frozenset[str] = frozenset()) -> Path:
    """Save `state`, the moments after training checkpoint `checkpoint_id`; remove other checkpoints' moments except `keep`."""
    import torch

    from rl_assets.core.storage import atomic_path

    path = carried_optimizer_path(checkpoint_id, data)
    with atomic_path(path) as tmp:
        torch.save({"checkpoint_id": checkpoint_id, "round": round_number, "optimizer": state}, tmp)
    for other in carried_optimizer_dir(data).glob("*.pt"):
        if other.stem not in keep | {checkpoint_id}:
            other.unlink(missing_ok=True)
    (data / "run_state" / "optimizer.pt").unlink(missing_ok=True)  # the single file of earlier versions
    return path


def load_carried_optimizer(parent_id: str, data: Path, device: str = "cpu") -> dict | None:
    """The moments saved when checkpoint `parent_id` was trained, or None when there are none."""
    import torch

    path = carried_optimizer_path(parent_id, data)
    if not path.is_file():
        return None
    saved = torch.load(path, map_location=device)
    if saved.get("checkpoint_id") != parent_id:
        raise MissingRunState(f"{path} holds the moments of checkpoint {saved.get('checkpoint_id')}, not {parent_id}: delete it")
    return saved["optimizer"]


def lost_run_state(round_number: int, data: Path, moments: bool = True) -> str | None:
    """What run state checkpoint rNN saved for the next round and lost (None: nothing): its carried AdamW moments (with
    `moments`: the next round's training needs them, its sampling does not) or, for a compact checkpoint, its float32 weights."""
    from rl_assets.core.checkpoints import master_weights_path, read_lineage
    from rl_assets.core.paths import checkpoint_key, output_path

    path = output_path(checkpoint_key(round_number), data)
    if not (path / "lineage.json").is_file():
        return None
    card = read_lineage(path)
    if moments and card.get("carries_optimizer_state") and not carried_optimizer_path(card["checkpoint_id"], data).is_file():
        return f"its carried optimizer moments are gone from {data / 'run_state'} (train.carry_optimizer_state)"
    if card.get("master_weights") and not master_weights_path(card["checkpoint_id"], data).is_file():
        return f"its float32 weights are gone from {data / 'run_state'} (train.checkpoint_dtype: {card.get('checkpoint_dtype')})"
    return None
