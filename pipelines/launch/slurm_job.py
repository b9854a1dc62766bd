"""A compute step as a Slurm job: submitted with sbatch, its log relayed while it runs, its end as the step's exit code.

    python -m pipelines.launch.slurm_job --folder DIR [--job-name NAME] [--nodes N] [--gpus-per-node G] [--partition P] [--time T]
                                  [--cpus-per-task C] [--mem M] [--no-requeue] [--sbatch-arg=--account=ml ...] [--heartbeat S]
                                  -- COMMAND ...

What a compute step launches in place of its child under `compute.executor: slurm` (pipelines.launch.steps.compute_command).
The job runs COMMAND (the Pipes child, under torchrun when it has several processes) once per node through srun,
in the folder this was started from, with this process's environment (sbatch --export=ALL: the Pipes variables
included). The child's messages reach Dagster through files in the project (`compute.slurm.shared_dir`), so the
nodes must see the project at the same path, as they see data/. With several nodes, torchrun's rendezvous is the
job's first node (PET_RDZV_ENDPOINT) unless compute.rdzv_endpoint names one.

- Rejected by Slurm (no such partition, a time limit above the partition's): sbatch's reason is printed and left as
  the step's error record (pipelines.launch.failures), and the step fails without retries.
- SIGINT or SIGTERM (the Dagster run was cancelled): the job is cancelled (`scancel`); this waits for it to end.
- SIGKILL, or a lost login node (nothing here can cancel the job then): this process rewrites the file `launcher.beat` in
  the step's folder every `--heartbeat` seconds, and the job's script watches it beside srun: unchanged for more
  than MISSED_BEATS heartbeats, the job cancels itself. The folder is shared with the nodes, as the job's log is.
- Requeued (a preemption, a failed node, `scontrol requeue`): the job starts again and its child continues after
  the outputs the first attempt reported (their journal is the file RL_ASSETS_REPORTED: pipelines.launch.pipes_child).
- Any end but COMPLETED: the state, Slurm's reason and the exit code on stderr and in the error record; a crash
  (a node failure, a preemption, the time limit) is retried by the step's retry policy, as a killed local child is.

Slurm's state is read with `scontrol show job` every `--poll` seconds (a cluster without slurmdbd has no sacct).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pipelines.launch.pipes_child import DETERMINISTIC_EXIT, ERROR_DIR_ENV, REPORTED_ENV

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "SPECIAL_EXIT", "REVOKED"}
RENDEZVOUS_PORT = 29500
UNANSWERED_POLLS = 20  # scontrol failures in a row before the job counts as lost
MISSED_BEATS = 3  # heartbeats the launcher may miss (a busy login node, a slow shared filesystem) before its job cancels itself


def batch_script(command: list[str], nodes: int, beat: Path, heartbeat: float) -> str:
    """The job's script: one task per node runs `command` (srun); with several nodes torchrun meets at the first node.

    Beside srun, a watchdog reads `beat` every `heartbeat` seconds and cancels the job once it stayed the same for more
    than MISSED_BEATS of them: its launcher is gone. It compares the file's contents, not its time, so the clocks of the
    launcher's host and the job's node need not agree, and reading opens the file, which a shared filesystem revalidates.
    """
    stale = math.ceil(MISSED_BEATS * heartbeat)
    lines = ["#!/bin/bash", "# Written by rl-assets (pipelines/launch/slurm_job.py) for one compute step."]
    if nodes > 1:  # torchrun reads PET_<OPTION> for an option not on its command line
        lines.append(f'export PET_RDZV_ENDPOINT="${{PET_RDZV_ENDPOINT:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):'
                     f'{RENDEZVOUS_PORT}}}"')
    lines += [
        f"watch_launcher() {{  # the launcher rewrites {beat.name} every {heartbeat:g} s; the same for over {stale} s: it was killed",
        '  local last="" seen=$SECONDS now nap',
        "  trap 'kill $nap 2>/dev/null; exit' TERM  # stopped once srun is done, its sleep with it",
        f"  while sleep {heartbeat:g} & nap=$!; wait $nap; do",
        f"    now=$(cat {shlex.quote(str(beat))} 2>/dev/null)",
        '    if [ "$now" != "$last" ]; then last=$now seen=$SECONDS',
        f"    elif (( SECONDS - seen > {stale} )); then  # SECONDS counts whole seconds: '>' waits {stale} s at least",
        f'      echo "rl-assets: no heartbeat from the launcher for over {stale} s (its process is gone): cancelling slurm job $SLURM_JOB_ID" >&2',
        '      scancel "$SLURM_JOB_ID" || kill $$; exit  # without scancel here: ending this script ends the job',
        "    fi",
        "  done",
        "}",
        "watch_launcher &",
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {shlex.join(command)}",
        "status=$?",
        "kill $! 2>/dev/null",
        "exit $status",
    ]
    return "\n".join(lines) + "\n"


def keep_beating(beat: Path, heartbeat: float) -> None:
    """Rewrite `beat` now, then every `heartbeat` seconds from a daemon thread for as long as this process lives."""
    def once() -> None:
        with contextlib.suppress(OSError):  # a full disk for a moment: the watchdog tolerates missed beats
            partial = beat.with_suffix(".partial")
            partial.write_text(f"{time.time()}\n")
            partial.replace(beat)

    def forever() -> None:
        while True:
            time.sleep(heartbeat)
            once()

    once()
    threading.Thread(target=forever, name="heartbeat", daemon=True).start()


def sbatch_command(args: argparse.Namespace, script: Path, log: Path) -> list[str]:
    asked = {"--partition": args.partition, "--time": args.time, "--cpus-per-task": args.cpus_per_task or None, "--mem": args.mem,
             "--gpus-per-node": args.gpus_per_node or None}
    return ["sbatch", "--parsable", f"--job-name={args.job_name}", f"--output={log}", "--open-mode=append", f"--chdir={os.getcwd()}",
            "--export=ALL", f"--nodes={args.nodes}", "--ntasks-per-node=1", "--requeue" if args.requeue else "--no-requeue",
            *(f"{option}={value}" for option, value in asked.items() if value), *args.sbatch_args, str(script)]


def job_state(job_id: str) -> dict[str, str] | None:
    """`scontrol show job`'s fields (JobState, Reason, ExitCode, Restarts, ...); None once Slurm has forgotten the job."""
    done = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout))


