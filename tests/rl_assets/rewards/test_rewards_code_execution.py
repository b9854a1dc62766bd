"""rewards/code_execution.py, rewards/judge.py and sandbox.py: tests pass and fail as they should, the
sandbox is what it claims, and without one nothing runs. Hostile programs: test_sandbox_hostile.py."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from rl_assets.rewards.code_execution import code_execution, extract_program, judge_program, run_tests
from rl_assets.core.sandbox import AUDIT_ARCHES, Limits, run_sandboxed

REPO = Path(__file__).resolve().parents[3]
FAST = Limits(cpu_seconds=2, memory_mb=512, wall_seconds=5)
ADD = "def add(a, b):\n    return a + b\n"


@pytest.mark.parametrize("program,tests,expected", [
    ("def f(x):\n    return x * 2\n", ["assert f(2) == 4", "assert f(0) == 0", "assert f(-1) == -2"], 1.0),
    ("def f(x):\n    return x + 2\n", ["assert f(2) == 4", "assert f(0) == 0", "assert f(-1) == -2"], 1 / 3),
    ("def f(x):\n    raise ValueError\n", ["assert f(2) == 4"], 0.0),
    ("syntax error here", ["assert True"], 0.0),  # a program that does not run passes nothing
    ("import sys\nsys.exit(0)\n", ["assert True"], 0.0),
    ("print(sum(map(int, input().split())))", [{"input": "1 2\n", "output": "3"}, {"input": "5 5", "output": "10\n"}], 1.0),
    ("print(int(input()) + 1)", [{"input": "1", "output": "3"}, {"input": "2", "output": "3"}], 0.5),
    ("print('a  \\nb')", [{"input": "", "output": "a\nb\n\n"}], 1.0),  # trailing whitespace is ignored
    ("def f():\n    return 1\nprint(f())", ["assert f() == 1", {"input": "", "output": "1"}], 1.0),
    # call-style cases: the JSON output against the returned value, tuples read as lists
    (ADD, [{"call": "add", "args": [1, 2], "output": 3}, {"call": "add", "args": [1], "kwargs": {"b": 5}, "output": 6}], 1.0),
    ("def pair(a):\n    return (a, [a])\n", [{"call": "pair", "args": [1], "output": [1, [1]]}, {"call": "pair", "args": [1], "output": [1, 1]}], 0.5),
    (ADD, [{"call": "sub", "args": [1, 2], "output": -1}], 0.0),  # a function the program does not define
    # what the judge's handles and plain values must support for ordinary tests to pass
    (ADD, ["def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n\ncheck(add)\n"], 1.0),  # HumanEval
    ("class Solution:\n    def twoSum(self, xs, t):\n        return [0, 1]\n", ["assert Solution().twoSum([2, 7], 9) == [0, 1]"], 1.0),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n"
     "    def pop(self):\n        return self.items.pop()\n    def __len__(self):\n        return len(self.items)\n",
     ["s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2\nassert s.pop() == 2\nassert s.items == [1]"], 1.0),
    ("def sort_in_place(xs):\n    xs.sort()\n", ["xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]"], 1.0),  # mutations come back
    ("def gen(n):\n    yield from range(n)\n", ["assert list(gen(3)) == [0, 1, 2]"], 1.0),
    ("def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n",
     ["try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError", "assert f(2) == 2"], 1.0),
    ("import math\ndef area(r):\n    return math.pi * r * r\n", ["assert math.isclose(area(1), 3.14159, rel_tol=1e-4)"], 1.0),  # math: the judge's own
    ("def f():\n    return (1, 2), {3}, {4: 'x'}, b'y', 2 + 1j, None, float('inf')\n",
     ["assert f() == ((1, 2), {3}, {4: 'x'}, b'y', 2 + 1j, None, float('inf'))"], 1.0),
    ("def big():\n    return 7 ** 9000\n", ["assert big() == 7 ** 9000"], 1.0),  # past Python's 4300-digit str limit
    ("LIMIT = 10\n", ["assert LIMIT == 10"], 1.0),  # a plain global is its value
    ("TABLE = list(range(200000))\n", ["assert TABLE[3] == 3 and len(TABLE) == 200000"], 1.0),  # a big one a handle
    ("def f():\n    return list(range(300000))\n", ["assert f()[-1] == 299999"], 1.0),  # a big return value comes whole
    ("def f():\n    return 1\nif __name__ == '__main__':\n    input()\n", ["assert f() == 1"], 1.0),  # a main block does not run for asserts
    ("def write():\n    open('scratch.txt', 'w').write('x')\ndef read():\n    return open('scratch.txt').read()\n",
     ["write()", "assert read() == 'x'"], 1.0),  # the program's working directory is writable and lasts the run
    ("def f(x):\n    return x\n", ["import math", "assert f(math.e) == math.e"], 1.0),  # tests share one namespace
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
    assert code_execution(completions, tests=tests, prompt=["p"] * 3, workers=2) == [1.0, 0.5, None]
    assert code_execution(["x"], prompt=["p"]) == [None]


@pytest.mark.parametrize("test", [{"stdin": "1"}, {"input": 1, "output": "1"}, {"call": "f", "output": 1}, {"call": "f", "args": 1, "output": 1}, 3])
def test_bad_test_case_shape_is_an_error(test):
    with pytest.raises(ValueError, match="a test case is a statement"):
        run_tests("x = 1", [test], FAST)


@pytest.mark.parametrize("options,message", [({"cpu_seconds": 0}, "cpu_seconds must be a positive integer, got 0"),
                                             ({"cpu_seconds": 2.5}, "cpu_seconds must be a positive integer, got 2.5"),
                                             ({"memory_mb": -1}, "memory_mb must be a positive integer"),
                                             ({"wall_seconds": 0}, "wall_seconds must be a positive number")])
def test_bad_limits_are_an_error_not_a_silent_zero(options, message):
    with pytest.raises(ValueError, match=message):
        code_execution([ADD], tests=[["assert add(1, 2) == 3"]], **options)


def test_the_judge_counts_each_test_once_and_keeps_passes_before_a_hang():
    program = "import time\ndef f(x):\n    if x == 2:\n        time.sleep(60)\n    return x\n"
    tests = [{"code": "assert f(1) == 1"}, {"code": "assert f(1) == 1"}, {"code": "assert f(2) == 2"}, {"code": "assert f(3) == 3"}]
    assert judge_program(program, tests, Limits(cpu_seconds=2, wall_seconds=3)) == 2


# --- the sandbox as the program sees it -----------------------------------------------------------

SELF_REPORT = """
import json, os, resource, socket, stat
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
mounts = {line.split()[1]: line.split()[3].split(",") for line in open("/proc/self/mounts")}
names = ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")
limits = {name: resource.getrlimit(getattr(resource, name))[0] for name in names}
cwd_files = sorted(os.listdir("."))
writable = {}
for folder in ("/", "/usr", "/etc", "/dev", "/proc", "/tmp", "/dev/shm", "/sandbox"):
    try:
        open(os.path.join(folder, "probe"), "w").close()
        writable[folder] = True
    except OSError:
        writable[folder] = False
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "no_new_privs": status["NoNewPrivs"].strip(),
                  "cap_eff": status["CapEff"].strip(), "cap_bnd_is_full": status["CapBnd"].strip() == "000001ffffffffff",
                  "seccomp": status["Seccomp"].strip(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                  "interfaces": [name for _, name in socket.if_nameindex()], "root": sorted(os.listdir("/")), "etc": sorted(os.listdir("/etc")),
                  "cwd": os.getcwd(), "cwd_files": cwd_files, "hostname": socket.gethostname(), "env": dict(os.environ),
                  "usr": mounts["/usr"], "limits": limits, "writable": writable, "sid": os.getsid(0)}))
