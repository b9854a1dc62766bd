"""`rl-assets serve` over real sockets: /health, /metrics (parsed with prometheus_client), the OpenAI-compatible
endpoints through the `openai` client, bad requests, and a bounded concurrent load."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.params_file import load_params
from rl_assets.run.heartbeat import Heartbeat
from rl_assets.serve.app import create_app
from serve_support import make_served_project, running_server, status_command

import openai  # noqa: E402  (a dev dependency: make test installs it)

RUN = {"run_id": "abc123", "status": "SUCCESS", "started": 1.0, "ended": 2.0}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_served_project(tmp_path_factory.mktemp("served") / "project")


def status_of(project, run=RUN) -> dict:
    from rl_assets.run.status import project_status

    return {"healthy": True, "latest_run": run, "experiment": "default", **project_status(project, load_params(project / "params.yaml"))}


@pytest.fixture(scope="module")
def server(project):
    app = create_app(project, load_params(project / "params.yaml"), status_command=status_command(status_of(project)), max_tokens=64)
    with running_server(app) as url:
        yield url


def metrics(url: str) -> dict:
    """{(name, labels as a sorted tuple): value} of every sample /metrics exports."""
    response = httpx.get(f"{url}/metrics", timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(response.text) for s in f.samples}


def test_health_answers_the_project_state(server, project):
    response = httpx.get(f"{server}/health", timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    promoted = read_lineage(project / "models/promoted")["checkpoint_id"]
    assert body["status"] == "healthy" and body["reasons"] == []
    assert body["latest_run"] == RUN and body["round"] == 2 and body["rounds_configured"] == 2
    assert body["promoted_model"] == promoted and body["last_metrics"]["kl"] == 0.01
    assert body["running_steps"] == [] and body["heartbeat_age_s"] is None


def test_health_is_503_when_the_latest_run_failed(project):
    failed = {**RUN, "status": "FAILURE"}
    app = create_app(project, load_params(project / "params.yaml"), status_command=status_command(status_of(project, failed)), preload=None)
    with running_server(app) as url:
        response = httpx.get(f"{url}/health", timeout=60)
        assert response.status_code == 503 and response.json()["reasons"] == ["latest run abc123 failure"]
        assert metrics(url)[("rl_assets_healthy", ())] == 0 and metrics(url)[("rl_assets_run_status", (("status", "FAILURE"),))] == 1


def test_health_is_503_while_a_step_stops_beating_and_200_once_it_beats_again(project):
    app = create_app(project, load_params(project / "params.yaml"), status_command=status_command(status_of(project)),
                     heartbeat_timeout=60, preload=None)
    with running_server(app) as url, Heartbeat(project, "train", 2, interval=3600) as beat:
        first = httpx.get(f"{url}/health", timeout=60).json()
        assert first["running_steps"][0]["stage"] == "train" and first["running_steps"][0]["pid"] == os.getpid()
        beat.record["time"] = beat.record["progress"] = time.time() - 120  # its last beat, two minutes ago
        beat.path.write_text(json.dumps(beat.record))
        response = httpx.get(f"{url}/health", timeout=60)
        assert response.status_code == 503 and "train r02" in response.json()["reasons"][0], response.text
        assert metrics(url)[("rl_assets_step_heartbeat_age_seconds", (("pid", str(os.getpid())), ("round", "2"), ("stage", "train")))] >= 120
        beat.record["time"] = beat.record["progress"] = time.time()
        beat.path.write_text(json.dumps(beat.record))
        assert httpx.get(f"{url}/health", timeout=60).status_code == 200


def test_metrics_export_rounds_evaluation_run_state_and_promoted_model(server, project):
    found = metrics(server)
    assert found[("rl_assets_train_reward_mean", (("round", "1"),))] == 0.5
    assert found[("rl_assets_train_kl", (("round", "2"),))] == 0.01
    assert found[("rl_assets_train_entropy", (("round", "1"),))] == 0.8
    assert found[("rl_assets_eval_accuracy", (("mode", "sampled"), ("round", "1")))] == 0.5
    assert found[("rl_assets_run_status", (("status", "SUCCESS"),))] == 1 and found[("rl_assets_healthy", ())] == 1
    promoted = read_lineage(project / "models/promoted")["checkpoint_id"]
    assert found[("rl_assets_promoted_info", (("checkpoint_id", promoted), ("source", "r01/checkpoint")))] == 1


def test_completions_through_the_openai_client_carry_model_id_and_lineage(server, project):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model="promoted", prompt=["1+1=", "2+3="], max_tokens=4, n=2, temperature=1.0, seed=3)
    promoted = read_lineage(project / "models/promoted")
    assert done.model == promoted["checkpoint_id"] and len(done.choices) == 4
    assert [c.index for c in done.choices] == [0, 1, 2, 3] and all(c.finish_reason in ("stop", "length") for c in done.choices)
    lineage = done.model_extra["lineage"]
    assert lineage["parent"] == promoted["parent"] and lineage["promotion"]["source"] == "r01/checkpoint"
    assert done.usage.prompt_tokens == 10 and 0 < done.usage.completion_tokens <= 16
    greedy = [client.completions.create(model=name, prompt="7*8=", max_tokens=5).choices[0].text for name in ("promoted", "r01", promoted["checkpoint_id"][:12])]
    assert len(set(greedy)) == 1  # the same weights by three names, greedy
    chat = client.chat.completions.create(model="r01", messages=[{"role": "user", "content": "7*8="}], max_tokens=5)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content == greedy[0]
    assert chat.model_extra["lineage"]["path"] == "data/r01/checkpoint"
    assert {m.id for m in client.models.list().data} >= {"promoted", "r01"}


def test_bad_requests_get_4xx_with_a_clear_message(server, project):
    elsewhere = project.parent / "elsewhere"
    if not elsewhere.exists():
        shutil.copytree(project / "data/r01/checkpoint", elsewhere)
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="r09/checkpoint: no checkpoint there"):
        client.completions.create(model="r09", prompt="1+1=")
    with pytest.raises(openai.NotFoundError, match="not a checkpoint of this project"):
        client.completions.create(model=str(elsewhere), prompt="1+1=")
    with pytest.raises(openai.BadRequestError, match="exceeds the model's context of 256 tokens"):
        client.completions.create(model="promoted", prompt="1+" * 200, max_tokens=64)
    with pytest.raises(openai.BadRequestError, match="max_tokens=100 exceeds the server's limit of 64"):
        client.completions.create(model="promoted", prompt="1+1=", max_tokens=100)
    with pytest.raises(openai.BadRequestError, match="non-empty string"):
        client.completions.create(model="promoted", prompt="")
    response = httpx.post(f"{server}/v1/completions", content=b'{"prompt": "1+1=",', headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("invalid request: malformed JSON")
    response = httpx.post(f"{server}/v1/chat/completions", json={"messages": [], "n": 0}, timeout=60)
    assert response.status_code == 400 and "messages" in response.text and "n:" in response.text
    assert httpx.post(f"{server}/v1/completions", json={"prompt": "1", "stream": True}, timeout=60).status_code == 400
    found = metrics(server)
    assert found[("rl_assets_requests_total", (("code", "404"), ("endpoint", "/v1/completions")))] == 2
    assert found[("rl_assets_requests_total", (("code", "400"), ("endpoint", "/v1/completions")))] >= 5


def test_concurrent_requests_are_all_answered_in_shared_batches(server):
    before = metrics(server)
    prompts = [f"{a}+{b}=" for a in range(6) for b in range(4)]  # 24 requests, 8 at a time, bounded by the pool and a deadline

    def ask(prompt: str) -> httpx.Response:
        return httpx.post(f"{server}/v1/completions", json={"prompt": prompt, "max_tokens": 6}, timeout=60)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, prompts, timeout=120))
    assert time.monotonic() - started < 120
    assert [a.status_code for a in answers] == [200] * len(prompts)
    assert all(len(a.json()["choices"]) == 1 for a in answers)
    after = metrics(server)
    batches = after[("rl_assets_batch_size_count", ())] - before.get(("rl_assets_batch_size_count", ()), 0)
    assert batches < len(prompts)  # some requests shared a batch
    assert after[("rl_assets_requests_total", (("code", "200"), ("endpoint", "/v1/completions")))] >= len(prompts)
    assert httpx.get(f"{server}/health", timeout=60).status_code == 200  # still serving
