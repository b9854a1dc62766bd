"""Real clients against a real `dagster dev`: the GraphQL client launches rl_pipeline on the micro project,
`rl-assets status` reports it, and headless Chromium finds the materialized assets in the UI.

One webserver and one run serve every test here (module fixture); each wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_project, project_env, python

pytestmark = pytest.mark.e2e

DAGSTER = REPO / ".venv" / "bin" / "dagster"
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout: float, what: str, log: Path):
    """Poll `condition` once a second until it returns something truthy; fail with the server log on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}\n--- dagster dev log\n{log.read_text()[-6000:]}")


def responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def ui(micro_template, tmp_path_factory):
    """`dagster dev` (webserver + daemon) on a free loopback port over a copy of the micro project."""
    project = copy_project(micro_template, tmp_path_factory.mktemp("ui") / "project")
    assert yaml.safe_load((project / "params.yaml").read_text())["guards"]["kl_max"] == 100.0  # loose micro guards (micro_params.yaml)
    port, log = free_port(), project / "dagster-dev.log"
    with open(log, "w") as out:
        server = subprocess.Popen([DAGSTER, "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"], cwd=project,
                                  env=project_env(project, RL_ASSETS_DVC_COMMIT="0"), stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_for(lambda: server.poll() is not None or responds(f"http://127.0.0.1:{port}/server_info"), 240, "the webserver", log)
        assert server.poll() is None, f"dagster dev exited {server.returncode}\n{log.read_text()[-6000:]}"
        yield {"project": project, "port": port, "log": log}
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl+C, which `dagster dev` handles; its own session: webserver, daemon, code server
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def launched(ui):
    """(run id, final status) of rl_pipeline launched through DagsterGraphQLClient."""
    from dagster import DagsterRunStatus
    from dagster_graphql import DagsterGraphQLClient

    client = DagsterGraphQLClient("127.0.0.1", port_number=ui["port"])
    run_id = client.submit_job_execution("rl_pipeline")
    done = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
    status = wait_for(lambda: (s := client.get_run_status(run_id)) in done and s, 1200, f"run {run_id}", ui["log"])
    return run_id, status


def test_webserver_listens_on_loopback_only(ui):
    assert responds(f"http://127.0.0.1:{ui['port']}/server_info")
    done = subprocess.run(["ss", "-ltnH", f"sport = :{ui['port']}"], capture_output=True, text=True, timeout=30) if shutil.which("ss") else None
    if done is None:
        pytest.skip("`ss` is not installed; cannot list listening sockets")
    assert done.stdout.strip() and all(line.split()[3].startswith("127.0.0.1:") for line in done.stdout.strip().splitlines()), done.stdout


def test_graphql_client_launches_the_pipeline_and_it_succeeds(ui, launched):
    from dagster import DagsterRunStatus

    run_id, status = launched
    assert status == DagsterRunStatus.SUCCESS, ui["log"].read_text()[-8000:]
    project = ui["project"]
    assert (project / "data" / "evaluation.parquet").is_file()
    card = json.loads((project / "models" / "promoted" / "model_card.json").read_text())
    assert card["source"].endswith("/checkpoint") and card["evaluation"]["sampled"] >= 0

    status_report = json.loads(python(["-m", "pipelines", "status"], project, timeout=180).stdout)
    assert status_report["healthy"] and status_report["latest_run"]["run_id"] == run_id
    assert status_report["latest_run"]["status"] == "SUCCESS" and status_report["latest_run"]["failed_checks"] == []
    assert status_report["current_round"] == 1 and status_report["promoted_model"]["checkpoint_id"] == card["checkpoint_id"]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (`make test` installs Debian's chromium when it can)")
def test_browser_finds_the_materialized_assets(ui, launched):
    url = f"http://127.0.0.1:{ui['port']}/assets?view=flat"
    chromium = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--virtual-time-budget=30000",
                "--window-size=1400,1000"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "dagster_assets.png"
    dom = subprocess.run([*chromium, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    subprocess.run([*chromium, f"--screenshot={screenshot}", url], capture_output=True, text=True, timeout=180)
    print(f"screenshot of the asset catalog: {screenshot}")
    keys = ("raw_data", "prompts", "r00/checkpoint", "r01/rollouts", "r01/rewards", "r01/checkpoint", "evaluation", "promoted_model")
    for key in keys:
        assert key in dom, f"{key} not in the rendered asset catalog ({len(dom)} characters of DOM)"
    assert len(re.findall(r"Materialized\b", dom)) >= len(keys), "the catalog does not show every asset as materialized"
    assert screenshot.is_file() and screenshot.stat().st_size > 10_000
