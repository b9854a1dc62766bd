"""A sandbox for untrusted code: one child process, bounded, cut off from the network and the host's files.

`run_sandboxed` starts this file as a launcher (`python -I sandbox.py CONFIG`), which confines itself
and then execs `python -I` on the harness. What confines it:

- always: a fresh temporary working directory (removed afterwards), a minimal environment,
  `python -I`, rlimits on CPU seconds, address space, file size, open files and processes, and a
  wall-clock timeout after which the whole process group is killed;
- as root (containers): a uid of its own, so RLIMIT_NPROC (which root ignores) bounds a fork bomb
  and the cleanup can kill every process of that uid, even ones that left the process group; plus
  new network, mount and PID namespaces: no network interface up, every mount read-only except the
  working directory, fresh private tmpfs over /tmp, /var/tmp, /dev/shm and /run, and a PID namespace whose
  end takes every process (and zombie) of the run with it. Mode "namespaces";
- otherwise, or where the kernel refuses namespaces: an audit hook in the harness refuses to create
  sockets, and file permissions alone keep writes out of other directories. Mode "audit".

`sandbox_mode()` says which mode this machine gets. Not covered: a world-writable Unix socket file
outside the covered directories (the network namespace does not cut path sockets); and a program
that deliberately inspects its own interpreter can forge a test pass: the sandbox protects the
host, not the reward.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # /run: also hides the host's Unix sockets (dbus, databases)
INSIDE_WORKDIR = "/tmp/sandbox"  # where the program sees its working directory in mode "namespaces"
OUTPUT_LIMIT = 1 << 20  # bytes of stdout/stderr read back


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 5  # RLIMIT_CPU: a busy loop dies here
    memory_mb: int = 1024  # RLIMIT_AS: address space, so a huge allocation fails inside the child
    wall_seconds: float = 10.0  # a sleeping or blocked program dies here
    max_processes: int = 16  # RLIMIT_NPROC for the sandbox uid
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file (or stdout) the program can write
    open_files: int = 64  # RLIMIT_NOFILE


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def run_sandboxed(files: dict[str, str], argv: list[str], stdin: str = "", limits: Limits = Limits(), mode: str | None = None) -> Outcome:
    """Write `files` into a fresh working directory and run `python -I *argv` there, confined."""
    mode = mode or sandbox_mode()
    uid = random.randrange(1 << 30, 1 << 31) if os.geteuid() == 0 else None  # no other process has this uid
    workdir = Path(tempfile.mkdtemp(prefix="rl-assets-sandbox-"))
    outputs = Path(tempfile.mkdtemp(prefix="rl-assets-sandbox-io-"))  # stdin/stdout/stderr files, out of the program's reach
    try:
        for name, text in files.items():
            (workdir / name).write_text(text)
        (outputs / "stdin").write_text(stdin)  # not in the workdir: the harness's nonce arrives on stdin
        if uid is not None:
            for path in [workdir, *workdir.iterdir()]:
                os.chown(path, uid, uid)
        python = sys.executable if uid is None else sandbox_python()
        config = {"limits": asdict(limits), "uid": uid, "mode": mode, "workdir": str(workdir), "argv": [python, "-I", *argv]}
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir), "TMPDIR": "/tmp"}
        with open(outputs / "stdin", "rb") as stdin_file, open(outputs / "out", "wb") as out, open(outputs / "err", "wb") as err:
            process = subprocess.Popen([sys.executable, "-I", __file__, json.dumps(config)], cwd=workdir, env=env, stdin=stdin_file,
                                       stdout=out, stderr=err, start_new_session=True)
            timed_out = False
            try:
                process.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_all(process, uid)
        read = lambda name: (outputs / name).open("rb").read(OUTPUT_LIMIT).decode(errors="replace")  # noqa: E731
        return Outcome(process.returncode, read("out"), read("err"), timed_out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(outputs, ignore_errors=True)


def _kill_all(process: subprocess.Popen, uid: int | None) -> None:
    """SIGKILL every process of the sandbox uid, then the process group, and reap the launcher.

    The uid goes first: in mode "namespaces" that kills the PID namespace's init (and so the rest)
    while the launcher still lives to reap it; killed together, the init would be left a zombie.
    """
    deadline = time.monotonic() + 10
    while uid is not None and time.monotonic() < deadline:
        pids = _pids_of(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _pids_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
            if uid_line.split()[1:2] == [str(uid)] and "State:\tZ" not in status:
                pids.append(int(entry.name))
    return pids


def _executable_by_anyone(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return real.is_file() and all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents])


@functools.lru_cache(maxsize=None)
def sandbox_python() -> str:
    """The interpreter a dropped uid runs programs with: ours if anyone may execute it, else the system's python3.

    (A virtual environment under /root, as in many containers, is out of reach of another uid.)
    """
    for candidate in (sys.executable, "/usr/bin/python3", "/bin/python3"):
        if _executable_by_anyone(candidate):
            return candidate
    raise RuntimeError("no Python interpreter that an unprivileged uid may execute (tried our own and /usr/bin/python3)")


@functools.lru_cache(maxsize=None)
def sandbox_mode() -> str:
    """'namespaces' when this machine lets the launcher isolate network and mounts, else 'audit'."""
    if os.geteuid() != 0:
        return "audit"
    probe = run_sandboxed({}, ["-c", "pass"], limits=Limits(wall_seconds=30), mode="namespaces")
    return "namespaces" if probe.returncode == 0 else "audit"


# --- the launcher: runs in the child, confines itself, then execs the harness ---------------------


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _isolate(workdir: str) -> None:
    """New network, mount and PID namespaces; every mount read-only but the working directory; private scratch tmpfs.

    The PID namespace takes effect for the next child, which becomes its init: when it dies the
    kernel kills and reaps everything left in it, so not even a zombie outlives a run.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    mount = lambda source, target, kind, flags, data=None: libc.mount(source, target, kind, flags, data)  # noqa: E731
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
    _check(mount(None, b"/", None, MS_REC | MS_PRIVATE), "make mounts private")  # first: nothing may propagate to the host
    _check(mount(workdir.encode(), workdir.encode(), None, MS_BIND), "bind the working directory")
    os.chdir(workdir)  # onto the bind mount, which stays writable (the cwd keeps it even once /tmp is covered)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        target = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
        if target == workdir:
            continue
        kept = sum(flag for name, flag in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)) if name in fields[5].split(","))
        _check(mount(None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept), f"read-only {target}")
    for scratch in SCRATCH_DIRS:
        if os.path.isdir(scratch):
            _check(mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64m,mode=1777"), f"tmpfs on {scratch}")
    # The tmpfs may now hide the working directory's path, and Python opens its script by absolute
    # path: show the directory (still our cwd) at a fixed place inside the new /tmp.
    os.makedirs(INSIDE_WORKDIR)
    _check(mount(b".", INSIDE_WORKDIR.encode(), None, MS_BIND), "bind the working directory inside")
    os.chdir(INSIDE_WORKDIR)


def _launch(config: dict) -> None:
    limits, uid = config["limits"], config["uid"]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": config["workdir"], "TMPDIR": "/tmp"}
    if config["mode"] == "namespaces":
        _isolate(config["workdir"])
        env["HOME"] = INSIDE_WORKDIR
        child = os.fork()  # the init of the new PID namespace
        if child:
            sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) % 256)
        libc = ctypes.CDLL(None, use_errno=True)
        _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")  # only its own processes
    else:
        env["RL_ASSETS_SANDBOX_BLOCK_NETWORK"] = "1"  # the harness installs the socket-refusing audit hook
    processes = limits["max_processes"]
    if uid is None:  # RLIMIT_NPROC counts all of this user's processes: leave room above the current count
        processes += len(_pids_of(os.getuid()))
    for name, value in (("RLIMIT_CPU", limits["cpu_seconds"]), ("RLIMIT_AS", limits["memory_mb"] << 20), ("RLIMIT_NPROC", processes),
                        ("RLIMIT_FSIZE", limits["file_size_mb"] << 20), ("RLIMIT_NOFILE", limits["open_files"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.execve(config["argv"][0], config["argv"], env)


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))
