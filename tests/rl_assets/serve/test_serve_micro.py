"""`rl-assets serve` as a user runs it (`make serve` after `make run`): the CLI in a process of its own, over the
micro pipeline's outputs, with the run state read through `python -m pipelines status`."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import httpx
import pytest
import yaml
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


DASHBOARD = REPO / "deploy/monitoring/grafana/dashboards/rl-assets.json"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the shipped Grafana dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel["targets"]]


def test_a_real_prometheus_scrapes_metrics_and_every_dashboard_query_finds_series(served, tmp_path):
    """Debian's prometheus, with the shipped scrape config pointed at the server: each of the dashboard's queries (reward,
    KL, loss, tokens/s, MFU, busy share, step durations and memory) returns series after the micro pipeline's run."""
    if not shutil.which("prometheus"):
        pytest.skip("prometheus not installed (make test installs Debian's as root with apt)")
    url, project = served
    config = yaml.safe_load((REPO / "deploy/monitoring/prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["scrape_configs"][0]["static_configs"] = [{"targets": [url.removeprefix("http://")]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp_path / "prometheus.log", "w") as log:
        prometheus = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(expr: str) -> list:
        answer = httpx.get(f"{api}/query", params={"query": expr}, timeout=30).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    try:
        deadline = time.monotonic() + 120
        while True:  # until the first scrape of the server is in
            try:
                if any(sample["value"][1] == "1" for sample in query('up{job="rl-assets"}')):
                    break
            except httpx.TransportError:
                pass
            assert prometheus.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-4000:]
            time.sleep(0.5)
        empty = [f"{title}: {expr}" for title, expr in dashboard_queries() if not query(expr)]
        assert not empty, f"dashboard queries with no series in {project}'s /metrics: {empty}"
        mfu = query("rl_assets_train_mfu")[0]
        assert mfu["metric"]["round"] == "1" and 0 < float(mfu["value"][1]) < 1
        busy = {sample["metric"]["stage"]: float(sample["value"][1]) for sample in query("rl_assets_step_busy_share")}
        assert {"sft", "rollouts", "train", "evaluation"} <= set(busy) and all(0 < share <= 1 for share in busy.values()), busy
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)


def test_the_dashboard_reads_the_provisioned_data_source_and_shows_what_the_issue_names():
    source = yaml.safe_load((REPO / "deploy/monitoring/grafana/provisioning/datasources/rl-assets.yaml").read_text())["datasources"][0]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert {p["datasource"]["uid"] for p in panels} | {t["datasource"]["uid"] for p in panels for t in p["targets"]} == {source["uid"]}
    shown = " ".join(expr for _, expr in dashboard_queries())
    for metric in ("reward_mean", "train_kl", "train_loss", "tokens_per_second", "train_mfu", "busy_share", "eval_accuracy"):
        assert metric in shown
