"""Heartbeats of running compute steps: what `/health` and `rl-assets status` read to tell a hung step.

While a step runs, a daemon thread rewrites `.rl_assets/heartbeats/<stage>[-rNN]-<host>-<pid>.json` every
`RL_ASSETS_HEARTBEAT_SECONDS` (default 10) with the stage, round, rank, pid and two times:

- `time`, the last beat: the process is alive and its interpreter runs threads;
- `progress`, the last beat at which the main thread stood somewhere else than at the beat before
  (its innermost frames' files and lines) or used CPU time meanwhile (at least a tenth of the
  interval). A step blocked on a lock, a dead read or a peer that never answers keeps beating, but
  its `progress` stops; a loop that spends its time on one line (a long `backward`) still progresses.

The file is removed when the step returns or raises, and a line with the step's duration (and what it measured:
busy share, peak memory) is appended to `.rl_assets/steps.jsonl`; a killed process leaves it behind with a pid
that no longer lives, which readers on the same host drop. A step is stale when either time is
older than the limit (`RL_ASSETS_HEARTBEAT_TIMEOUT`, default 300 s, or what the reader is given).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

HEARTBEATS = Path(".rl_assets") / "heartbeats"
STEPS_LOG = "steps.jsonl"  # beside heartbeats/: every finished step's duration, for /metrics
DEFAULT_INTERVAL = 10.0
DEFAULT_TIMEOUT = 300.0


def interval_seconds() -> float:
    return float(os.environ.get("RL_ASSETS_HEARTBEAT_SECONDS", DEFAULT_INTERVAL))


def timeout_seconds() -> float:
    return float(os.environ.get("RL_ASSETS_HEARTBEAT_TIMEOUT", DEFAULT_TIMEOUT))


def _where(thread_id: int, depth: int = 6) -> tuple:
    """Files and lines of the innermost `depth` frames of a thread: where it stands now."""
    frame, out = sys._current_frames().get(thread_id), []
    while frame is not None and len(out) < depth:
        out.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def _cpu_seconds(native_id: int) -> float:
    """CPU time of one thread (Linux: /proc), else of the whole process."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    except (OSError, ValueError, IndexError):
        return time.process_time()


class Heartbeat:
    """Beats for one step from a daemon thread, watching `watched` (the thread that runs the step)."""

    def __init__(self, root: Path, stage: str, round_number: int | None, interval: float | None = None):
        self.interval = interval_seconds() if interval is None else interval
        suffix = f"-r{round_number:02d}" if round_number is not None else ""
        self.path = root / HEARTBEATS / f"{stage}{suffix}-{socket.gethostname()}-{os.getpid()}.json"
        now = time.time()
        self.record = {"stage": stage, "round": round_number, "pid": os.getpid(), "host": socket.gethostname(),
                       "rank": int(os.environ.get("RANK", "0")), "started": now, "time": now, "progress": now,
                       "interval": self.interval}
        self.summary: dict = {}  # what the step measured (busy share, peak memory), added to its line in the steps log
        self.watched, self.watched_native = threading.get_ident(), threading.get_native_id()
        self._last_where, self._last_cpu = None, -1.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{stage}", daemon=True)

    def beat(self) -> None:
        now, where, cpu = time.time(), _where(self.watched), _cpu_seconds(self.watched_native)
        if where != self._last_where or cpu - self._last_cpu >= self.interval / 10:
            self.record["progress"] = now
        self._last_where, self._last_cpu = where, cpu
        self.record["time"] = now
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.record))
        partial.replace(self.path)  # a reader never sees half a file

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except OSError:  # a full or vanished disk must not kill the step; the beat goes stale and says so
                pass

    def __enter__(self) -> "Heartbeat":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, kind, error, trace) -> None:
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)
        ended = time.time()
        done = {key: self.record[key] for key in ("stage", "round", "rank", "host", "pid", "started")}
        done.update(ended=ended, seconds=round(ended - self.record["started"], 3), ok=kind is None, **self.summary)
        with open(self.path.parent.parent / STEPS_LOG, "a") as log:  # one short line per step: appends do not interleave
            log.write(json.dumps(done) + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def running_steps(root: Path, timeout: float | None = None, now: float | None = None) -> list[dict]:
    """Every step with a heartbeat file, oldest first, with `heartbeat_age_s`, `progress_age_s` and `stale`.

    Files of processes that died on this host (killed, so they could not remove their file) are left out.
    """
    timeout, now = timeout_seconds() if timeout is None else timeout, time.time() if now is None else now
    steps, host = [], socket.gethostname()
    for path in sorted((root / HEARTBEATS).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # removed or replaced while listing
            continue
        if record.get("host") == host and not _alive(int(record["pid"])):
            continue
        beat_age, progress_age = now - record["time"], now - record["progress"]
        steps.append({**record, "heartbeat_age_s": round(beat_age, 3), "progress_age_s": round(progress_age, 3),
                      "stale": max(beat_age, progress_age) > timeout})
    return sorted(steps, key=lambda step: step["started"])


def step_durations(root: Path) -> dict[tuple[str, int | None], dict]:
    """The last finished run of each (stage, round) of rank 0, from `.rl_assets/steps.jsonl`."""
    log, last = root / HEARTBEATS.parent / STEPS_LOG, {}
    if log.is_file():
        for line in log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut by a full disk
                continue
            if record.get("rank", 0) == 0:
                last[(record["stage"], record["round"])] = record
    return last


def main(argv: list[str] | None = None) -> int:
    """`python -m rl_assets.run.heartbeat [--this-host] [--timeout S] [ROOT]`: the running steps as JSON; exit 1 when one is stale.

    A step pod's exec liveness probe (`--this-host`: only the steps of this pod), so the kubelet restarts a step that hangs.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rl_assets.run.heartbeat", description=main.__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=".")
    parser.add_argument("--timeout", type=float, default=None, help=f"seconds (default $RL_ASSETS_HEARTBEAT_TIMEOUT or {DEFAULT_TIMEOUT:.0f})")
    parser.add_argument("--this-host", action="store_true", help="only steps running on this host")
    args = parser.parse_args(argv)
    steps = running_steps(Path(args.root), args.timeout)
    if args.this_host:
        steps = [step for step in steps if step["host"] == socket.gethostname()]
    print(json.dumps(steps, indent=2))
    return 1 if any(step["stale"] for step in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
