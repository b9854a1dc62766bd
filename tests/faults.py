"""Faults for a 2-round micro run: a kill at a chosen moment, then a rerun, compared with an uninterrupted run.

Two ways to pick the moment, each with two signals (SIGKILL of the run's process group, as a dead machine
or the OOM killer; SIGTERM of the CLI, as Ctrl-C, `kill` or a scheduler's stop):
  after:KEY   the moment the CLI logs "materialized KEY" (the compute child may already be past it)
  reward:N    the N-th call of a reward function of the run, inside a stage: rewards of a round, and every
              checkpoint's held-out evaluation, which runs after the checkpoint and its carried moments are
              saved and before it is reported; the reward sends the signal itself
  hold:N      the same call, but the reward waits there and the signal comes once everything before it has
              been reported (the run's log has been quiet for a while): a stop between two reports

`tests/pipelines/test_fault_matrix.py` runs a few of these in `make test`; `bench/fault_matrix.py` all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import PYTHON, copy_project, project_env, python
from rl_assets.core.checkpoints import checkpoint_id

ROUNDS = 2
RUN = ["-m", "pipelines", "run", "--set", f"rounds={ROUNDS}"]
CHECKPOINTS = [f"r{n:02d}/checkpoint" for n in range(ROUNDS + 1)]
OUTPUTS = ["raw_data", "prompts", "r00/checkpoint",
           *(key for n in range(1, ROUNDS + 1) for key in (f"r{n:02d}/rollouts", f"r{n:02d}/rewards", f"r{n:02d}/checkpoint")),
           "evaluation", "promoted_model"]
SIGNALS = {"kill-group": signal.SIGKILL, "term-cli": signal.SIGTERM}

# A reward of weight 0 that counts its calls in a file and, at the N-th, sends the signal the test asks for (or holds).
FAULT_REWARD_MODULE = '''"""Sends FAULT_SIGNAL at the FAULT_AT-th call, or holds there (tests/faults.py); scores 0 otherwise."""
import os
import signal
import time
from pathlib import Path


def fault(completions, **kwargs):
    counter = Path(os.environ.get("FAULT_COUNTER", "fault_calls"))
    calls = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    if os.environ.get("FAULT_HOLD") == str(calls):
        counter.with_suffix(".held").touch()
        time.sleep(600)
    if os.environ.get("FAULT_AT") == str(calls):
        how = os.environ["FAULT_SIGNAL"]
        if how == "kill-group":
            os.killpg(os.getpgid(0), signal.SIGKILL)
        else:  # the CLI leads the run's session
            os.kill(os.getsid(0), signal.SIGTERM)
    return [0.0] * len(completions)
'''


def fault_project(micro_template: Path, destination: Path) -> Path:
    """A copy of the micro project whose rewards include the fault reward (weight 0: the scores are those without it)."""
    import yaml

    project = copy_project(micro_template, destination)
    (project / "micro_faults.py").write_text(FAULT_REWARD_MODULE)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rewards"]["functions"].append({"name": "micro_faults:fault", "weight": 0.0})
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return project


def checkpoint_ids(project: Path) -> dict[str, str]:
    return {key: checkpoint_id(project / "data" / key) for key in CHECKPOINTS}


def uninterrupted(project: Path) -> tuple[dict[str, str], int]:
    """Run the whole pipeline once: (its checkpoint ids, how many reward calls it made)."""
    python(RUN, project, timeout=900)
    calls = int((project / "fault_calls").read_text())
    (project / "fault_calls").unlink()
    return checkpoint_ids(project), calls


def interrupted(project: Path, fault: str, how: str, timeout: float = 600, quiet: float = 2.0) -> tuple[int, str]:
    """Start a run, stop it with `how` at `fault` (after:KEY, reward:N or hold:N), wait for it: (its exit code, its stderr)."""
    env = project_env(project, FAULT_COUNTER=str(project / "fault_calls"))
    kind, _, where = fault.partition(":")
    if kind == "reward":
        env.update(FAULT_AT=where, FAULT_SIGNAL=how)
    elif kind == "hold":
        env.update(FAULT_HOLD=where)
    log, held = project / "interrupted.log", project / "fault_calls.held"
    with open(log, "w") as stderr:
        process = subprocess.Popen([PYTHON, *RUN], cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                                   start_new_session=True)
        deadline = time.monotonic() + timeout

        def wait_for(condition, what: str) -> None:
            while not condition():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the run ended (or timed out) before {what}:\n{log.read_text()[-3000:]}")
                time.sleep(0.02)

        if kind == "after":
            wait_for(lambda: f"materialized {where}:" in log.read_text() or f"materialized {where}\n" in log.read_text(),
                     f"{where} was materialized")
        elif kind == "hold":
            wait_for(held.exists, f"reward call {where}")
            sizes = []  # then until the log has not grown for `quiet` seconds: what was done before the hold is reported
            wait_for(lambda: sizes.append(log.stat().st_size) or len(sizes) > quiet / 0.02 and len(set(sizes[-int(quiet / 0.02):])) == 1,
                     "the log went quiet")
        if kind != "reward":
            if how == "kill-group":
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=timeout)
    held.unlink(missing_ok=True)
    if how == "kill-group":
        _reap_group(process.pid)
    return code, log.read_text()


def kill_group_when(process: subprocess.Popen, condition, timeout: float = 600, workers_too: bool = False) -> None:
    """Wait until `condition()` holds (or the process ends, or `timeout`), then SIGKILL the process's group, as a dead machine.

    `workers_too`: first its children, which torchrun starts in sessions of their own (outside the group).
    """
    deadline = time.monotonic() + timeout
    while not condition() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if workers_too:
        for worker in subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(worker), signal.SIGKILL)
    os.killpg(process.pid, signal.SIGKILL)


def _reap_group(pgid: int) -> None:
    """What the kill left of the group (a grandchild that escaped into its own group is not ours to find) is gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def resumed(project: Path) -> subprocess.CompletedProcess:
    """The rerun, without a fault."""
    (project / "fault_calls").unlink(missing_ok=True)
    return python(RUN, project, timeout=900, FAULT_COUNTER=str(project / "fault_calls"))
