"""A sandbox for untrusted programs: bubblewrap (`bwrap`, the sandbox Flatpak uses), the same whether we are root or not.

Each run gets:
- new user, PID, network, IPC, UTS, mount and cgroup namespaces (`--unshare-all`), no further user
  namespaces inside (`--disable-userns`), no capabilities, `no_new_privs`, and a new session;
- a seccomp filter (x86_64 and aarch64) that refuses, with EPERM, the system calls no test program
  needs and that widen the kernel's attack surface: io_uring, perf events, bpf, userfaultfd, keyrings,
  ptrace and other processes' memory, file handles, namespaces, mounts, modules, kexec, swap, reboot;
- a filesystem of its own: `/usr` (and the `/bin`, `/lib` links) read-only and `nosuid`, a fresh
  `/proc` and `/dev`, size-limited private tmpfs on the working directory `/sandbox`, `/tmp` and
  `/dev/shm`, and everything else read-only and empty. Nothing of the project, the home directory,
  `/etc` (but `ld.so.cache`), `/run` or `/var` is there; the run's files arrive through memfds;
- no network: only a loopback interface of its own, and no Unix socket of the host (abstract ones
  included) is reachable;
- rlimits set inside the sandbox by `prlimit`: CPU seconds, address space, processes (counted in the
  run's own user namespace, so a fork bomb hits its own limit, root or not), file size, open files,
  no core dumps; and a wall-clock timeout after which the run is killed. The program is its PID
  namespace's init, so when it ends, however it ends, everything it started ends with it.

As root, `setpriv` first drops to a uid of its own for the run (no other process has it), so bwrap
runs unprivileged exactly as it does for an ordinary user. `require_sandbox()` raises
`SandboxUnavailable`, naming what is missing, when bwrap, prlimit, setpriv or a system python3 is
absent or the kernel refuses the namespaces; nothing is ever run unsandboxed instead.

Not covered: a kernel bug reachable through the system calls left to an unprivileged process;
other architectures than x86_64 and aarch64 get no seccomp filter; the program may use all the CPU,
memory and time its limits allow (with `workers` runs at once); it can see the host's kernel
version, CPU model and count, and the contents of `/usr`.

Standard library only: tests/rl_assets/core/test_sandbox_hostile.py runs it as an unprivileged user under
the system's python3, outside the project's environment.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import platform
import random
import shutil
import signal
import struct
import subprocess
import time
from dataclasses import asdict, dataclass

PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")  # under /usr, so visible inside the sandbox
PRLIMIT = "/usr/bin/prlimit"
WORKDIR = "/sandbox"  # the program's working directory (and HOME) inside the sandbox
OUTPUT_LIMIT = 1 << 20  # bytes of stdout/stderr read back
SANDBOX_UIDS = (1 << 30, 1 << 31)  # as root, each run gets a uid drawn from here
INSIDE_UID = 1000  # the uid (and gid) the program sees, whoever runs the sandbox

# Refused by the seccomp filter: name -> (x86_64, aarch64) number, from asm/unistd_64.h and asm-generic/unistd.h.
# Docker's and Flatpak's default profiles refuse them too (those that need a capability would fail anyway; listing them costs nothing).
DENIED_SYSCALLS = {
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "perf_event_open": (298, 241),
    "bpf": (321, 280), "userfaultfd": (323, 282), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265), "setns": (308, 268), "unshare": (272, 97), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "fspick": (433, 433), "move_mount": (429, 429), "open_tree": (428, 428), "mount_setattr": (442, 442), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89), "quotactl": (179, 60),
}
AUDIT_ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # machine -> (AUDIT_ARCH_*, column above)


class SandboxUnavailable(RuntimeError):
    """No sandbox can be had on this machine; the message names what is missing."""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 5  # RLIMIT_CPU: a busy loop dies here
    memory_mb: int = 1024  # RLIMIT_AS: address space, so a huge allocation fails inside the program
    wall_seconds: float = 10.0  # a sleeping or blocked program dies here
    max_processes: int = 16  # RLIMIT_NPROC, counted inside the run's own user namespace
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file (or stdout) the program can write
    disk_mb: int = 64  # size of each private tmpfs (/sandbox, /tmp, /dev/shm): a disk filler stops here
    open_files: int = 64  # RLIMIT_NOFILE

    def __post_init__(self):  # a bad limit would fail every run, and so score every program 0 without a word
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int if name != "wall_seconds" else (int, float)) or value <= 0:
                raise ValueError(f"code_execution: {name} must be a positive {'number' if name == 'wall_seconds' else 'integer'}, got {value!r}")


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("rl-assets-sandbox")
    os.write(fd, data)  # a memfd write is complete in one call
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read(fd: int) -> str:
    return os.pread(fd, OUTPUT_LIMIT, 0).decode(errors="replace")


def _python() -> str | None:
    return next((path for path in PYTHONS if os.access(path, os.X_OK)), None)


@functools.lru_cache(maxsize=None)
def seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program refusing DENIED_SYSCALLS with EPERM (None on other architectures).

    It kills a process that makes a system call of another architecture (i386 calls from x86_64, say)
    and refuses x32 calls, so no other syscall table lets a refused call through.
    """
    if platform.machine() not in AUDIT_ARCHES:
        return None
    audit_arch, column = AUDIT_ARCHES[platform.machine()]
    load, equal, at_least, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K
    allow, refuse, kill = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS
    program = [(load, 0, 0, 4), (equal, 1, 0, audit_arch), (ret, 0, 0, kill), (load, 0, 0, 0)]  # seccomp_data: nr at 0, arch at 4
    if platform.machine() == "x86_64":
        program += [(at_least, 0, 1, 0x40000000), (ret, 0, 0, refuse)]  # __X32_SYSCALL_BIT
    for number in sorted(numbers[column] for numbers in DENIED_SYSCALLS.values()):
        program += [(equal, 0, 1, number), (ret, 0, 0, refuse)]
    program.append((ret, 0, 0, allow))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _command(files: dict[str, int], argv: list[str], limits: Limits, info_fd: int, seccomp_fd: int | None) -> list[str]:
    """The bwrap command line (behind setpriv as root) that runs `argv` with `files` (name -> memfd) in /sandbox."""
    tmpfs = lambda path: ["--size", str(limits.disk_mb << 20), "--tmpfs", path]  # noqa: E731
    # --as-pid-1: the program is its PID namespace's init, so the kernel has killed everything else in it by the time
    # bwrap reaps it. (bwrap's own init outlives bwrap and is left for the host's init to reap, which not every container's does.)
    command = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--die-with-parent", "--new-session",
               "--info-fd", str(info_fd), "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged-/usr links, or the directories themselves
        path = f"/{top}"
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    command += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev",
                *tmpfs("/dev/shm"), *tmpfs("/tmp"), *tmpfs(WORKDIR)]
    for name, fd in files.items():
        command += ["--file", str(fd), f"{WORKDIR}/{name}"]
    command += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    for key, value in (("PATH", "/usr/local/bin:/usr/bin:/bin"), ("HOME", WORKDIR), ("TMPDIR", "/tmp"), ("LANG", "C.UTF-8")):
        command += ["--setenv", key, value]
    mb = 1 << 20
    command += ["--", PRLIMIT, f"--cpu={limits.cpu_seconds}", f"--as={limits.memory_mb * mb}", f"--nproc={limits.max_processes}",
                f"--fsize={limits.file_size_mb * mb}", f"--nofile={limits.open_files}", "--core=0", "--", *argv]
    if os.geteuid() == 0:  # bwrap must run unprivileged: as root it would keep root's uid (and ignore RLIMIT_NPROC)
        uid = random.randrange(*SANDBOX_UIDS)
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--no-new-privs", *command]
    return command