def exit_code(state: dict[str, str]) -> int:
    """The step's exit code from the job's `ExitCode=code:signal`, as a local child's would be (128 + signal when killed)."""
    code, _, number = state.get("ExitCode", "1:0").partition(":")
    if int(code or 0):
        return int(code)
    if int(number or 0):
        return 128 + int(number)
    return 0 if state.get("JobState") == "COMPLETED" else 1


def leave_record(kind: str, message: str) -> None:
    """The step's error record (pipelines.launch.failures.error_records) unless the child left its own, which says more."""
    directory = os.environ.get(ERROR_DIR_ENV)
    if not directory or any(Path(directory).glob("rank*.json")):
        return
    (Path(directory) / "slurm.json").write_text(json.dumps({"kind": kind, "error": message, "type": "Slurm", "rank": 0, "output": None}))


class Relay:
    """The job's log file, copied to this process's stdout as it grows (the step's log in Dagster)."""

    def __init__(self, path: Path):
        self.path, self.at = path, 0

    def __call__(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as log:
            log.seek(self.at)
            chunk = log.read()
        if chunk:
            self.at += len(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.launch.slurm_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="the step's folder for the job's script, log and journal")
    parser.add_argument("--job-name", default="rl-assets")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--partition", default="")
    parser.add_argument("--time", default="")
    parser.add_argument("--cpus-per-task", type=int, default=0)
    parser.add_argument("--mem", default="")
    parser.add_argument("--no-requeue", dest="requeue", action="store_false")
    parser.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[])
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--heartbeat", type=float, default=10.0, help="seconds between this process's beats, which its job watches")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command each node runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")

    args.folder.mkdir(parents=True, exist_ok=True)
    script, log, beat = args.folder / "job.sh", args.folder / "job.log", (args.folder / "launcher.beat").resolve()
    script.write_text(batch_script(command, args.nodes, beat, args.heartbeat))
    keep_beating(beat, args.heartbeat)  # before the job exists: it may start at once
    os.environ[REPORTED_ENV] = str(args.folder / "reported")  # exported to the job with the rest of the environment
    job, cancelled = [], []

    def cancel(signum, frame) -> None:  # installed before the job exists: a stop during sbatch cancels it once it does
        if job and not cancelled:
            print(f"{signal.Signals(signum).name}: cancelling slurm job {job[0]}", file=sys.stderr, flush=True)
            subprocess.run(["scancel", job[0]], check=False)
        cancelled.append(signum)

    signal.signal(signal.SIGINT, cancel)
    signal.signal(signal.SIGTERM, cancel)
    submitted = subprocess.run(sbatch_command(args, script, log), capture_output=True, text=True)
    if submitted.returncode != 0:
        reason = " ".join(line.removeprefix("sbatch: error: ") for line in submitted.stderr.splitlines() if line.strip()) or "no reason given"
        message = f"Slurm rejected the compute step's job: {reason}"
        print(f"error: {message}", file=sys.stderr, flush=True)
        leave_record("deterministic", message)
        return DETERMINISTIC_EXIT
    job_id = submitted.stdout.strip().split(";")[0]
    job.append(job_id)
    (args.folder / "job_id").write_text(job_id)
    print(f"slurm job {job_id} ({args.job_name}) submitted; its log: {log}", file=sys.stderr, flush=True)
    if cancelled:  # stopped while sbatch ran
        cancelled.clear()
        cancel(signal.SIGTERM, None)
    relay, restarts, seen, unanswered = Relay(log), 0, None, 0
    while True:
        relay()
        state = job_state(job_id)
        if state is None:  # scontrol failed: the controller may be busy for a moment, or the job long gone
            unanswered += 1
            if unanswered < UNANSWERED_POLLS:
                time.sleep(args.poll)
                continue
            message = f"slurm job {job_id}: Slurm did not answer for it {UNANSWERED_POLLS} times in a row (its end was not seen)"
            print(f"error: {message}", file=sys.stderr, flush=True)
            leave_record("transient", message)
            return 1
        unanswered = 0
        now = (state.get("JobState"), state.get("Reason"))
        if now != seen and now[0] in ("PENDING", "RUNNING"):  # said once per change: waiting (and why), then where it runs
            why = f" (reason {now[1]})" if now[1] not in (None, "", "None") else ""
            print(f"slurm job {job_id} " + (f"pending{why}" if now[0] == "PENDING" else f"running on {state.get('NodeList')}"),
                  file=sys.stderr, flush=True)
        seen = now
        if int(state.get("Restarts", "0") or 0) > restarts:
            restarts = int(state["Restarts"])
            print(f"slurm job {job_id} was requeued (restart {restarts}): it continues after the outputs already reported",
                  file=sys.stderr, flush=True)
        if state.get("JobState") in ENDED:
            break
        time.sleep(args.poll)
    relay()
    code = exit_code(state)
    if state["JobState"] != "COMPLETED":
        message = f"slurm job {job_id} ended {state['JobState']} (reason {state.get('Reason')}, exit code {state.get('ExitCode')})"
        print(f"{'' if cancelled else 'error: '}{message}", file=sys.stderr, flush=True)
        if not cancelled:
            leave_record("transient", message)
    if cancelled:
        return 130
    return code if state["JobState"] == "COMPLETED" else code or 1


if __name__ == "__main__":
    sys.exit(main())
