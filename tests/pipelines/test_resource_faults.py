"""Resource faults say why (issue 25, problem 6): a disk that fills while a checkpoint is written ends the run with one
line naming the output, the cause and the space left, one traceback (the child's), nothing half-written, and the rerun
continues once there is room. The disk is a small tmpfs mounted over data/r01 (root only, as in CI)."""

from __future__ import annotations

import subprocess

import pytest

from conftest import MICRO_OUTPUTS, python
from rl_assets.core.checkpoints import checkpoint_id

pytestmark = pytest.mark.e2e  # root, as make test and CI run: a tmpfs it cannot mount fails the test


@pytest.fixture()
def small_round_disk(micro_copy):
    """data/r01 on a 64 kB filesystem: the round's tables fit, its checkpoint (~100 kB of weights) does not."""
    where = micro_copy / "data" / "r01"
    where.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.fail(f"cannot mount a tmpfs over {where} (the test needs root): {mounted.stderr.strip()}")
    try:
        yield micro_copy, where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_is_named_with_the_output_and_the_space_left(small_round_disk, pipeline_outputs):
    project, where = small_round_disk
    failed = python(["-m", "pipelines", "run"], project, timeout=900, check=False)
    assert failed.returncode == 1
    summary = failed.stderr[failed.stderr.rindex("run FAILED after"):]
    assert "failed: r01/checkpoint: no space left on device while writing data/r01/checkpoint:" in summary, summary
    assert " kB free on its filesystem" in summary
    assert failed.stderr.count("Traceback (most recent call last)") == 1 and "Stack Trace:" not in failed.stderr
    assert sorted(p.name for p in where.iterdir()) == ["rewards.parquet", "rollouts.parquet"]  # no half-written checkpoint

    subprocess.run(["mount", "-o", "remount,size=16m", str(where)], check=True)
    python(["-m", "pipelines", "run"], project, timeout=900)
    assert checkpoint_id(project / MICRO_OUTPUTS["r01/checkpoint"]) == checkpoint_id(pipeline_outputs / MICRO_OUTPUTS["r01/checkpoint"])
