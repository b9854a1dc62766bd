"""A compute child whose launcher dies by SIGKILL (torchrun's agent, the step process) exits by itself within a second or
two (rl_assets.run.process.exit_with_launcher); one started by hand, whose shell may be gone, runs on.

Each child is the real entry point, `python -m pipelines.launch.pipes_child`, held where it reads its params: a FIFO that the
test opens for writing and never writes, so the child waits there, alive, for as long as the test wants.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, REPO

pytestmark = pytest.mark.e2e

# A stand-in for the step process: it starts the child and waits for it, as pipelines.launch.steps.run_child does.
PARENT = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
DEADLINE = 120.0  # seconds for the children's imports (torch, transformers) on a busy machine, and for each wait


def child_command(fifo: Path) -> list[str]:
    return [PYTHON, "-m", "pipelines.launch.pipes_child", "r01/checkpoint", "--resolved-params", str(fifo)]


def clean_env(**extra: str) -> dict[str, str]:
    """Nothing of a launcher this test may itself run under (Dagster Pipes, torchrun)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "TORCHELASTIC_", "RL_ASSETS_"))}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def status(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) from /proc, or None once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's end is reaped by init, which in a container may never do it)."""
    return (status(pid) or ("X",))[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    return [int(path.parent.name) for path in Path("/proc").glob("[0-9]*/stat") if (status(int(path.parent.name)) or ("", 0))[1] == pid]


def reading(pid: int, fifo: Path) -> bool:
    """Whether `pid` has `fifo` open: past its imports, waiting for its params."""
    with contextlib.suppress(OSError):
        return any(os.readlink(fd) == str(fifo) for fd in Path(f"/proc/{pid}/fd").iterdir())
    return False


def wait_for(condition, what: str, log: Path) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.1)


def open_writer(fifo: Path, log: Path) -> int:
    """The FIFO's writing end, opened once a child reads it (until then that child waits in open, and a writer is refused)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        assert time.monotonic() < deadline, f"timed out waiting for a child to read {fifo.name}:\n{log.read_text()[-4000:]}"
        time.sleep(0.1)


def exited(pids: list[int], log: Path) -> float:
    """Wait until none of `pids` runs; the seconds it took."""
    started = time.monotonic()
    wait_for(lambda: not any(running(pid) for pid in pids), f"{pids} exited", log)
    return time.monotonic() - started


def kill_all(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_torchrun_workers_exit_when_their_agent_is_killed(tmp_path):
    fifo, log = tmp_path / "params.json", tmp_path / "torchrun.log"
    os.mkfifo(fifo)
    with open(log, "w") as out:
        agent = subprocess.Popen([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *child_command(fifo)[1:]],
                                 cwd=REPO, env=clean_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    writer, workers = None, []
    try:
        writer = open_writer(fifo, log)
        wait_for(lambda: len([pid for pid in children(agent.pid) if reading(pid, fifo)]) == 2, "both ranks wait for their params", log)
        workers = children(agent.pid)
        agent.kill()  # SIGKILL: torchrun's agent cannot stop its workers (each in a session of its own)
        agent.wait(timeout=60)
        took = exited(workers, log)
    finally:
        kill_all(workers)
        agent.kill()
        if writer is not None:
            os.close(writer)
    assert log.read_text().count(f"launcher (pid {agent.pid}) is gone") == 2, log.read_text()[-4000:]
    assert took < 10, f"the ranks ran on for {took:.1f} s"  # a check a second (and a margin for a busy machine)
    print(f"both ranks exited {took:.1f} s after their agent was killed")


def test_a_child_exits_when_its_step_process_is_killed_and_one_started_by_hand_runs_on(tmp_path):
    """The child started by hand is orphaned first, so it has had longer than the launched one for its (absent) watch."""
    fifos, log = {name: tmp_path / f"{name}.json" for name in ("by_hand", "launched")}, tmp_path / "children.log"
    parents, writers, pids = {}, [], []
    try:
        with open(log, "w") as out:
            for name, fifo in fifos.items():
                os.mkfifo(fifo)
                env = clean_env(DAGSTER_PIPES_CONTEXT="x") if name == "launched" else clean_env()  # what Dagster's launch sets
                parents[name] = subprocess.Popen([PYTHON, "-c", PARENT, *child_command(fifo)], cwd=REPO, env=env, stdout=out,
                                                 stderr=subprocess.STDOUT, start_new_session=True)
                writers.append(open_writer(fifo, log))
                [child] = children(parents[name].pid)
                pids.append(child)
                parents[name].kill()
                parents[name].wait(timeout=60)
                if name == "by_hand":
                    orphaned = time.monotonic()
        by_hand, launched = pids
        took = exited([launched], log)
        time.sleep(max(0.0, 3.5 - (time.monotonic() - orphaned)))  # long enough to tell whether it would have exited (a 1 s watch)
        window = time.monotonic() - orphaned
        assert running(by_hand) and status(by_hand)[1] != parents["by_hand"].pid, log.read_text()[-4000:]  # an orphan, running on
    finally:
        kill_all(pids)
        for writer in writers:
            os.close(writer)
    assert f"launcher (pid {parents['launched'].pid}) is gone" in log.read_text() and took < 10, log.read_text()[-4000:]
    print(f"the launched child exited {took:.1f} s after its parent was killed; the one started by hand ran on for {window:.1f} s")
