"""Heartbeats of compute steps: a step whose main thread blocks goes stale, one that computes on one line does not,
a finished step leaves its duration, and a killed one is no longer listed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_assets.core.params_file import load_params
from rl_assets.run.heartbeat import HEARTBEATS, Heartbeat, running_steps, step_durations
from rl_assets_support import REPO

PARAMS = load_params(REPO / "tests" / "micro_params.yaml")  # what run_stage reads before the (stood-in) stage body

# A compute step stand-in: heartbeat every 50 ms, the main thread either blocked (hung) or computing on one line.
STEP = """
import sys, threading
from pathlib import Path
from rl_assets.run.heartbeat import Heartbeat
with Heartbeat(Path(sys.argv[1]), "train", 3, interval=0.05):
    print("beating", flush=True)
    if sys.argv[2] == "hang":
        threading.Event().wait()
    else:
        while True: pass
"""


def start_step(root: Path, mode: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", STEP, str(root), mode], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "beating"
    return child


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    pytest.fail("condition not met in time")


def test_a_blocked_step_goes_stale_while_a_computing_one_stays_fresh(tmp_path):
    hung, busy = tmp_path / "hung", tmp_path / "busy"
    children = [start_step(hung, "hang"), start_step(busy, "spin")]
    try:
        stale = wait_for(lambda: [s for s in running_steps(hung, timeout=0.5) if s["stale"]])
        assert stale[0]["stage"] == "train" and stale[0]["round"] == 3 and stale[0]["pid"] == children[0].pid
        assert stale[0]["heartbeat_age_s"] < stale[0]["progress_age_s"]  # alive and beating, but not moving
        time.sleep(1.5)  # past the limit, for the computing step to be judged over it
        [fresh] = running_steps(busy, timeout=1.0)
        assert not fresh["stale"] and fresh["progress_age_s"] < 1.0
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert running_steps(hung, timeout=0.5) == []  # killed: its file stays, its pid is gone
    assert len(list((hung / HEARTBEATS).glob("*.json"))) == 1


def test_a_step_that_stops_beating_is_stale(tmp_path):
    with Heartbeat(tmp_path, "rollouts", 1, interval=3600) as beat:
        [step] = running_steps(tmp_path, timeout=60, now=beat.record["time"] + 61)
        assert step["stale"] and step["stage"] == "rollouts"
        assert not running_steps(tmp_path, timeout=60)[0]["stale"]


def test_a_compute_step_beats_while_it_runs_and_records_its_duration(tmp_path, monkeypatch):
    from rl_assets.run import stages

    seen = []

    def step_body(stage, params, round_number, root, loaded):
        seen.append(running_steps(root))
        if stage == "bad":
            raise ValueError("boom")
        return {"rows": 1}, root

    monkeypatch.setattr(stages, "_run_stage", step_body)
    metadata, path = stages.run_stage("evaluation", PARAMS, None, tmp_path)
    # the step's metadata, its peak memory and its device's busy share (rl_assets.run.hardware)
    assert path == tmp_path and metadata.pop("peak_rss_gb") > 0 and 0 <= metadata.pop("busy_share") <= 1
    assert metadata == {"rows": 1, "busy_device": "cpu"}
    with pytest.raises(ValueError):
        stages.run_stage("bad", PARAMS, 2, tmp_path)
    assert [s[0]["stage"] for s in seen] == ["evaluation", "bad"] and seen[0][0]["pid"] == os.getpid()
    assert running_steps(tmp_path) == []
    durations = step_durations(tmp_path)
    assert durations[("evaluation", None)]["ok"] and not durations[("bad", 2)]["ok"]
    assert durations[("evaluation", None)]["seconds"] >= 0
    assert durations[("evaluation", None)]["peak_rss_gb"] > 0 and durations[("evaluation", None)]["busy_device"] == "cpu"  # for /metrics


def test_run_stage_beats(tmp_path, monkeypatch):
    """Every compute step goes through run_stage: while its body runs there is a heartbeat, and none after."""
    from rl_assets.run import stages

    seen = []
    monkeypatch.setattr(stages, "_run_stage", lambda stage, params, n, root, loaded: seen.append(running_steps(root)) or ({}, root))
    stages.run_stage("rollouts", PARAMS, 2, tmp_path)
    assert [(step["stage"], step["round"]) for step in seen[0]] == [("rollouts", 2)]
    assert running_steps(tmp_path) == []


def test_rl_assets_status_lists_running_steps_with_their_heartbeat(tmp_path):
    from ops_support import make_fake_project
    from rl_assets.core.params_file import load_params
    from rl_assets.run.status import project_status

    project = make_fake_project(tmp_path / "project")
    params = load_params(project / "params.yaml")
    assert project_status(project, params)["running_steps"] == []
    with Heartbeat(project, "rollouts", 2, interval=3600):
        [step] = project_status(project, params)["running_steps"]
        assert (step["stage"], step["round"], step["pid"], step["stale"]) == ("rollouts", 2, os.getpid(), False)
