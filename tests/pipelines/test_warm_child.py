"""The compute child a CLI run starts ahead of its step (pipelines/launch/warm_child.py).

The handover itself, without Dagster: each command runs in a fork of the warm child with the step's stdout/stderr,
working directory and per-step variables, its exit status (a signal's included) reaches the step, every step of the
run gets a fork of its own, and a step whose environment differs otherwise gets a fresh child. That a micro
run's compute step uses it, with the checkpoints of an uninterrupted run, is in test_killed_run.py; that the ops of an
overlapped run (rollouts.staleness) use it, in test_staleness.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from dagster import AssetKey

from pipelines.launch.pipes_child import DETERMINISTIC_EXIT, ERROR_DIR_ENV
from pipelines.launch.warm_child import WARM_CHILD_ENV, HandedOver, WarmChild, alive, take, wants_warm_child, warm_child_for
from conftest import REPO

COMMAND = [sys.executable, "-m", "pipelines.launch.pipes_child", "r01/rollouts", "--params", "missing.yaml"]


@pytest.fixture
def warm(monkeypatch):
    monkeypatch.chdir(REPO)  # where `python -m pipelines.launch.warm_child` finds the package
    monkeypatch.delenv(WARM_CHILD_ENV, raising=False)
    child = WarmChild()
    child.env = dict(os.environ)  # as it started (pytest's own variable changes between the setup and the test)
    yield child
    child.close()


def step_env(warm: WarmChild, **extra: str) -> dict[str, str]:
    """The environment a compute step gives its child: its own (which names the warm child) and the per-step variables."""
    return {**warm.env, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "DAGSTER_PIPES_CONTEXT": "e30=", **extra}


def test_the_command_runs_in_the_warm_child_as_in_a_fresh_one(warm, tmp_path, capfd):
    errors = tmp_path / "errors"
    errors.mkdir()
    handle, why_not = take(COMMAND, str(tmp_path), step_env(warm, **{ERROR_DIR_ENV: str(errors)}))
    assert isinstance(handle, HandedOver), why_not
    assert handle.pid != warm.process.pid and handle.warm == warm.process.pid  # a fork of it
    assert handle.wait(timeout=120) == DETERMINISTIC_EXIT  # the params file is missing in its working directory
    assert "error: ParamsError" in capfd.readouterr().err and "missing.yaml" in (errors / "rank0.json").read_text()
    assert json.loads((errors / "rank0.json").read_text())["kind"] == "deterministic"  # the per-step variable reached it

    again, why_not = take(COMMAND, str(tmp_path), step_env(warm))  # the next step (or a retry) gets a fork of its own
    assert isinstance(again, HandedOver) and again.pid not in (handle.pid, warm.process.pid), why_not
    assert again.wait(timeout=120) == DETERMINISTIC_EXIT and warm.process.poll() is None


def blocked_command(tmp_path) -> list[str]:
    """A child that waits for its resolved params, a FIFO nobody writes: it runs until it is killed."""
    os.mkfifo(tmp_path / "params.json")
    return [*COMMAND[:4], "--resolved-params", "params.json"]


def test_a_fork_killed_by_a_signal_reports_it_and_the_warm_process_goes_on(warm, tmp_path):
    handle, why_not = take(blocked_command(tmp_path), str(tmp_path), step_env(warm))
    assert isinstance(handle, HandedOver), why_not
    time.sleep(0.5)
    assert handle.poll() is None
    handle.send_signal(signal.SIGKILL)
    assert handle.wait(timeout=30) == -signal.SIGKILL and warm.process.poll() is None


def test_a_step_whose_environment_differs_gets_a_fresh_child(warm, tmp_path):
    handle, why_not = take(COMMAND, str(tmp_path), step_env(warm, OMP_NUM_THREADS="13"))  # read when torch loads
    assert handle is None and why_not == "the step's environment differs in OMP_NUM_THREADS"
    assert warm.process.poll() is None  # still there for a step whose environment matches


def test_only_a_one_process_pipes_child_is_handed_over(warm, tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *COMMAND[1:]]
    assert take(torchrun, str(tmp_path), step_env(warm)) == (None, "not a one-process child")
    assert warm.process.poll() is None  # still waiting for a command it can run


def test_a_killed_warm_process_ends_its_forks_their_steps_see_it_and_close_cleans_up(warm, tmp_path):
    handle, why_not = take(blocked_command(tmp_path), str(tmp_path), step_env(warm))
    assert isinstance(handle, HandedOver), why_not
    os.kill(warm.process.pid, signal.SIGKILL)
    assert handle.wait(timeout=30) == -signal.SIGKILL  # nobody is left to write its status
    deadline = time.monotonic() + 30
    while alive(handle.pid):  # the fork's launcher is gone: it exits within a second (rl_assets.run.process.exit_with_launcher)
        assert time.monotonic() < deadline, "the fork outlived the warm child"
        time.sleep(0.2)
    folder = warm.folder
    warm.close()
    assert not folder.exists() and WARM_CHILD_ENV not in os.environ


def test_an_unused_warm_child_is_stopped_when_the_run_ends(warm):
    warm.close()
    assert warm.process.returncode == -signal.SIGKILL and not warm.folder.exists()


def test_a_warm_child_whose_cli_died_leaves(tmp_path):
    cli = subprocess.run([sys.executable, "-c", "import os; from pipelines.launch.warm_child import WarmChild; "
                                                "print(WarmChild().process.pid, flush=True); os._exit(0)"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    pid = int(cli.stdout)
    deadline = time.monotonic() + 120  # its imports first, then a second at most
    while alive(pid):
        assert time.monotonic() < deadline, f"warm child {pid} outlived its CLI"
        time.sleep(0.2)


@pytest.mark.parametrize("compute, keys, wanted", [
    ({}, None, True),
    ({}, ["raw_data", "prompts"], False),
    ({}, ["prompts", "r01/rollouts"], True),
    ({"executor": "k8s"}, None, False),
    ({"nproc": 2}, ["r01/rewards"], False),
    ({"accelerate_config": "fsdp.yaml"}, None, False),
])
def test_which_runs_start_a_warm_child(compute, keys, wanted):
    params = SimpleNamespace(compute=SimpleNamespace(**{"executor": "multiprocess", "nproc": 1, "nnodes": 1, "accelerate_config": None, **compute}))
    assert wants_warm_child(params, None if keys is None else [AssetKey.from_user_string(k) for k in keys]) is wanted


def test_a_run_whose_warm_child_cannot_start_goes_on_without_it(tmp_path, monkeypatch):
    import tempfile

    deep = tmp_path / ("d" * 120)  # longer than a Unix socket's path may be
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    said = []
    params = SimpleNamespace(compute=SimpleNamespace(executor="multiprocess", nproc=1, nnodes=1, accelerate_config=None))
    with warm_child_for(params, None, said.append) as warm:
        assert warm is None and WARM_CHILD_ENV not in os.environ
    assert len(said) == 1 and said[0].startswith("warning: the compute child starts with its step (")
