"""checkpoints.py: a saved folder's id is the hash of everything but its lineage card."""

from __future__ import annotations

import json

import pytest

from rl_assets.core.checkpoints import LINEAGE_FILE, checkpoint_id, read_lineage, save_checkpoint, weights_hash
from rl_assets.core.storage import dir_hash
from rl_assets.core.tokenizer import build_tiny_tokenizer

from rl_assets_support import new_tiny_model, shared_tiny_model


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


def test_a_compact_checkpoint_is_rounded_on_disk_and_the_chain_loads_its_float32_weights(tmp_path):
    """train.checkpoint_dtype: bfloat16. Evaluation and serving read the folder's rounded weights; the next round reads the float32
    ones from run state, exactly; without them it stops naming the file instead of continuing from the rounded ones."""
    import torch
    from safetensors import safe_open

    from rl_assets.core.checkpoints import MissingRunState, master_weights_path, save_master_weights
    from rl_assets.core.policy import load_policy

    model, tokenizer = new_tiny_model(seed=3), build_tiny_tokenizer()
    with torch.no_grad():  # values that bf16 cannot hold, so rounding shows
        for p in model.parameters():
            p.add_(torch.rand_like(p) * 1e-3)
    data, full = tmp_path / "data", {k: v.clone() for k, v in model.state_dict().items()}
    save_checkpoint(model, tokenizer, data / "r00" / "checkpoint", {"round": 0})
    path = data / "r01" / "checkpoint"
    saved_id = save_checkpoint(model, tokenizer, path, {"round": 1, "checkpoint_dtype": "bfloat16", "master_weights": "float32"},
                               dtype=torch.bfloat16)
    assert all(torch.equal(v, full[k]) for k, v in model.state_dict().items()), "saving must not round the model in memory"
    with safe_open(str(path / "model.safetensors"), "pt") as saved:
        assert {saved.get_tensor(k).dtype for k in saved.keys()} == {torch.bfloat16}
        names = set(saved.keys())
    with safe_open(str(data / "r00" / "checkpoint" / "model.safetensors"), "pt") as plain:
        assert names == set(plain.keys()), "tied weights are saved once, as in a full checkpoint"
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    assert (path / "model.safetensors").stat().st_size < 0.6 * (data / "r00" / "checkpoint" / "model.safetensors").stat().st_size

    plain = tmp_path / "a-model-folder"  # no lineage card (a hub model's, an import): loads whole, chain or not
    model.save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    assert all(torch.equal(v, full[k]) for k, v in load_policy(plain, chain=True)[0].state_dict().items())

    rounded = load_policy(path)[0].state_dict()  # evaluation's, serving's: float32 tensors holding the bf16 values
    assert all(v.dtype == torch.float32 and torch.equal(v, full[k].to(torch.bfloat16).float()) for k, v in rounded.items())
    assert not all(torch.equal(v, full[k]) for k, v in rounded.items())

    with pytest.raises(MissingRunState, match=f"r01/checkpoint was saved in bfloat16 .*{master_weights_path(saved_id, data)}.* trains round 1 again"):
        load_policy(path, chain=True)
    save_master_weights(model, saved_id, data, keep=frozenset({"parent-id"}))
    chained = load_policy(path, chain=True)[0].state_dict()
    assert all(torch.equal(v, full[k]) for k, v in chained.items())

    (data / "run_state" / "weights" / "parent-id.safetensors").write_bytes(b"x")
    (data / "run_state" / "weights" / "older-id.safetensors").write_bytes(b"x")
    save_master_weights(model, saved_id, data, keep=frozenset({"parent-id"}))
    assert sorted(p.stem for p in (data / "run_state" / "weights").iterdir()) == sorted([saved_id, "parent-id"])
    master_weights_path(saved_id, data).rename(master_weights_path("other-id", data))
    save_master_weights(model, "other-id", data)
    master_weights_path("other-id", data).rename(master_weights_path(saved_id, data))
    with pytest.raises(MissingRunState, match=f"holds the weights of checkpoint other-id, not {saved_id}"):
        load_policy(path, chain=True)


def test_code_version_is_dirty_for_changed_code_not_for_a_rewritten_dvc_lock(tmp_path, monkeypatch):
    """make run rewrites the tracked dvc.lock (runs differ across machines): that is a record, not a code change."""
    import subprocess

    from rl_assets.core.checkpoints import code_version

    git = lambda *args: subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True)  # noqa: E731
    (tmp_path / "sub").mkdir()
    for name in ("dvc.lock", "sub/dvc.lock", "train.py"):
        (tmp_path / name).write_text("one\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    monkeypatch.chdir(tmp_path / "sub")
    clean = code_version()
    assert len(clean) == 12 and not clean.endswith("+dirty")
    (tmp_path / "dvc.lock").write_text("rewritten by a run\n")
    (tmp_path / "sub" / "dvc.lock").write_text("rewritten by a run\n")
    assert code_version() == clean
    (tmp_path / "train.py").write_text("two\n")
    assert code_version() == clean + "+dirty"
