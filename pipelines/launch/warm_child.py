"""A compute child started before its step, so that its imports are off the run's path.

A compute child spends 3-4 s importing torch, transformers and TRL before it writes anything. A CLI run
whose selection needs a compute step starts one child up front (`WarmChild`): it imports those modules
while Dagster creates the run and the raw_data and prompts steps run, then waits. The compute step hands
it its command (`take`), which it runs as `python -m pipelines.launch.pipes_child` would, with the step's stdin,
stdout, stderr, working directory and environment; the step waits on it as on a child of its own.

Only a plain one-process child command is handed over (no torchrun or accelerate launcher), only once
(a retry or a second child starts fresh), and only when the step's environment differs from the one the
child imported under in nothing but the Pipes session's and the step's own variables: anything else
(a variable read at import time) starts a fresh child, as does a warm child that is gone or not there.
The CLI is its parent: it writes the child's exit status where the step reads it, and kills a child that
was never used, or outlived its run, when the run ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipelines.launch.pipes_child import ERROR_DIR_ENV

WARM_CHILD_ENV = "RL_ASSETS_WARM_CHILD"  # the warm child's folder: its socket and, once it has exited, its exit status
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
        listener.listen(1)  # bound before the child starts: a step that comes early waits in the backlog, never refused
        with listener:
            command = [sys.executable, "-m", "pipelines.launch.warm_child", str(listener.fileno()), str(os.getpid())]
            self.process = subprocess.Popen(command, pass_fds=[listener.fileno()], env={**os.environ, **CHILD_ENV}, stdin=subprocess.DEVNULL)
        self.reaper = threading.Thread(target=self._reap, daemon=True)
        self.reaper.start()
        os.environ[WARM_CHILD_ENV] = str(self.folder)  # before the forkserver starts: the steps forked from it inherit it

    def _reap(self) -> None:
        returncode = self.process.wait()
        partial = self.folder / "returncode.partial"
        with contextlib.suppress(OSError):  # the folder is gone only after close(), which joins this thread first
            partial.write_text(str(returncode))
            partial.rename(self.folder / "returncode")

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
    """The step's handle on the warm child running its command: what run_child uses of a `subprocess.Popen`."""

    def __init__(self, pid: int, folder: Path) -> None:
        self.pid, self.status, self.returncode = pid, folder / "returncode", None

    def poll(self) -> int | None:
        if self.returncode is None and self.status.is_file():
            self.returncode = int(self.status.read_text())
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


def take(command: list[str], cwd: str | None, env: dict[str, str]) -> tuple[HandedOver | None, str]:
    """Hand `command` to this run's warm child: (its handle, '') or (None, why not) when a fresh child must start."""
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
    except (OSError, ValueError) as error:  # gone (used by an earlier child, or died), or too slow
        return None, f"the warm child did not answer ({error})"
    if "pid" not in reply:
        return None, reply.get("refused", "the warm child closed the connection")
    return HandedOver(reply["pid"], Path(folder)), ""


def serve(listener: socket.socket, parent: int) -> int:
    """The child's side: import what a compute child imports, take one command, run it as pipes_child's `main`."""
    started_with = dict(os.environ)
    try:
        connection, fds, request = _wait_for_command(listener, parent)
    except KeyboardInterrupt:  # Ctrl-C reaches the CLI's process group before any command came: nothing to say
        return 130
    if connection is None:
        return 0
    # Compared with the environment it imported under. A variable that the imports set (torch's inductor cache folder,
    # which the step's own imports set too) is no difference when they set it to the step's value.
    differ = sorted(name for name in set(started_with) | set(request["env"]) if started_with.get(name) != request["env"].get(name))
    if unexpected := [name for name in differ if name not in PER_STEP and os.environ.get(name) != request["env"].get(name)]:
        connection.sendall(json.dumps({"refused": f"the step's environment differs in {', '.join(unexpected)}"}).encode() + b"\n")
        return 0
    connection.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    connection.close()
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


def _wait_for_command(listener: socket.socket, parent: int):
    """Import, then wait for the step: (connection, its stdin/stdout/stderr, the request), or Nones when the CLI is gone."""
    import dagster_pipes  # noqa: F401  - pipes_child.run's imports, in its order
    import rl_assets.run.step  # noqa: F401
    import rl_assets.run.process  # noqa: F401
    import rl_assets.run.resident  # noqa: F401  - torch, transformers, TRL

    listener.settimeout(1.0)
    while True:
        try:
            connection, _ = listener.accept()
            break
        except TimeoutError:
            if os.getppid() != parent:  # the CLI is gone: nobody will hand over a command
                return None, None, None
    listener.close()
    connection.settimeout(None)
    _, fds, _, _ = socket.recv_fds(connection, 1, 3)
    return connection, fds, json.loads(connection.makefile("rb").readline())


if __name__ == "__main__":
    from pipelines.launch.pipes_child import leave

    leave(serve(socket.socket(fileno=int(sys.argv[1])), parent=int(sys.argv[2])))