"""


def test_the_sandbox_is_what_the_docstring_says():
    limits = Limits(cpu_seconds=3, memory_mb=700, max_processes=9, file_size_mb=5, open_files=40, wall_seconds=10)
    outcome = run_sandboxed({"main.py": SELF_REPORT}, ["main.py"], limits=limits)
    assert outcome.returncode == 0, outcome.stderr
    seen = json.loads(outcome.stdout)
    assert (seen["uid"], seen["gid"]) == (1000, 1000)  # the same whether we are root or not
    assert seen["no_new_privs"] == "1" and seen["cap_eff"] == "0000000000000000"
    assert seen["seccomp"] == ("2" if platform.machine() in AUDIT_ARCHES else "0")  # 2: a filter is on
    assert seen["pids"] == [1]  # its own PID namespace, of which it is the init
    assert seen["sid"] in seen["pids"]  # --new-session: its session leader is inside (an outside one reads as 0), no terminal of ours
    assert seen["interfaces"] == ["lo"]  # no network but its own loopback
    assert set(seen["root"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sandbox", "sbin", "tmp", "usr"}
    assert seen["etc"] == ["ld.so.cache"]  # no passwd, no hosts, no resolv.conf
    assert seen["cwd"] == "/sandbox" and seen["cwd_files"] == ["main.py"]
    assert seen["hostname"] == "sandbox"
    assert seen["env"] == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PWD": "/sandbox"}
    assert {"ro", "nosuid", "nodev"} <= set(seen["usr"])  # setuid binaries are plain binaries here
    assert seen["limits"] == {"RLIMIT_CPU": 3, "RLIMIT_AS": 700 << 20, "RLIMIT_NPROC": 9, "RLIMIT_FSIZE": 5 << 20, "RLIMIT_NOFILE": 40,
                              "RLIMIT_CORE": 0}
    assert seen["writable"] == {"/": False, "/usr": False, "/etc": False, "/dev": False, "/proc": False, "/tmp": True, "/dev/shm": True,
                                "/sandbox": True}


def test_a_run_leaves_nothing_behind_on_the_host():
    name = f"rl-assets-left-behind-{os.getpid()}"
    program = f"for folder in ('/tmp', '/sandbox', '/dev/shm'):\n    open(folder + '/{name}', 'w').write('x')\n"
    assert run_sandboxed({"main.py": program}, ["main.py"], limits=FAST).returncode == 0
    assert [folder for folder in ("/tmp", "/dev/shm", "/sandbox") if Path(folder, name).exists()] == []


# --- no sandbox, no run -------------------------------------------------------------------------------

NO_SANDBOX_SCRIPT = """
import json, sys
from rl_assets.rewards.code_execution import code_execution
from rl_assets.core.sandbox import SandboxUnavailable
print(json.dumps(code_execution(["x"], tests=[None])))  # nothing to run: no sandbox needed
try:
    code_execution(["open({marker!r}, 'w').write('ran')\\nDONE = True"], tests=[["assert DONE"]])
