"""What `GET /health` answers: the `rl-assets status` JSON, kept fresh without importing Dagster here.

The Dagster half of the status (the latest run) comes from the command the CLI hands over (`rl-assets
status`, run in a child process: this library never imports Dagster); that takes seconds, so the server
keeps the last answer and refreshes it in the background at most every `interval` seconds while requests
come in. Without a command, /health tells from the files alone. Heartbeats are files
(rl_assets/run/heartbeat.py) and are read afresh on every request.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

UNHEALTHY_RUNS = ("FAILURE", "CANCELED")


class StatusCache:
    """The last output of the status `command` (JSON) in the project at `root`, refreshed in the background; None without one."""

    def __init__(self, root: Path, interval: float = 15.0, command: list[str] | None = None):
        self.root, self.interval, self.command = root, interval, command
        self.value: dict | None = None
        self.error: str | None = None
        self.fetched = 0.0
        self._lock, self._first = threading.Lock(), threading.Event()
        self._refreshing = False

    def refresh(self) -> None:
        try:
            if self.command is None:  # no orchestrator's status: /health tells from the files alone
                return
            done = subprocess.run(self.command, cwd=self.root, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join([str(self.root), os.environ.get("PYTHONPATH", "")])})
            start = done.stdout.find("{")  # exit 1 means unhealthy and still prints the JSON
            self.value, self.error = json.loads(done.stdout[start:]), None
        except (OSError, ValueError, subprocess.SubprocessError) as error:
            message = f"{' '.join(self.command[1:])} failed: {error}"
            self.error = message + (f": {done.stderr.strip()[-300:]}" if "done" in locals() and done.stderr else "")
        finally:
            self.fetched = time.time()
            self._refreshing = False
            self._first.set()

    def latest(self, wait: bool = True) -> dict | None:
        """The last status (waiting for the first one when `wait`); starts a refresh when it is older than `interval`."""
        with self._lock:
            due = not self._refreshing and time.time() - self.fetched > self.interval
            if due:
                self._refreshing = True
        if due:
            threading.Thread(target=self.refresh, daemon=True, name="rl-assets-status").start()
        if wait:
            self._first.wait(timeout=120)
        return self.value

    def age(self) -> float | None:
        return round(time.time() - self.fetched, 3) if self.fetched else None


def assess(status: dict | None, steps: list[dict]) -> tuple[bool, list[str]]:
    """(healthy, why not): unhealthy when the latest run failed or was cancelled, an output changed since it was recorded,
    the experiment's data folder holds another experiment's outputs, or a running step's heartbeat is stale."""
    reasons = []
    run = (status or {}).get("latest_run") or {}
    if run.get("status") in UNHEALTHY_RUNS:
        reasons.append(f"latest run {run.get('run_id')} {run['status'].lower()}")
    for key, why in ((status or {}).get("changed_outputs") or {}).items():
        reasons.append(f"{key}: {why}")
    if other := (status or {}).get("other_experiment_outputs"):
        reasons.append(f"{(status or {}).get('data', 'data')}/ holds outputs of another experiment ({', '.join(f'{k}: {e}' for k, e in other.items())}), "
                       f"not of {(status or {}).get('experiment')}")
    for step in steps:
        if step["stale"]:
            name = step["stage"] + (f" r{step['round']:02d}" if step["round"] is not None else "")
            reasons.append(f"{name} (pid {step['pid']}): no heartbeat progress for {max(step['heartbeat_age_s'], step['progress_age_s']):.0f} s")
    return not reasons, reasons


def health_body(status: dict | None, steps: list[dict], status_age: float | None, error: str | None) -> tuple[bool, dict]:
    """(healthy, the JSON /health answers): the state a person or a probe asks about, in a few keys."""
    healthy, reasons = assess(status, steps)
    status = status or {}
    latest = status.get("latest_checkpoint") or {}
    promoted = status.get("promoted_model") or {}
    run = status.get("latest_run") or {}
    body = {"status": "healthy" if healthy else "unhealthy", "reasons": reasons,
            "latest_run": {key: run.get(key) for key in ("run_id", "status", "started", "ended")} if run else None,
            "experiment": status.get("experiment"), "round": status.get("current_round"),
            "rounds_configured": status.get("rounds_configured"), "latest_checkpoint": latest.get("checkpoint"),
            "last_metrics": latest.get("metrics"), "promoted_model": promoted.get("checkpoint_id"),
            "running_steps": [{key: step[key] for key in ("stage", "round", "pid", "rank", "heartbeat_age_s", "progress_age_s", "stale")}
                              for step in steps],
            "heartbeat_age_s": min((step["heartbeat_age_s"] for step in steps), default=None),
            "status_age_s": status_age}
    if error:
        body["status_error"] = error
    return healthy, body
