"""Checkpoint folders: `save_pretrained` output plus a `lineage.json` card, written atomically.

The checkpoint id is the content hash of the weight files, so two folders with the same weights
have the same id (tokenizer files pick up loader bookkeeping when re-saved), and rollouts name the
exact policy that sampled them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rl_assets.storage import atomic_path, dir_hash

LINEAGE_FILE = "lineage.json"
OPTIMIZER_FILE = "optimizer.pt"  # train.carry_optimizer_state: AdamW's moments for the next round (not part of the id)


def code_version() -> str:
    """The git commit of the code that produced an output ('+dirty' with local changes)."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty=+dirty", "--abbrev=12"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        from rl_assets import __version__

        return f"rl-assets {__version__}"


def save_checkpoint(model, tokenizer, path: str | Path, lineage: dict, lora=None, extra: dict | None = None) -> str:
    """Write model, tokenizer and lineage card atomically; returns the checkpoint id.

    A PEFT model is saved as its adapters, or merged into full weights when `lora.merge` is set.
    `extra` maps file names to objects saved beside them with torch.save (e.g. the optimizer state).
    """
    if lora is not None and lora.enabled and lora.merge:
        model = model.merge_and_unload()
    model = model.cpu()
    with atomic_path(path, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, value in (extra or {}).items():
            import torch  # only here: guards, lineage and the CLI read checkpoints without torch

            torch.save(value, tmp / name)
        checkpoint_id = weights_hash(tmp)
        card = {"checkpoint_id": checkpoint_id, "code_version": code_version(), **lineage}
        (tmp / LINEAGE_FILE).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return checkpoint_id


def weights_hash(path: str | Path) -> str:
    """The checkpoint id: hash of the folder's `*.safetensors` files only."""
    others = tuple(p.name for p in Path(path).iterdir() if p.suffix != ".safetensors")
    return dir_hash(path, exclude=others)


def read_lineage(path: str | Path) -> dict:
    card = Path(path) / LINEAGE_FILE
    if not card.is_file():
        raise FileNotFoundError(f"{path}: not a checkpoint folder (no {LINEAGE_FILE})")
    return json.loads(card.read_text())


def checkpoint_id(path: str | Path) -> str:
    return read_lineage(path)["checkpoint_id"]
