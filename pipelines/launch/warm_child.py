"""Compute children forked from a process that has already imported torch, transformers and TRL.

A compute child spends seconds importing torch, transformers and TRL before it writes anything (docs/benchmarks.md). A CLI run
whose selection needs a compute step starts one warm child up front (`WarmChild`): it imports those modules
while Dagster creates the run and the raw_data and prompts steps run, then waits. Each compute step hands it
its command (`take`); the warm child forks, and the fork runs it as `python -m pipelines.launch.pipes_child`
would, with the step's stdin, stdout, stderr, working directory and environment, while the warm child waits
for the next step's command. The step waits on the fork as on a child of its own; the warm child writes the
fork's exit status where the step reads it. A run of one op per round and lane (`rollouts.staleness`) starts a
dozen compute children: each starts in a fraction of a second instead of repeating the imports beside the other
lane's work.

The warm child imports only: it starts no thread of its own, runs no torch op (so no OpenMP team exists yet) and
never touches CUDA, so a fork of it is a fresh process as far as they are concerned; the background threads the
imports start (jemalloc's, one of torch's) are not copied into a fork. Only a plain one-process child command is
handed over (no torchrun or accelerate launcher), and only when the step's environment differs from the one the warm child imported under in
nothing but the Pipes session's and the step's own variables: anything else (a variable read at import time)
starts a fresh child, as does a warm child that is gone or not there. The CLI is its parent: it kills it when
the run ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipelines.launch.pipes_child import ERROR_DIR_ENV

WARM_CHILD_ENV = "RL_ASSETS_WARM_CHILD"  # the warm child's folder: its socket and the exit status of each child it forked
CHILD_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}  # every compute child's, the warm one's from the start
PIPES_CHILD = ["-m", "pipelines.launch.pipes_child"]
# What may differ between the warm child's environment and the step's: set per step, and read at run time, not on import.
PER_STEP = {WARM_CHILD_ENV, "DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES", ERROR_DIR_ENV}
ACCEPT_SECONDS = 120.0  # how long a step waits for the warm child to finish its imports and take the command


class WarmChild:
    """The CLI's side: start the child, point the run's steps at it (they inherit the variable), reap it, stop it."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="rl-assets-warm-"))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.folder / "socket"))
        listener.listen(8)  # bound before the child starts: a step that comes early waits in the backlog, never refused
        with listener:
            command = [sys.executable, "-m", "pipelines.launch.warm_child", str(listener.fileno()), str(os.getpid())]
            self.process = subprocess.Popen(command, pass_fds=[listener.fileno()], env={**os.environ, **CHILD_ENV}, stdin=subprocess.DEVNULL)
        self.reaper = threading.Thread(target=self._reap, daemon=True)
        self.reaper.start()
        os.environ[WARM_CHILD_ENV] = str(self.folder)  # before the forkserver starts: the steps forked from it inherit it

    def _reap(self) -> None:
        self.process.wait()

    def close(self) -> None:
        """Stop the child if it still runs (never used, or its step is gone), then remove its folder."""
        os.environ.pop(WARM_CHILD_ENV, None)
        if self.process.poll() is None:
            self.process.kill()
        self.reaper.join()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "WarmChild":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def warm_child_for(params, keys: list | None, log) -> contextlib.AbstractContextManager:
    """A warm child for a run of `keys` when it wants one (`wants_warm_child`) and one can start; else nothing."""
    if not wants_warm_child(params, keys):
        return contextlib.nullcontext()
    try:
        return WarmChild()
    except OSError as error:  # e.g. a TMPDIR too long for a socket's path: the step starts its child itself
        log(f"warning: the compute child starts with its step ({error})")
        return contextlib.nullcontext()


def wants_warm_child(params, keys: list | None) -> bool:
    """Whether a run of `keys` (asset keys; None: every asset) will launch a one-process compute child from a local step."""
    local = params.compute.executor == "multiprocess"  # k8s: each step a pod of its own; slurm: a job: no process to hand over to
    one_process = params.compute.nproc * params.compute.nnodes == 1 and not params.compute.accelerate_config
    computes = keys is None or any(key.path[-1] not in ("raw_data", "prompts") for key in keys)
    return local and one_process and computes


class HandedOver:
    """The step's handle on the fork running its command: what run_child uses of a `subprocess.Popen`."""

    def __init__(self, pid: int, folder: Path, warm: int) -> None:
        self.pid, self.status, self.warm, self.returncode = pid, status_file(folder, pid), warm, None

    def poll(self) -> int | None:
        if self.returncode is None:
            if self.status.is_file():
                self.returncode = int(self.status.read_text())
            elif not alive(self.warm) and not self.status.is_file():  # (read again: it may have come just before the warm child ended)
                # The warm child is gone, so nobody will write the status; the fork ends within a second of it
                # (rl_assets.run.process.exit_with_launcher). Reported as killed, as the warm child was.
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:  # not after it ended: its pid may be another process's by now
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)


def status_file(folder: Path, pid: int) -> Path:
    return folder / f"{pid}.returncode"


