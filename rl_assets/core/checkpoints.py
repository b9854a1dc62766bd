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


# What the pipeline itself rewrites as it runs: a changed record is not changed code (runs differ across machines).
PIPELINE_RECORDS = ":(top,exclude,glob)**/dvc.lock"


def code_version() -> str:
    """The git commit of the code that produced an output ('+dirty' with local changes to tracked files other than dvc.lock)."""
    try:
        commit = subprocess.run(["git", "describe", "--always", "--abbrev=12"], capture_output=True, text=True, check=True,
                                timeout=10).stdout.strip()
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ":/", PIPELINE_RECORDS], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        from rl_assets import __version__

        return f"rl-assets {__version__}"
    return commit + ("+dirty" if changed.returncode != 0 else "")


def save_checkpoint(model, tokenizer, path: str | Path, lineage: dict, lora=None, dtype=None, processor=None) -> str:
    """Write model, tokenizer and lineage card atomically; returns the checkpoint id.

    `processor`: a vision-language policy's own (a hub VLM's), saved with its tokenizer so the next stage loads the same one.

    A PEFT model is saved as its adapters, or merged into full weights when `lora.merge` is set.
    Adapters name their base in adapter_config.json by absolute path, and the card's `lora_base`
    records that path and the base's checkpoint id, which loading them checks (models.adapter_base).
    `dtype` (a torch dtype): full weights are saved rounded to it (train.checkpoint_dtype); the model is not changed.
    """
    if lora is not None and lora.enabled and lora.merge and hasattr(model, "peft_config"):
        model = model.merge_and_unload()
    _keep_only_token_ids_if_invalid(model)
    with atomic_path(path, is_dir=True) as tmp:
        model.save_pretrained(tmp, state_dict=_rounded_state_dict(model, dtype))
        if dtype is not None and not hasattr(model, "peft_config"):
            _set_config_dtype(tmp / "config.json", str(dtype).removeprefix("torch."))
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
        (processor if processor is not None else tokenizer).save_pretrained(tmp)
        checkpoint_id = weights_hash(tmp)
        card = {"checkpoint_id": checkpoint_id, "code_version": code_version(), **lineage}
        (tmp / LINEAGE_FILE).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return checkpoint_id


def _rounded_state_dict(model, dtype) -> dict | None:
    """The model's weights rounded to `dtype` (None: save them as they are); tied weights stay one tensor, saved once."""
    if dtype is None or hasattr(model, "peft_config"):
        return None
    rounded: dict = {}  # by storage: a tied embedding and LM head give one rounded tensor, which save_pretrained dedups
    return {name: rounded.setdefault(t.data_ptr(), t.to(dtype)) if t.is_floating_point() else t for name, t in model.state_dict().items()}


def _set_config_dtype(config_file: Path, dtype: str) -> None:
    config = json.loads(config_file.read_text())
    config["dtype"] = dtype
    config.pop("torch_dtype", None)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# train.checkpoint_dtype: bfloat16 saves a round's folder (what DVC, the remote, evaluation, serving and promotion see) in bf16,
# half the bytes. The chain of rounds does not continue from it: an AdamW update of lr 1e-6 is far below bf16's resolution
# (8 significant bits) and would round away. The next round samples and trains from the float32 weights, run state in
# <data>/run_state/weights/<checkpoint id>.safetensors like the carried moments, kept for the newest round and its parent
# (a run killed between saving round N and reporting it trains round N again, from N-1's).
class MissingRunState(RuntimeError):
    """A step needs run state (carried moments, a compact checkpoint's float32 weights) that a parent checkpoint saved and that is gone."""


def master_weights_path(checkpoint_id: str, data: Path) -> Path:
    """Where the float32 weights of compact checkpoint `checkpoint_id` of the data folder `data` (paths.data_dir) live."""
    return data / "run_state" / "weights" / f"{checkpoint_id}.safetensors"


def save_master_weights(model, checkpoint_id: str, data: Path, keep: frozenset[str] = frozenset()) -> Path:
    """Save `model`'s full-precision weights as those of checkpoint `checkpoint_id`; remove other checkpoints' except `keep`."""
    from safetensors.torch import save_model

    path = master_weights_path(checkpoint_id, data)
    with atomic_path(path) as tmp:
        save_model(model, str(tmp), metadata={"checkpoint_id": checkpoint_id})
    for other in path.parent.glob("*.safetensors"):
        if other.stem not in keep | {checkpoint_id}:
            other.unlink(missing_ok=True)
    return path


def load_master_weights(model, path: str | Path) -> None:
    """Put the float32 weights that checkpoint folder `path` was rounded from into `model` (loaded from that folder); nothing
    when the folder holds full weights, or has no lineage card. Raises MissingRunState when they are gone: continuing from the rounded ones makes another model."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    from rl_assets.core.paths import data_dir_of

    if not (Path(path) / LINEAGE_FILE).is_file():  # a model folder of its own (a hub model's, an import): its weights are whole
        return
    card = read_lineage(path)
    if not card.get("master_weights"):
        return
    data = data_dir_of(Path(path))
    master = master_weights_path(card["checkpoint_id"], data) if data is not None else None
    if master is None or not master.is_file():
        raise MissingRunState(
            f"{path} was saved in {card.get('checkpoint_dtype')} (train.checkpoint_dtype) and the float32 weights the next round continues "
            f"from are gone ({master or 'no run state beside a folder outside a data folder'}): `rl-assets run` trains round "
            f"{card.get('round')} again to make them.")
    with safe_open(str(master), "pt") as saved:
        held = (saved.metadata() or {}).get("checkpoint_id")
    if held != card["checkpoint_id"]:
        raise MissingRunState(f"{master} holds the weights of checkpoint {held}, not {card['checkpoint_id']}: delete it")
    load_model(model, str(master), strict=True)


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