class Sandbox:
    """One program running under bwrap; a context manager that kills everything of the run on exit.

    `files` are written into /sandbox, `stdin` is its standard input, `pass_fds` stay open in it
    (at the same numbers). stdout and stderr go to memfds, bounded by RLIMIT_FSIZE. Call
    `require_sandbox()` first for a clear error where bwrap is missing (without it this fails to start).
    """

    def __init__(self, files: dict[str, str | bytes], argv: list[str], limits: Limits = Limits(), stdin: str | bytes = b"",
                 pass_fds: tuple[int, ...] = ()):
        encode = lambda data: data.encode() if isinstance(data, str) else data  # noqa: E731
        file_fds = {name: _memfd(encode(data)) for name, data in files.items()}
        seccomp_fd = _memfd(seccomp_filter()) if seccomp_filter() is not None else None
        setup_fds = [*file_fds.values(), *([seccomp_fd] if seccomp_fd is not None else [])]  # bwrap reads these while it starts
        self._stdin, self._stdout, self._stderr = _memfd(encode(stdin)), _memfd(b""), _memfd(b"")
        self._info, info_write = os.pipe()
        setup_fds.append(info_write)
        try:
            self.process = subprocess.Popen(_command(file_fds, argv, limits, info_write, seccomp_fd), stdin=self._stdin, stdout=self._stdout,
                                            stderr=self._stderr, pass_fds=(*setup_fds, *pass_fds), start_new_session=True)
        except BaseException:
            self._close()
            raise
        finally:
            for fd in setup_fds:
                os.close(fd)
        self._deadline = time.monotonic() + limits.wall_seconds
        self.timed_out = False

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
        self._close()

    def wait(self) -> int | None:
        """Wait for the program until the wall-clock deadline; None (and `timed_out`) when it is still running."""
        try:
            return self.process.wait(timeout=max(self._deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            return None

    def kill(self) -> None:
        """SIGKILL the program, its PID namespace's init, which takes every process of the run with it; then reap bwrap.

        bwrap reaps that init before it exits, so once this returns nothing of the run is left.
        """
        if self.process.poll() is None:
            child = _child_pid(self._info)
            try:
                os.kill(child, signal.SIGKILL) if child is not None else self.process.kill()  # no init yet: --die-with-parent ends the rest
            except ProcessLookupError:
                pass
        self.process.wait()

    def outcome(self) -> Outcome:
        """The run's result, once it has ended (`wait` then `kill`)."""
        returncode = -signal.SIGKILL if self.timed_out else self.process.returncode
        return Outcome(returncode, _read(self._stdout), _read(self._stderr), self.timed_out)

    def _close(self) -> None:
        for fd in (self._stdin, self._stdout, self._stderr, self._info):
            if fd >= 0:
                os.close(fd)
        self._stdin = self._stdout = self._stderr = self._info = -1


def _child_pid(info_fd: int) -> int | None:
    """The host pid of the PID namespace's init (the program), from bwrap's --info-fd (None if bwrap has not written it)."""
    os.set_blocking(info_fd, False)
    try:
        text = os.read(info_fd, 1 << 16).decode()
    except BlockingIOError:
        return None
    try:
        return int(json.loads(text)["child-pid"])
    except (ValueError, KeyError):
        return None


def run_sandboxed(files: dict[str, str | bytes], argv: list[str], stdin: str | bytes = "", limits: Limits = Limits()) -> Outcome:
    """Write `files` into a fresh /sandbox and run `python3 -I *argv` there under bwrap, confined and bounded."""
    with Sandbox(files, [sandbox_python(), "-I", *argv], limits, stdin) as sandbox:
        sandbox.wait()
        sandbox.kill()
        return sandbox.outcome()


def sandbox_python() -> str:
    """The interpreter that runs programs inside the sandbox: the system's python3 (the project's venv is not visible there)."""
    require_sandbox()
    return _python()


def require_sandbox() -> None:
    """Raise `SandboxUnavailable` naming what is missing, unless sandboxed runs work on this machine (checked once)."""
    problem = _sandbox_problem()
    if problem:
        raise SandboxUnavailable(f"code_execution cannot sandbox untrusted programs, and never runs them bare: {problem}")


@functools.lru_cache(maxsize=None)
def _sandbox_problem() -> str | None:
    install = "apt-get install bubblewrap util-linux python3-minimal, or `make sandbox`"
    if shutil.which("bwrap") is None:
        return f"bubblewrap (bwrap) is not on PATH ({install})"
    if not os.access(PRLIMIT, os.X_OK):
        return f"{PRLIMIT} is missing ({install})"
    if _python() is None:
        return f"no system python3 at {' or '.join(PYTHONS)} to run programs with inside the sandbox ({install})"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return f"setpriv, which drops root before bwrap runs, is not on PATH ({install})"
    try:
        with Sandbox({}, [_python(), "-I", "-c", "pass"], Limits(wall_seconds=60)) as probe:
            probe.wait()
            probe.kill()
            done = probe.outcome()
    except OSError as error:
        return f"bwrap did not run: {error}"
    if done.returncode != 0:
        return (f"bwrap cannot create its namespaces here ({done.stderr.strip() or f'exit status {done.returncode}'}); "
                "unprivileged user namespaces must be allowed (sysctls user.max_user_namespaces, kernel.unprivileged_userns_clone, "
                "kernel.apparmor_restrict_unprivileged_userns; in a container, a seccomp profile that permits unshare/clone)")
    return None