def alive(pid: int) -> bool:
    """Whether `pid` runs: not ended, and not a zombie (ended, its parent not having reaped it yet)."""
    if not Path("/proc").is_dir():  # not Linux: a zombie counts as running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def take(command: list[str], cwd: str | None, env: dict[str, str]) -> tuple[HandedOver | None, str]:
    """Hand `command` to this run's warm child: (a handle on the fork that runs it, '') or (None, why not) when a fresh child must start."""
    folder = os.environ.get(WARM_CHILD_ENV)
    if not folder:
        return None, "no warm child in this run"
    if command[:3] != [sys.executable, *PIPES_CHILD]:
        return None, "not a one-process child"
    request = {"argv": command, "cwd": cwd or os.getcwd(), "env": env}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(ACCEPT_SECONDS)
            connection.connect(str(Path(folder) / "socket"))
            socket.send_fds(connection, [b"\n"], [0, 1, 2])
            connection.sendall(json.dumps(request).encode() + b"\n")
            reply = json.loads(connection.makefile("rb").readline() or b"{}")
    except (OSError, ValueError) as error:  # gone (died, or the run is ending), or too slow
        return None, f"the warm child did not answer ({error})"
    if "pid" not in reply:
        return None, reply.get("refused", "the warm child closed the connection")
    return HandedOver(reply["pid"], Path(folder), reply["warm"]), ""


def serve(listener: socket.socket, parent: int) -> int:
    """The warm child's side: import what a compute child imports, then fork a child for each command a step hands over.

    Returns in a fork, with the exit status of the command it ran, or in the warm child once the CLI is gone (0).
    """
    started_with = dict(os.environ)
    folder = Path(listener.getsockname()).parent
    try:
        _import_child_modules()
    except KeyboardInterrupt:  # Ctrl-C reaches the CLI's process group before any command came: nothing to say
        return 130
    signal.signal(signal.SIGCHLD, lambda *_: _reap_forks(folder))
    while True:
        try:
            connection, fds, request = _wait_for_command(listener, parent)
        except KeyboardInterrupt:
            return 130
        if connection is None:
            return 0
        # Compared with the environment it imported under. A variable that the imports set (torch's inductor cache folder,
        # which the step's own imports set too) is no difference when they set it to the step's value.
        differ = sorted(name for name in set(started_with) | set(request["env"]) if started_with.get(name) != request["env"].get(name))
        if unexpected := [name for name in differ if name not in PER_STEP and os.environ.get(name) != request["env"].get(name)]:
            connection.sendall(json.dumps({"refused": f"the step's environment differs in {', '.join(unexpected)}"}).encode() + b"\n")
        elif (pid := os.fork()) == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command's own children are its own to wait for
            listener.close()
            connection.close()
            return _run_command(fds, request, differ)
        else:
            connection.sendall(json.dumps({"pid": pid, "warm": os.getpid()}).encode() + b"\n")
        connection.close()
        for fd in fds:
            os.close(fd)


def _reap_forks(folder: Path) -> None:
    """Write the exit status of every fork that has ended (as `subprocess.Popen.returncode` gives it) where its step reads it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        partial = status_file(folder, pid).with_suffix(".partial")
        with contextlib.suppress(OSError):  # the folder is gone: the run has ended
            partial.write_text(str(os.waitstatus_to_exitcode(status)))
            partial.rename(status_file(folder, pid))


def _run_command(fds: list[int], request: dict, differ: list[str]) -> int:
    """In the fork: take the step's stdin, stdout, stderr, working directory and variables, then run pipes_child's `main`."""
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in enumerate(fds):  # the step's stdin, stdout and stderr, as a child it started would have
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    for name in differ:
        if name in request["env"]:
            os.environ[name] = request["env"][name]
        else:
            del os.environ[name]
    from pipelines.launch import pipes_child

    sys.argv = [pipes_child.__file__, *request["argv"][3:]]
    return pipes_child.main(request["argv"][3:])


def _import_child_modules() -> None:
    import dagster_pipes  # noqa: F401  - pipes_child.run's imports, in its order
    import rl_assets.run.step  # noqa: F401
    import rl_assets.run.process  # noqa: F401
    import rl_assets.run.resident  # noqa: F401  - torch, transformers, TRL


def _wait_for_command(listener: socket.socket, parent: int):
    """Wait for a step: (connection, its stdin/stdout/stderr, the request), or Nones when the CLI is gone."""
    listener.settimeout(1.0)
    while True:
        try:
            connection, _ = listener.accept()
            break
        except TimeoutError:
            if os.getppid() != parent:  # the CLI is gone: nobody will hand over a command
                return None, None, None
    connection.settimeout(None)
    _, fds, _, _ = socket.recv_fds(connection, 1, 3)
    return connection, fds, json.loads(connection.makefile("rb").readline())


if __name__ == "__main__":
    from pipelines.launch.pipes_child import leave

    leave(serve(socket.socket(fileno=int(sys.argv[1])), parent=int(sys.argv[2])))
