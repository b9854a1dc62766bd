"""rewards/code_execution.py and rewards/sandbox.py: tests pass and fail as they should, and hostile programs
score 0 while the host stays as it was (no leftover process, no file touched, no connection made)."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from rl_assets.rewards.code_execution import HARNESS, code_execution, extract_program, run_tests
from rl_assets.rewards.sandbox import Limits, run_sandboxed, sandbox_mode

ROOT = os.geteuid() == 0
FAST = Limits(cpu_seconds=2, memory_mb=512, wall_seconds=5)


def sandbox_processes() -> list[int]:
    """Processes running under a sandbox uid (the launcher picks them in [2**30, 2**31))."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            uid_line = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if 1 << 30 <= int(uid_line.split()[1]) < 1 << 31:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("program,tests,expected", [
    ("def f(x):\n    return x * 2\n", ["assert f(2) == 4", "assert f(0) == 0", "assert f(-1) == -2"], 1.0),
    ("def f(x):\n    return x + 2\n", ["assert f(2) == 4", "assert f(0) == 0", "assert f(-1) == -2"], 1 / 3),
    ("def f(x):\n    raise ValueError\n", ["assert f(2) == 4"], 0.0),
    ("syntax error here", ["assert True"], 0.0),
    ("import sys\nsys.exit(0)\n", ["assert False"], 0.0),  # exiting early is not a pass
    ("import os\nos._exit(0)\n", ["assert True"], 0.0),
    ("print('0 0')\nprint('pass')\n", ["assert False"], 0.0),  # printing what a pass looks like is not one
    ("import glob\nfor f in glob.glob('*'):\n    print(open(f).read())\n", ["assert False"], 0.0),  # the nonce is in no file
    ("print(sum(map(int, input().split())))", [{"input": "1 2\n", "output": "3"}, {"input": "5 5", "output": "10\n"}], 1.0),
    ("print(int(input()) + 1)", [{"input": "1", "output": "3"}, {"input": "2", "output": "3"}], 0.5),
    ("print('a  \\nb')", [{"input": "", "output": "a\nb\n\n"}], 1.0),  # trailing whitespace is ignored
    ("def f():\n    return 1\nprint(f())", ["assert f() == 1", {"input": "", "output": "1"}], 1.0),
])
def test_run_tests(program, tests, expected):
    assert run_tests(program, tests, FAST) == pytest.approx(expected)


@pytest.mark.parametrize("completion,program", [
    ("```python\nx = 1\n```", "x = 1\n"),
    ("first\n```py\na = 1\n```\nthen\n```\nb = 2\n```\n", "b = 2\n"),
    ("x = 3", "x = 3"),
])
def test_extract_program(completion, program):
    assert extract_program(completion) == program


def test_code_execution_reads_tests_per_row_and_skips_rows_without():
    completions = ["def sq(x): return x * x", "def sq(x): return x + x", "def sq(x): return x * x"]
    tests = [["assert sq(3) == 9", "assert sq(2) == 4"], ["assert sq(3) == 9", "assert sq(2) == 4"], []]
    assert code_execution(completions, tests=tests, prompt=["p"] * 3) == [1.0, 0.5, None]
    assert code_execution(["x"], prompt=["p"]) == [None]


def test_bad_test_case_shape_is_an_error():
    with pytest.raises(ValueError, match="a test case is a statement or"):
        run_tests("x = 1", [{"stdin": "1"}], FAST)


# --- hostile programs ---------------------------------------------------------------------------


def run_hostile(program: str, limits: Limits = FAST) -> tuple[float, float]:
    started = time.monotonic()
    score = code_execution([program], tests=[["assert DONE"]], cpu_seconds=limits.cpu_seconds, memory_mb=limits.memory_mb,
                           wall_seconds=limits.wall_seconds)[0]
    return score, time.monotonic() - started


def test_sandbox_mode_on_this_machine():
    assert sandbox_mode() == ("namespaces" if ROOT else "audit")


def test_infinite_loop_hits_the_cpu_limit():
    score, seconds = run_hostile("while True:\n    pass\nDONE = True")
    assert score == 0.0 and seconds < FAST.wall_seconds + 3


def test_sleeping_program_hits_the_wall_clock_timeout():
    score, seconds = run_hostile("import time\ntime.sleep(600)\nDONE = True", Limits(cpu_seconds=2, wall_seconds=2))
    assert score == 0.0 and seconds < 8


def test_huge_allocation_fails_inside_the_sandbox():
    score, seconds = run_hostile("x = bytearray(64 * 2**30)\nx[-1] = 1\nDONE = True")
    assert score == 0.0 and seconds < 10


@pytest.mark.skipif(not ROOT, reason="without root the sandbox cannot give the program a uid of its own")
def test_fork_bomb_is_bounded_and_every_process_is_gone_afterwards():
    bomb = ("import os, time\n"
            "for _ in range(200):\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            os.setsid()\n"  # leave the process group: only the uid sweep can find these
            "            time.sleep(600)\n"
            "    except OSError:\n"
            "        pass\n"
            "DONE = len(os.listdir('/proc')) > 1000\n")
    assert sandbox_processes() == []
    score, seconds = run_hostile(bomb, Limits(cpu_seconds=2, wall_seconds=3))
    assert score == 0.0 and seconds < 20
    assert sandbox_processes() == []