except SandboxUnavailable as error:
    print(error)
"""


@pytest.fixture
def bin_dir():
    """A PATH folder that the uid setpriv drops to can read too (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="rl-assets-bin-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def run_without_sandbox(tmp_path: Path, bin_dir: Path, fake_bwrap: str | None) -> tuple[str, Path]:
    """Run code_execution with a PATH that lacks bwrap (or has a fake one); the program would leave a marker if it ran."""
    (bin_dir / "setpriv").symlink_to(shutil.which("setpriv"))
    if fake_bwrap is not None:
        (bin_dir / "bwrap").write_text(fake_bwrap)
        (bin_dir / "bwrap").chmod(0o755)
    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-c", NO_SANDBOX_SCRIPT.format(marker=str(marker))], capture_output=True, text=True,
                          env={"PATH": str(bin_dir)}, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, marker


def test_without_bwrap_the_reward_refuses_to_run_and_says_what_to_install(tmp_path, bin_dir):
    output, marker = run_without_sandbox(tmp_path, bin_dir, None)
    first, second = output.strip().splitlines()
    assert first == "[null]"
    assert "never runs them bare" in second and "bubblewrap (bwrap) is not on PATH" in second and "apt-get install bubblewrap" in second
    assert not marker.exists()


def test_when_bwrap_cannot_create_namespaces_the_reward_says_so(tmp_path, bin_dir):
    refusing = ("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
                "non-privileged user namespaces.' >&2\nexit 1\n")  # what bwrap says where they are off
    output, marker = run_without_sandbox(tmp_path, bin_dir, refusing)
    assert "bwrap cannot create its namespaces here (bwrap: No permissions to creating new namespace" in output
    assert "unprivileged user namespaces must be allowed" in output
    assert not marker.exists()


def test_the_reward_modules_need_only_the_standard_library():
    """The unprivileged runs in test_sandbox_hostile.py load them under the system's python3."""
    code = textwrap.dedent("""
        import sys, types
        for name, path in (("rl_assets", "rl_assets"), ("rl_assets.rewards", "rl_assets/rewards")):
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
        import rl_assets.rewards.code_execution, rl_assets.rewards.judge
        print(sorted(m for m in sys.modules if m.split(".")[0] in {"pyarrow", "pydantic", "torch", "yaml", "numpy"}))
    """)
    done = subprocess.run(["/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
