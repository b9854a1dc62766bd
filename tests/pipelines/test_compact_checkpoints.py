"""train.checkpoint_dtype: bfloat16 (issue 30's compact saves): each round's folder is its weights rounded to bf16, half
the bytes on disk, in DVC's cache and on the remote, while the rounds go on from the float32 weights, so a compact run
samples and trains exactly as a full one does; those weights are run state, and when they are lost the round that made
them trains again instead of the next one starting from the rounded ones.
"""

from __future__ import annotations

import hashlib

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import copy_project, python
from rl_assets.core.checkpoints import checkpoint_id, master_weights_path, read_lineage
from rl_assets.core.policy import load_policy

pytestmark = pytest.mark.e2e

RUN = ["-m", "pipelines", "run", "--set", "rounds=3"]


def compact_project(micro_template, destination):
    project = copy_project(micro_template, destination)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"]["checkpoint_dtype"] = "bfloat16"
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return project


@pytest.fixture(scope="module")
def runs(micro_template, tmp_path_factory) -> tuple:
    """(full, compact): the micro project's 3 rounds saved in float32 and in bf16, from the same params otherwise."""
    root = tmp_path_factory.mktemp("compact")
    full, compact = copy_project(micro_template, root / "full"), compact_project(micro_template, root / "compact")
    for project in (full, compact):
        python(RUN, project, timeout=900)
    return full, compact


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_compact_rounds_are_half_the_bytes_and_the_rounds_go_on_as_a_full_run_does(runs):
    full, compact = runs
    assert checkpoint_id(full / "data/r00/checkpoint") == checkpoint_id(compact / "data/r00/checkpoint")  # r00 is saved whole
    for n in (1, 2, 3):
        key = f"data/r{n:02d}/checkpoint"
        card = read_lineage(compact / key)
        assert (card["checkpoint_dtype"], card["master_weights"]) == ("bfloat16", "float32")
        whole, rounded = weights(full / key), weights(compact / key)
        assert {t.dtype for t in rounded.values()} == {torch.bfloat16}
        # each round's folder is the full run's weights rounded: the compact run trained the same float32 weights
        assert rounded.keys() == whole.keys() and all(torch.equal(rounded[k], whole[k].to(torch.bfloat16)) for k in whole)
        assert (compact / key / "model.safetensors").stat().st_size < 0.6 * (full / key / "model.safetensors").stat().st_size
    for n in (2, 3):  # sampled from the float32 weights, as the full run's rounds were
        sampled = [pq.read_table(p / f"data/r{n:02d}/rollouts.parquet", columns=["completion_ids", "logprobs"]) for p in (full, compact)]
        assert sampled[0].equals(sampled[1])

    # the float32 weights of the newest round and its parent are kept, the older ones removed
    ids = {n: checkpoint_id(compact / f"data/r{n:02d}/checkpoint") for n in (1, 2, 3)}
    kept = sorted(p.stem for p in (compact / "data/run_state/weights").iterdir())
    assert kept == sorted([ids[2], ids[3]])
    chained, whole = (load_policy(compact / "data/r03/checkpoint", chain=True)[0].state_dict(),
                      load_policy(full / "data/r03/checkpoint")[0].state_dict())
    assert all(torch.equal(chained[k], whole[k]) for k in whole)  # what a round 4 would start from: the full run's r03


def test_unchanged_files_are_stored_once_in_dvcs_cache(runs):
    """Every round saves the same tokenizer files: DVC's cache holds each once, as the remote does (content-addressed)."""
    _, compact = runs
    tokenizers = {(compact / f"data/r{n:02d}/checkpoint/tokenizer.json").read_bytes() for n in (0, 1, 2, 3)}
    assert len(tokenizers) == 1
    md5 = hashlib.md5(tokenizers.pop()).hexdigest()
    stored = list((compact / ".dvc/cache/files/md5").glob(f"{md5[:2]}/{md5[2:]}"))
    assert len(stored) == 1, list((compact / ".dvc/cache").rglob("*"))[:20]


def test_lost_float32_weights_make_their_round_train_again(runs, tmp_path):
    _, made = runs
    project = copy_project(made, tmp_path / "project")
    r03 = checkpoint_id(project / "data/r03/checkpoint")
    master_weights_path(r03, project / "data").unlink()
    done = python(["-m", "pipelines", "run", "--set", "rounds=4"], project, timeout=900)
    assert "r03/checkpoint (its float32 weights are gone from data/run_state" in done.stderr, done.stderr[-3000:]
    assert checkpoint_id(project / "data/r03/checkpoint") == r03  # made again, the same
    assert read_lineage(project / "data/r04/checkpoint")["parent"] == r03

    # asked for r05's rollouts alone (DVC's stage, a UI click), the step refuses rather than sample from the rounded weights
    master_weights_path(checkpoint_id(project / "data/r04/checkpoint"), project / "data").unlink()
    refused = python(["-m", "pipelines", "materialize", "r05/rollouts"], project, timeout=600, check=False, RL_ASSETS_SET="rounds=5")
    assert refused.returncode != 0
    assert "the float32 weights the next round continues from are gone" in refused.stderr, refused.stderr[-3000:]
