"""One writer of a project's data at a time, and no slot held by a run that died.

Runs launched by the daemon (UI, schedules, sensors) queue behind each other through the run
coordinator's `rl_assets/writes` tag limit (dagster.yaml). Runs of `rl-assets run`, `materialize`
and so `dvc repro` execute in the CLI's own process, outside that queue, so the CLI holds an
exclusive file lock in the instance directory for as long as its run lasts. The kernel drops the
lock when the process dies, however it dies, which is what makes the cleanup safe: once a CLI holds
the lock, any run that another CLI started and that still shows as in progress is dead. It is then
marked failed and its `gpu` pool slots are freed (Dagster's run monitoring does this only for runs
the daemon launched), and the log says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

LAUNCHED_BY = "rl_assets/launched_by"  # run tag: "cli" for runs whose process holds the writer lock
IN_PROGRESS = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
               DagsterRunStatus.CANCELING]


class AnotherWriter(RuntimeError):
    """Another run is writing this project's data."""


def cli_tags() -> dict[str, str]:
    return {LAUNCHED_BY: "cli", "rl_assets/host": socket.gethostname(), "rl_assets/pid": str(os.getpid())}


def _describe(run, holder: dict | None = None) -> str:
    """Which run writes, and who launched it (the lock holder's pid while its run is not started yet)."""
    if run is None:
        return f"`rl-assets {(holder or {}).get('command', '')}` (pid {(holder or {}).get('pid')}), run not started yet"
    tags = run.tags
    if tags.get(LAUNCHED_BY) == "cli":
        how = f"`rl-assets` (pid {tags.get('rl_assets/pid')} on {tags.get('rl_assets/host')})"
    elif tags.get("dagster/schedule_name"):
        how = f"schedule {tags['dagster/schedule_name']}"
    elif tags.get("dagster/sensor_name"):
        how = f"sensor {tags['dagster/sensor_name']}"
    else:
        how = "the UI or the daemon"
    return f"run {run.run_id} ({run.status.value}, launched by {how})"


@contextlib.contextmanager
def exclusive_writer(instance: DagsterInstance, command: str, log=print):
    """Hold the project's writer lock while the body runs; raise AnotherWriter when another run writes, clean up after dead ones."""
    home = Path(instance.root_directory)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "rl-assets-writer.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            try:
                holder = json.loads(handle.read() or "{}")
            except ValueError:
                holder = {}
            records = instance.get_run_records(RunsFilter(statuses=IN_PROGRESS, tags={"rl_assets/pid": str(holder.get("pid"))}), limit=1)
            run = records[0].dagster_run if records else None
            raise AnotherWriter(f"another run is writing this project's data: {_describe(run, holder)}; wait for it to finish "
                                "or stop it (make ui, or kill that process), then run again") from None
        for record in instance.get_run_records(RunsFilter(statuses=IN_PROGRESS)):
            run = record.dagster_run
            if run.tags.get(LAUNCHED_BY) == "cli":  # its process held this lock, so it is gone
                instance.report_run_failed(run, message=f"marked failed by a new `rl-assets {command}`: the process that ran it "
                                                        f"(pid {run.tags.get('rl_assets/pid')}) is gone, killed or crashed")
                instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
                log(f"run {run.run_id} was left in progress by a process that died (pid {run.tags.get('rl_assets/pid')}): "
                    "marked it failed and freed its gpu pool slot")
            elif run.tags.get("rl_assets/writes") == "data":
                raise AnotherWriter(f"another run is writing this project's data: {_describe(run)}; wait for it to finish or "
                                    "cancel it in the UI (make ui), then run again")
        free_slots_of_finished_runs(instance, log)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"command": command, "pid": os.getpid()}))
        handle.flush()  # so a refused second writer can name this process and find its run by the pid tag
        yield


def free_slots_of_finished_runs(instance: DagsterInstance, log=print) -> list[str]:
    """Free the pool slots (claimed or pending) of runs that have ended: a run stopped while its steps were being launched
    can end FAILED or CANCELED with a slot still claimed, and every later run would wait on it without a word."""
    freed = []
    storage = instance.event_log_storage
    for pool in sorted(storage.get_concurrency_keys()):
        info = storage.get_concurrency_info(pool)
        for run_id in sorted({slot.run_id for slot in info.claimed_slots} | {step.run_id for step in info.pending_steps}):
            run = instance.get_run_by_id(run_id)
            if run is None or run.is_finished:
                storage.free_concurrency_slots_for_run(run_id)
                freed.append(run_id)
                log(f"run {run_id} ({run.status.value if run else 'deleted'}) still held a slot of the {pool} pool: freed it")
    return freed
