"""A compute child, and the CLI, end without Python's teardown (pipelines.launch.pipes_child.leave), and loses nothing on the way out."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

# A process that leaves work to shutdown: a non-daemon thread still writing, an atexit handler, a weakref finalizer,
# a thread pool nobody shut down, and unflushed text on stdout and stderr (both pipes, so block-buffered); and an object
# only the interpreter's teardown would free, which must not be.
CHILD = """
import atexit, sys, threading, time, weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from pipelines.launch.pipes_child import leave

out = Path(sys.argv[1])
def late_writer():
    time.sleep(0.3)
    (out / "thread").write_text("joined")
threading.Thread(target=late_writer).start()
pool = ThreadPoolExecutor(2)
pool.submit(time.sleep, 0.1)  # never shut down, still referenced: its idle workers must not hold the exit
atexit.register(lambda: (out / "atexit").write_text("ran"))
class Engine: pass
engine = Engine()
weakref.finalize(engine, lambda: (out / "finalizer").write_text("ran"))
class Teardown:  # what the interpreter's teardown would run, which leave skips
    def __init__(self, path): self.path = str(path)
    def __del__(self): open(self.path, "w").write("ran")
held = Teardown(out / "teardown")
sys.stdout.write("buffered out"); sys.stderr.write("buffered err")
leave(7)
(out / "after").write_text("leave returned")
"""


def test_leave_keeps_what_shutdown_would_have_done_and_exits_with_the_code(tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert (done.stdout, done.stderr) == ("buffered out", "buffered err")
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == {"thread": "joined", "atexit": "ran", "finalizer": "ran"}


def test_the_child_modules_leave_through_it():
    """Both ways a compute child starts end in `leave` (a fresh `python -m pipelines.launch.pipes_child`, or the warm child)."""
    for module in ("pipes_child", "warm_child"):
        tail = (REPO / "pipelines" / "launch" / f"{module}.py").read_text().split('if __name__ == "__main__":', 1)[1]
        assert "leave(" in tail and "sys.exit(" not in tail, module


def test_the_cli_exits_with_its_commands_code_and_all_it_printed(tmp_path):
    """`python -m pipelines` leaves through it too: an argparse error keeps its code 2, a refused command its own."""
    bad = subprocess.run([sys.executable, "-m", "pipelines", "no-such-command"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    (tmp_path / "params.yaml").write_text("rounds: [\n")  # a params file that does not parse: refused before any run
    refused = subprocess.run([sys.executable, "-m", "pipelines", "dvc-sync", "--check"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert refused.returncode == 2 and refused.stderr.startswith("error:") and "params.yaml" in refused.stderr


def test_a_process_that_only_imports_it_ends_as_python_would(tmp_path):
    """Importing the module (a test, the code location) changes nothing: the exit handler acts only after `leave`."""
    code = "import atexit, sys\nimport pipelines.launch.pipes_child\natexit.register(print, 'handler ran')\nsys.exit(3)\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (3, "handler ran\n"), done.stderr