def test_fork_bomb_count_is_capped_by_rlimit_nproc():
    program = ("import os, time\nchildren = 0\n"
               "for _ in range(100):\n"
               "    try:\n"
               "        pid = os.fork()\n"
               "    except OSError:\n"
               "        break\n"
               "    if pid == 0:\n"
               "        time.sleep(30)\n"
               "        os._exit(0)\n"
               "    children += 1\n"
               "print('children', children)\n")
    outcome = run_sandboxed({"main.py": program}, ["main.py"], limits=Limits(max_processes=8, wall_seconds=5))
    children = int(outcome.stdout.split()[-1])
    assert children < 8 if ROOT else children < 100
    assert sandbox_processes() == []


@pytest.fixture
def victim():
    """A world-writable folder with a world-writable file, outside any sandbox: file permissions alone would not save it."""
    folder = Path(tempfile.mkdtemp(prefix="rl-assets-victim-"))
    target = folder / "precious.txt"
    target.write_text("keep me")
    folder.chmod(0o777)
    target.chmod(0o666)
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


@pytest.mark.skipif(not ROOT, reason="the read-only mounts need the namespaces mode")
def test_file_deletion_and_writes_outside_the_working_directory_fail(victim):
    marker = f"rl-assets-escape-{os.getpid()}"
    program = (f"import os, shutil\n"
               f"done = 0\n"
               f"for action in (lambda: os.remove({str(victim / 'precious.txt')!r}), lambda: shutil.rmtree({str(victim)!r}),\n"
               f"               lambda: open({str(victim / 'new.txt')!r}, 'w').write('x')):\n"
               f"    try:\n"
               f"        action()\n"
               f"        done += 1\n"
               f"    except OSError:\n"
               f"        pass\n"
               f"for folder in ('/tmp', '/dev/shm', '/var/tmp'):\n"  # allowed, but only into private scratch space
               f"    open(os.path.join(folder, {marker!r}), 'w').write('x')\n"
               f"DONE = done > 0\n")
    score, _ = run_hostile(program)
    assert score == 0.0
    assert (victim / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    for folder in ("/tmp", "/dev/shm", "/var/tmp"):
        assert not Path(folder, marker).exists(), folder


def test_the_working_directory_is_writable_and_removed_afterwards():
    before = set(Path(tempfile.gettempdir()).glob("rl-assets-sandbox-*"))
    assert run_tests("open('scratch.txt', 'w').write('x')\nimport os\n", ["assert open('scratch.txt').read() == 'x'"], FAST) == 1.0
    assert set(Path(tempfile.gettempdir()).glob("rl-assets-sandbox-*")) == before


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    yield server
    server.close()


def connect_program(port: int) -> str:
    return (f"import socket\n"
            f"try:\n"
            f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            f"    s.sendall(b'leak')\n"
            f"    DONE = True\n"
            f"except OSError:\n"
            f"    DONE = False\n")


def assert_no_connection(server):
    with pytest.raises(socket.timeout):
        server.accept()


def test_socket_to_the_host_is_refused(listener):
    score, _ = run_hostile(connect_program(listener.getsockname()[1]))
    assert score == 0.0
    assert_no_connection(listener)


def test_socket_is_refused_in_audit_mode_too(listener):
    program = connect_program(listener.getsockname()[1]) + "print('connected' if DONE else 'refused')\n"
    outcome = run_sandboxed({"solution.py": program, "harness.py": HARNESS}, ["harness.py", "io"], limits=FAST, mode="audit")
    assert outcome.stdout.strip() == "refused", outcome
    assert_no_connection(listener)


@pytest.fixture
def host_unix_socket():
    """A world-writable Unix socket under /run, where host services keep theirs (dbus, databases)."""
    folder = Path(tempfile.mkdtemp(prefix="rl-assets-test-", dir="/run"))
    folder.chmod(0o777)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "service.sock"))
    (folder / "service.sock").chmod(0o777)
    server.listen(4)
    server.settimeout(0.5)
    yield folder / "service.sock", server
    server.close()
    (folder / "service.sock").unlink()
    folder.rmdir()


@pytest.mark.skipif(not ROOT, reason="hiding the host's socket files needs the namespaces mode (and /run needs root)")
def test_no_unix_socket_of_the_host_is_reachable(host_unix_socket):
    path, server = host_unix_socket
    program = ("import os, socket\nreached = []\n"
               f"for top in ('/run', '/var/run', '/tmp', '/var/tmp', '/dev', '/home', '/srv', '/var/lib', {str(path.parent)!r}):\n"
               "    for folder, _, names in os.walk(top):\n"
               "        for name in names:\n"
               "            try:\n"
               "                client = socket.socket(socket.AF_UNIX)\n"
               "                client.settimeout(1)\n"
               "                client.connect(os.path.join(folder, name))\n"
               "                reached.append(os.path.join(folder, name))\n"
               "            except OSError:\n"
               "                pass\n"
               "print(reached)\n")
    outcome = run_sandboxed({"main.py": program}, ["main.py"], limits=Limits(wall_seconds=20, cpu_seconds=10))
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.strip() == "[]"
    assert_no_connection(server)
