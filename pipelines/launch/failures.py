"""Why a compute step failed, classified in one place: an error that would recur fails once, a crash is retried.

The child reports each rank's exception (pipelines.launch.pipes_child.report_failure) and its exit code says the rest;
`step_failure` turns them into Dagster's `Failure(allow_retries=False)` or a `ComputeStepCrashed` for the retry policy.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from dagster import Failure

from pipelines.launch.pipes_child import DETERMINISTIC_EXIT


class ComputeStepCrashed(Exception):
    """A compute step's process died, was killed, or hit a transient error: a retry may succeed."""


def step_failure(stage: str, returncode: int | None, records: list[dict], not_written: list[str] | None = None) -> Exception:
    """The exception a failed compute step raises: `Failure(allow_retries=False)` when a retry cannot help.

    `stage` names what failed (the output the child was writing); `not_written` the outputs the step did not write.
    """
    deterministic = [r for r in records if r.get("kind") == "deterministic"]
    stage = next((r["output"] for r in records if r.get("output")), stage)
    metadata = {"stage": stage, "output": stage, "exit_code": returncode if returncode is not None else "unknown",
                **({"not_written": not_written} if not_written else {})}
    if deterministic:
        first = min(deterministic, key=lambda r: r.get("rank", 0))
        where = f" (rank {first['rank']})" if first.get("rank") else ""
        return Failure(description=f"{first['error']}{where}", metadata={**metadata, "retried": False}, allow_retries=False)
    if returncode in (DETERMINISTIC_EXIT, 2):  # 2: argparse rejected the command line
        return Failure(description=f"the {stage} step failed with an error that would recur (exit code {returncode}); its log has the traceback",
                       metadata={**metadata, "retried": False}, allow_retries=False)
    if records:
        return ComputeStepCrashed(f"{records[0]['error']} (a transient error in the {stage} step)")
    return ComputeStepCrashed(f"the {stage} step's process {_exit_reason(returncode)}")


def _exit_reason(returncode: int | None) -> str:
    number = -returncode if returncode is not None and returncode < 0 else returncode - 128 if returncode and returncode > 128 else None
    try:
        name = signal.Signals(number).name if number else None
    except ValueError:
        name = None
    if name == "SIGKILL":
        return f"was killed by SIGKILL (exit {returncode}): out of memory (the kernel's OOM killer) or the node was reclaimed"
    if name == "SIGTERM":
        return f"was terminated by SIGTERM (exit {returncode}): preempted or stopped"
    if name:
        return f"was killed by {name} (exit {returncode})"
    if returncode is None:
        return "failed"
    return f"exited with code {returncode} without reporting an error (a crash outside Python, or a launcher's worker died)"


def error_records(directory: Path) -> list[dict]:
    """What each rank of the child reported about its exception (pipes_child.report_failure), or its launcher (slurm_job)."""
    records = []
    for path in sorted(directory.glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records
