"""`rl-assets serve` as a user runs it (`make serve` after `make run`): the CLI in a process of its own, over the
micro pipeline's outputs, with the run state read through `python -m pipelines status`."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, copy_project, project_env, python
from rl_assets.core.checkpoints import read_lineage

import openai  # noqa: E402  (a dev dependency: make test installs it)
pytestmark = pytest.mark.e2e


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(pipeline_outputs, tmp_path_factory):
    """`rl-assets serve` over a copy of the micro outputs after the promoted_model asset (what `make run` ends with)."""
    project = copy_project(pipeline_outputs, tmp_path_factory.mktemp("served") / "project")
    if not (project / "models/promoted").is_dir():  # `dvc repro` made the outputs: its stages stop at the evaluation
        python(["-m", "pipelines", "materialize", "promoted_model"], project, timeout=600)
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as out:
        server = subprocess.Popen([str(REPO / ".venv/bin/rl-assets"), "serve", "--port", str(port), "--status-interval", "1"],
                                  cwd=project, env=project_env(project), stdout=out, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while True:
        try:
            httpx.get(f"{url}/health", timeout=30)
            break
        except httpx.TransportError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"rl-assets serve did not answer\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
    yield url, project
    server.terminate()
    assert server.wait(timeout=30) in (0, -15), log.read_text()[-4000:]  # uvicorn re-raises the SIGTERM it handled
    assert "Finished server process" in log.read_text()


def test_health_metrics_and_a_completion_of_the_micro_pipelines_promoted_model(served):
    url, project = served
    health = httpx.get(f"{url}/health", timeout=60)
    assert health.status_code == 200, health.text
    body = health.json()
    promoted = read_lineage(project / "models/promoted")["checkpoint_id"]
    assert body["latest_run"]["status"] == "SUCCESS" and body["round"] == 1 and body["promoted_model"] == promoted
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model="promoted", prompt="3+4=", max_tokens=4)
    assert done.model == promoted and done.model_extra["lineage"]["path"] == "models/promoted"
    assert isinstance(done.choices[0].text, str)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=60).text) for s in f.samples}
    assert ("rl_assets_train_reward_mean", (("round", "1"),)) in samples
    assert samples[("rl_assets_run_status", (("status", "SUCCESS"),))] == 1
    assert samples[("rl_assets_requests_total", (("code", "200"), ("endpoint", "/v1/completions")))] == 1
    assert any(name == "rl_assets_step_duration_seconds" for name, _ in samples)  # the compute steps beat and left their durations
