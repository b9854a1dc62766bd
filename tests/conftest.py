"""Shared fixtures: a micro copy of the project in a temp dir, and helpers to run commands in it.

The micro project holds copies of rl_assets/, pipelines/, data/raw/ and the Dagster/DVC/git config,
tests/micro_params.yaml as its params.yaml, `.venv` (and `.venv-dvc`, when present) linked to the
repo's environments so DVC stage commands work, a git repo (DVC needs one) and a dvc.yaml made by
`python -m pipelines dvc-sync`. Tests that change files work on a copy (`copy_project`); the
session-scoped projects are only read.

Every command runs with a timeout, with cwd = the project and DAGSTER_HOME inside it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
DVC = REPO / ".venv-dvc" / "bin" / "dvc"
NO_DVC_REASON = f"DVC is not installed at {DVC} (`make setup` installs it in .venv-dvc)"

# tests/micro_params.yaml alone gives every rollout reward 0 (a 5-step SFT of a 2-layer model never
# answers right), so every GRPO advantage is 0, the update is exactly 0 and r01 == r00 bit for bit:
# nothing about training would be tested. The micro project therefore adds one dense reward
# (share of digits in the completion), a user reward function loaded as 'module:function'.
DENSE_REWARD_MODULE = '''"""A dense reward for the micro test pipeline, so GRPO advantages are not all zero."""


def digit_share(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''
DENSE_REWARD = {"name": "micro_rewards:digit_share", "weight": 0.5}

# Stage names and outputs of the micro pipeline (rounds: 1), in flow order.
MICRO_STAGES = ["raw_data", "prompts", "r00-checkpoint", "r01-rollouts", "r01-rewards", "r01-checkpoint", "evaluation"]
MICRO_OUTPUTS = {
    "raw_data": "data/raw_data.parquet",
    "prompts": "data/prompts.parquet",
    "r00/checkpoint": "data/r00/checkpoint",
    "r01/rollouts": "data/r01/rollouts.parquet",
    "r01/rewards": "data/r01/rewards.parquet",
    "r01/checkpoint": "data/r01/checkpoint",
    "evaluation": "data/evaluation.parquet",
}
TABLES = {"raw_data": "raw_data", "prompts": "prompts", "r01/rollouts": "rollouts", "r01/rewards": "rewards", "evaluation": "evaluation"}


def micro_params() -> dict:
    params = yaml.safe_load((REPO / "tests" / "micro_params.yaml").read_text())
    params["rewards"]["functions"].append(dict(DENSE_REWARD))
    return params


def project_env(project: Path, **extra: str) -> dict[str, str]:
    """os.environ without anything that would steer a run elsewhere, DAGSTER_HOME inside `project`, offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RL_ASSETS_", "DVC_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(project / ".dagster"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def run(args: list[str], project: Path, timeout: float, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    """Run a command in `project` with a timeout; on `check`, a non-zero exit fails with its output."""
    try:
        done = subprocess.run([str(a) for a in args], cwd=project, env=project_env(project, **env), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"timed out after {timeout} s: {' '.join(map(str, args))}\n{error.stdout or ''}\n{error.stderr or ''}")
    if check and done.returncode != 0:
        pytest.fail(f"exit {done.returncode}: {' '.join(map(str, args))}\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}")
    return done


def python(args: list[str], project: Path, timeout: float, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    return run([PYTHON, *args], project, timeout, check, **env)


def dvc(args: list[str], project: Path, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    if not DVC.exists():
        pytest.skip(NO_DVC_REASON)
    return run([DVC, *args], project, timeout, check)


def dvc_status(project) -> dict:
    """`dvc status --json`: {stage: [changes]} for every stage that is not up to date."""
    return json.loads(dvc(["status", "--json"], project, timeout=180).stdout or "{}")


def _ignore(directory: str, names: list[str]) -> set[str]:
    skip = {"__pycache__"}
    if Path(directory).name == ".dvc":
        skip.add("tmp")  # DVC's locks and state; rebuilt on demand
    return skip.intersection(names)


def copy_project(source: Path, destination: Path) -> Path:
    """A full copy (data, DVC cache, Dagster instance, git repo); links stay links."""
    shutil.copytree(source, destination, symlinks=True, ignore=_ignore)
    return destination


def with_params(project: Path, change) -> Path:
    """`project` with its params.yaml edited by `change(params)` (a dict, changed in place) and dvc.yaml made for them."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    change(params)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    return project


def make_micro_project(root: Path) -> Path:
    root.mkdir(parents=True)
    for name in ("rl_assets", "pipelines"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "data" / "raw", root / "data" / "raw")
    for name in ("dagster.yaml", "workspace.yaml", ".dvcignore", ".gitignore", ".dvc/config", ".dvc/.gitignore"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    (root / "params.yaml").write_text(yaml.safe_dump(micro_params(), sort_keys=False))
    (root / "micro_rewards.py").write_text(DENSE_REWARD_MODULE)
    (root / ".venv").symlink_to(REPO / ".venv")
    if DVC.exists():
        (root / ".venv-dvc").symlink_to(REPO / ".venv-dvc")
    # the instance `python -m pipelines` uses; a relative link survives copy_project
    (root / ".dagster").mkdir()
    (root / ".dagster" / "dagster.yaml").symlink_to(Path("..") / "dagster.yaml")
    run(["git", "init", "--quiet"], root, timeout=60)
    python(["-m", "pipelines", "dvc-sync"], root, timeout=180)
    return root


@pytest.fixture(scope="session")
def micro_template(tmp_path_factory) -> Path:
    """The micro project before anything ran (no outputs). Read it; copy it to change it."""
    return make_micro_project(tmp_path_factory.mktemp("micro") / "template")


@pytest.fixture()
def micro_copy(micro_template, tmp_path) -> Path:
    """A private copy of the (output-less) micro project for one test."""
    return copy_project(micro_template, tmp_path / "project")


def made_once(name: str, make, tmp_path_factory, worker_id: str) -> tuple[Path, dict]:
    """A project `make(destination) -> facts` builds once per test session, for every pytest-xdist worker; each caller gets
    its own copy of it and the facts (JSON) `make` returned.

    Session fixtures are otherwise made once per worker: a pipeline run, twice. The workers share the session's temp root
    (pytest-xdist's documented pattern); the first takes the lock and makes the project, the others wait, then copy it.
    Nobody runs anything in the made project itself, so a copy never catches it half-written.
    """
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    made, facts = shared / f"once-{name}", shared / f"once-{name}.json"
    with FileLock(f"{made}.lock"):
        if not facts.exists():
            shutil.rmtree(made, ignore_errors=True)  # what a worker that failed to make it left
            facts.write_text(json.dumps(make(made)))
    return copy_project(made, tmp_path_factory.mktemp(name) / "project"), json.loads(facts.read_text())


@pytest.fixture(scope="session")
def reproduced_project(micro_template, tmp_path_factory, worker_id) -> dict:
    """The micro project after one `dvc repro` (every stage run through Dagster by DVC). Read only."""
    if not DVC.exists():
        pytest.skip(NO_DVC_REASON)

    def make(project: Path) -> dict:
        done = dvc(["repro"], copy_project(micro_template, project), timeout=1200)
        return {"output": done.stdout + done.stderr}

    project, facts = made_once("reproduced", make, tmp_path_factory, worker_id)
    return {"path": project, "output": facts["output"]}


@pytest.fixture(scope="session")
def fault_reference(micro_template, tmp_path_factory, worker_id) -> dict:
    """The uninterrupted 2-round run of the fault project (tests/faults.py): its checkpoint ids, how many reward calls it
    makes, and a copy of it. Read the copy; copy it again to change it."""
    from faults import fault_project, uninterrupted

    def make(project: Path) -> dict:
        ids, calls = uninterrupted(fault_project(micro_template, project))
        return {"ids": ids, "calls": calls}

    project, facts = made_once("fault-reference", make, tmp_path_factory, worker_id)
    return {**facts, "path": project}


@pytest.fixture(scope="session")
def pipeline_outputs(micro_template, tmp_path_factory, request) -> Path:
    """A micro project whose whole pipeline has run once: the `dvc repro` one when DVC is there, else `python -m pipelines run`."""
    if DVC.exists():
        return request.getfixturevalue("reproduced_project")["path"]
    project = copy_project(micro_template, tmp_path_factory.mktemp("run") / "project")
    python(["-m", "pipelines", "run"], project, timeout=1200)
    return project


@contextlib.contextmanager
def in_repo():
    """cwd = the repo root and no RL_ASSETS_* env, for importing pipelines modules (they read params.yaml at import)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        for key in [k for k in os.environ if k.startswith("RL_ASSETS_")]:
            patch.delenv(key)
        yield


def import_pipelines(module: str):
    """Import a `pipelines` module the way the code location does: from the repo root with its params.yaml."""
    with in_repo():
        return importlib.import_module(module)
