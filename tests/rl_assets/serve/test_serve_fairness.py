"""A fair server (issue 25, problem 7): requests are admitted against a token budget, a large one is generated in slices
so small ones get through meanwhile, a client that hangs up stops its generation, a half-sent request times out, and
/health shows the queue. Over real loopback sockets, bounded in count and time."""

from __future__ import annotations

import concurrent.futures
import socket
import time
from pathlib import Path

import httpx
import pytest

from rl_assets.core.params_file import load_params
from rl_assets.serve.app import create_app, timed_protocol
from rl_assets.serve.models import BadRequest, Batcher, Busy, Job, Sampling
from serve_support import make_served_project, running_server, status_command

LARGE = {"prompt": [f"{a}+{b}=" for a in range(8) for b in range(8)], "n": 8, "max_tokens": 32}  # 64 x 8 x 32 = 16,384 tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    project = make_served_project(tmp_path_factory.mktemp("fair") / "project")
    app = create_app(project, load_params(project / "params.yaml"), status_command=status_command({"healthy": True}), max_tokens=32,
                     max_batch=8, max_request_tokens=20_000, max_queued_tokens=30_000)
    with running_server(app, http=timed_protocol(1.0)) as url:
        yield url, app.state.batcher


def test_the_budget_refuses_what_is_too_large_ever_and_defers_what_is_too_large_now():
    batcher = Batcher(pool=None, max_request_tokens=100, max_queued_tokens=150)
    big = Job(Path("m"), Sampling(max_tokens=10, n=2), prompts=["a"] * 5)  # 100 tokens
    batcher.admit(big)
    with pytest.raises(Busy, match="100 tokens of requests to generate"):
        batcher.admit(Job(Path("m"), Sampling(max_tokens=10, n=1), prompts=["a"] * 6))
    with pytest.raises(BadRequest, match=r"may generate 110 tokens \(11 prompts x n=1 x max_tokens=10\), more than the server's limit of 100"):
        batcher.admit(Job(Path("m"), Sampling(max_tokens=10), prompts=["a"] * 11))
    assert batcher.load()["saturated"] and batcher.refused_busy == 1
    batcher._release(big)
    batcher.admit(Job(Path("m"), Sampling(max_tokens=10, n=1), prompts=["a"] * 6))


def test_small_requests_are_answered_while_a_large_one_generates(server):
    url, batcher = server
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        large = pool.submit(httpx.post, f"{url}/v1/completions", json=LARGE, timeout=300)
        deadline = time.monotonic() + 60
        while batcher.queued_tokens < 16_384 and time.monotonic() < deadline:  # admitted, generating
            time.sleep(0.01)
        small = [httpx.post(f"{url}/v1/completions", json={"prompt": "2+2=", "max_tokens": 4}, timeout=60) for _ in range(3)]
        assert [r.status_code for r in small] == [200] * 3
        assert not large.done(), "the small requests waited for the large one"
        health = httpx.get(f"{url}/health", timeout=60).json()["serving"]
        assert health["queued_tokens"] >= 16_384 and health["max_queued_tokens"] == 30_000 and health["saturated"]
        too_much = httpx.post(f"{url}/v1/completions", json=LARGE, timeout=60)  # a second large one does not fit now
        assert too_much.status_code == 429 and too_much.headers["retry-after"] == "1"
        assert large.result(timeout=300).status_code == 200 and len(large.result().json()["choices"]) == 64 * 8
    assert batcher.queued_tokens == 0


def test_a_client_that_hangs_up_stops_its_generation(server):
    url, batcher = server
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=LARGE, timeout=httpx.Timeout(60, read=1.0))
    deadline = time.monotonic() + 30
    while batcher.queued_tokens and time.monotonic() < deadline:
        time.sleep(0.05)
    assert batcher.queued_tokens == 0, "the job of a client that left is still generating"
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "2+2=", "max_tokens": 4}, timeout=60).status_code == 200
    assert time.monotonic() - started < 30


def test_a_half_sent_request_is_disconnected(server):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server
        assert time.monotonic() - started < 5
