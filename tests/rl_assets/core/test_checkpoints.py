"""checkpoints.py: a saved folder's id is the hash of everything but its lineage card."""

from __future__ import annotations

import json

import pytest

from rl_assets.core.checkpoints import LINEAGE_FILE, checkpoint_id, read_lineage, save_checkpoint, weights_hash
from rl_assets.core.storage import dir_hash
from rl_assets.core.tokenizer import build_tiny_tokenizer

from rl_assets_support import shared_tiny_model


def test_save_checkpoint_writes_card_and_content_id(tmp_path):
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    path = tmp_path / "r00" / "checkpoint"
    saved_id = save_checkpoint(tiny_model, tokenizer, path, {"round": 0, "parent": "tiny"})
    card = json.loads((path / LINEAGE_FILE).read_text())
    assert card["checkpoint_id"] == saved_id == checkpoint_id(path) == weights_hash(path)
    weights_only = dir_hash(path, exclude=tuple(p.name for p in path.iterdir() if p.suffix != ".safetensors"))
    assert saved_id == weights_only
    (path / "tokenizer_config.json").write_text((path / "tokenizer_config.json").read_text().replace("{", '{"is_local": true, ', 1))
    assert weights_hash(path) == saved_id  # loader bookkeeping in tokenizer files does not change the id
    assert (card["round"], card["parent"]) == (0, "tiny") and card["code_version"]
    assert read_lineage(path) == card
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint"]


def test_same_weights_give_the_same_id_and_overwrite_in_place(tmp_path):
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    first = save_checkpoint(tiny_model, tokenizer, tmp_path / "a", {"round": 0})
    second = save_checkpoint(tiny_model, tokenizer, tmp_path / "b", {"round": 7})
    assert first == second
    again = save_checkpoint(tiny_model, tokenizer, tmp_path / "a", {"round": 1})
    assert again == first and read_lineage(tmp_path / "a")["round"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_read_lineage_of_a_folder_without_card(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        read_lineage(tmp_path)
