"""Checkpoint folders: `save_pretrained` output plus a `lineage.json` card, written atomically.

The checkpoint id is the content hash of the weight files, so two folders with the same weights
have the same id (tokenizer files pick up loader bookkeeping when re-saved), and rollouts name the
exact policy that sampled them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rl_assets.core.storage import atomic_path, dir_hash

LINEAGE_FILE = "lineage.json"


def code_version() -> str:
    """The git commit of the code that produced an output ('+dirty' with local changes)."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty=+dirty", "--abbrev=12"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        from rl_assets import __version__

        return f"rl-assets {__version__}"


def save_checkpoint(model, tokenizer, path: str | Path, lineage: dict, lora=None) -> str:
    """Write model, tokenizer and lineage card atomically; returns the checkpoint id.

    A PEFT model is saved as its adapters, or merged into full weights when `lora.merge` is set.
    Adapters name their base in adapter_config.json by absolute path, and the card's `lora_base`
    records that path and the base's checkpoint id, which loading them checks (models.adapter_base).
    """
    if lora is not None and lora.enabled and lora.merge:
        model = model.merge_and_unload()
    _keep_only_token_ids_if_invalid(model)
    with atomic_path(path, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        if hasattr(model, "peft_config"):  # adapters (lora.merge off): name their base by absolute path and checkpoint id
            named = (model.peft_config.get("default") or next(iter(model.peft_config.values()))).base_model_name_or_path
            base = Path(named or "")
            if named and base.is_dir():
                named = str(base.resolve())
            base_id = read_lineage(base)["checkpoint_id"] if named and (base / LINEAGE_FILE).is_file() else None
            lineage = {**lineage, "lora_base": {"path": named, "checkpoint_id": base_id}}
            adapter_config = tmp / "adapter_config.json"
            config = {**json.loads(adapter_config.read_text()), "base_model_name_or_path": named}
            adapter_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        tokenizer.save_pretrained(tmp)
        checkpoint_id = weights_hash(tmp)
        card = {"checkpoint_id": checkpoint_id, "code_version": code_version(), **lineage}
        (tmp / LINEAGE_FILE).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return checkpoint_id


def _keep_only_token_ids_if_invalid(model) -> None:
    """A generation_config that transformers refuses to save (sampling flags with do_sample false, as some hub
    checkpoints ship) is cut down to its token ids: sampling never reads it (rollouts.sampling_config)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return
    try:
        config.validate(strict=True)
    except ValueError:
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                                   pad_token_id=config.pad_token_id)


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


# Retention (`rl-assets retire`) removes a checkpoint's files and leaves its lineage card with this note beside it: the
# checkpoint id, the DVC hash its files had and the remote that still holds them, if any.
RETIRED_FILE = "RETIRED.json"


def read_retired(path: str | Path) -> dict | None:
    """The retirement note of a checkpoint folder, or None when the checkpoint is on disk (not retired)."""
    note = Path(path) / RETIRED_FILE
    return json.loads(note.read_text()) if note.is_file() else None


def retired_words(note: dict) -> str:
    """How lineage and status name a retired checkpoint.

    >>> retired_words({"checkpoint_id": "ab" * 32, "dvc_hash": "cd" * 16 + ".dir", "remote": None, "retired_at": "2026-12-04"})
    'retired on 2026-12-04 (its files were removed; DVC hash cdcdcdcdcdcd.dir, on no remote)'
    """
    where = f"kept on {note['remote']}" if note.get("remote") else "on no remote"
    return f"retired on {note['retired_at']} (its files were removed; DVC hash {note['dvc_hash'][:12]}.dir, {where})"
