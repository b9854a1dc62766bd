"""`rl-assets serve`: the project's health, its metrics and its models over HTTP (FastAPI on uvicorn).

    rl-assets serve [--host 127.0.0.1] [--port 8000] [--heartbeat-timeout 300]

    GET  /health                200 with the project's state (latest run, round, last metrics, promoted model,
                                heartbeats of running steps); 503 when the latest run failed or a step's heartbeat is stale
    GET  /health/live           200 while this server itself works (its generation worker is not stuck): the liveness probe
    GET  /metrics               Prometheus exposition format (rl_assets/serve/metrics.py)
    GET  /v1/models             the checkpoints a request may name
    POST /v1/completions        OpenAI-compatible; `model` is promoted (default), rNN, a checkpoint folder or id (prefix);
                                each prompt rendered as training rendered problems (prompts.template, the chat template
                                when prompts.chat_template says so), so a raw question reaches a chat model as a user turn;
                                `logprobs` gives each token's log-prob, `values` (PPO) also the value model's estimates
    POST /v1/chat/completions   the same for chat messages (the tokenizer's chat template, else one message per line);
                                a vision-language model's messages may carry image_url parts (data URLs, files under the project)
    GET  /images/<sha256>.<ext> a stored picture of the experiment (what the rollouts' samples in the Dagster UI show)

Responses carry the checkpoint id as `model` and its lineage under `lineage`. Concurrent requests are
batched on one worker thread (rl_assets/serve/models.py), admitted against a token budget (400 above
`--max-request-tokens`, 429 while `--max-queued-tokens` are waiting), generated in slices so a large one
never starves small ones, and dropped when their client hangs up; a client gets `--read-timeout` seconds
to send a request's head and body. /health shows the queue. Sampling is greedy unless `temperature` > 0,
as in `rl-assets generate`. On a GPU with vLLM installed, `vllm serve models/promoted` serves the same
folder faster; this server is the CPU path and the one with the project's health and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from rl_assets.core.config import Params
from rl_assets.serve.health import StatusCache, health_body
from rl_assets.run.heartbeat import running_steps, timeout_seconds
from rl_assets.core.paths import IMAGES, data_dir
from rl_assets.serve.metrics import ProjectCollector, ServerMetrics
from rl_assets.serve.models import BadRequest, Batcher, Busy, Job, ModelPool, Sampling, UnknownModel

PREDICT = ("/v1/completions", "/v1/chat/completions")


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # other OpenAI fields (user, logit_bias, ...) are accepted and unused

    model: str = Field("promoted", min_length=1, description="promoted, rNN, a checkpoint folder or a checkpoint id (prefix)")
    max_tokens: int = Field(16, ge=1, description="New tokens per completion, at most the server's --max-tokens.")
    temperature: float = Field(0.0, ge=0, le=2, description="0 decodes greedily.")
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=16, description="Completions per prompt.")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, description="Seed of the batch's sampling (requests with other seeds batch apart).")
    stream: Literal[False] = Field(False, description="Streaming is not supported.")
    logprobs: bool | int | None = Field(None, description="Each generated token's log-prob (OpenAI's shape; top alternatives are not "
                                                          "returned, so top_logprobs is null).")
    values: bool = Field(False, description="rl-assets: each token's log-prob and the value model's estimate before it, and "
                                            "predicted_reward, from the checkpoint's round's rNN/critic (train.algorithm ppo).")


class CompletionRequest(_Request):
    prompt: str | list[str]


class Message(BaseModel):
    role: str
    content: str | list[dict]

    def parts(self) -> str | list[dict]:
        """The content for the chat template: its text, or with images the parts in order ({"type": "image"} for each)."""
        if isinstance(self.content, str):
            return self.content
        if not any(part.get("type") == "image_url" for part in self.content):
            return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")
        return [{"type": "image"} if part.get("type") == "image_url" else {"type": "text", "text": part.get("text", "")}
                for part in self.content if part.get("type") in ("text", "image_url")]

    def image_urls(self) -> list[str]:
        if isinstance(self.content, str):
            return []
        return [_url(part) for part in self.content if part.get("type") == "image_url"]


def _url(part: dict) -> str:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise BadRequest("an image_url content part needs image_url.url (a data URL or a file under the project)")
    return url


MAX_IMAGE_BYTES = 20_000_000  # per image of a request
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "webp": "image/webp", "gif": "image/gif", "bmp": "image/bmp"}


def request_image(url: str, root: Path):
    """The PIL image an image_url names: a base64 data URL, or a local file under the project root (file:// or a path);
    BadRequest for anything else, a file elsewhere, more than MAX_IMAGE_BYTES or an unreadable image."""
    import base64
    import binascii

    from rl_assets.data.images import decoded_image

    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64"):
            raise BadRequest("an image data URL must be base64 (data:image/png;base64,...)")
        if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
            raise BadRequest(f"an image of more than {MAX_IMAGE_BYTES:,} bytes")
        try:
            data, name = base64.b64decode(payload, validate=True), "(data URL)"
        except (binascii.Error, ValueError):
            raise BadRequest("an image data URL whose payload is not base64") from None
    elif url.startswith(("http://", "https://")):
        raise BadRequest("image URLs on the network are not fetched: send a data URL or a file under the project")
    else:
        path = (root / url.removeprefix("file://")).resolve()
        if not path.is_relative_to(root.resolve()):
            raise BadRequest(f"image file {url}: outside the project folder")
        if not path.is_file():
            raise BadRequest(f"image file not found: {url}")
        if path.stat().st_size > MAX_IMAGE_BYTES:
            raise BadRequest(f"image file {url}: more than {MAX_IMAGE_BYTES:,} bytes")
        data, name = path.read_bytes(), url
    try:
        return decoded_image(data, name)
    except ValueError as error:
        raise BadRequest(str(error)) from None


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)


def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    """The OpenAI error shape, so OpenAI clients raise their own NotFoundError, BadRequestError, ..."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def create_app(root: Path, params: Params, *, heartbeat_timeout: float | None = None, status_interval: float = 15.0,
               max_batch: int = 32, max_tokens: int = 256, device: str = "cpu", preload: str | None = "promoted",
               status_command: list[str] | None = None, max_request_tokens: int | None = None,
               max_queued_tokens: int | None = None) -> FastAPI:
    """The server of the project at `root` (see the module docstring); `status_command` prints the status JSON (the CLI passes `rl-assets status`; None: files only).

    `max_request_tokens` (default 64 completions of `max_tokens`) and `max_queued_tokens` (default 4x that) are the budget."""
    timeout = timeout_seconds() if heartbeat_timeout is None else heartbeat_timeout
    status = StatusCache(root, status_interval, status_command)
    data = data_dir(params.experiment, root)  # the experiment's rounds (rNN names) and metrics
    metrics = ServerMetrics(ProjectCollector(root, data, status, timeout))
    pool = ModelPool(root, params.promotion, data, device)
    batcher = Batcher(pool, max_batch=max_batch, on_batch=metrics.on_batch, max_request_tokens=max_request_tokens or 64 * max_tokens,
                      max_queued_tokens=max_queued_tokens, rendering=params.prompts)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        with contextlib.suppress(FileNotFoundError):
            batcher.start(preload=pool.resolve(preload)[0] if preload else None)
        if not batcher.thread.is_alive():
            batcher.start()
        status.latest(wait=False)
        yield
        batcher.stop()

    app = FastAPI(title="rl-assets", lifespan=lifespan)
    app.state.status, app.state.metrics, app.state.batcher = status, metrics, batcher

    def count(endpoint: str, code: int, started: float) -> None:
        metrics.requests.labels(endpoint, str(code)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"malformed JSON at character {e['loc'][-1]}: {e['ctx']['error']}" if e["type"] == "json_invalid" else
                             f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors())
        if request.url.path in PREDICT:
            count(request.url.path, 400, time.perf_counter())
        return error(400, f"invalid request: {problems}")

    @app.get("/health")
    async def health():
        current = await asyncio.to_thread(status.latest)
        healthy, body = health_body(current, running_steps(root, timeout), status.age(), status.error)
        body["serving"] = batcher.load()  # a saturated queue: new large requests get 429 until it drains
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/health/live")
    async def live():
        """Liveness of this server alone: the event loop answers and the generation worker is not stuck on one batch."""
        stuck = batcher.stuck_for()
        if stuck is not None and stuck > timeout:
            return JSONResponse({"status": "unhealthy", "reasons": [f"generation worker on one batch for {stuck:.0f} s"]}, status_code=503)
        return {"status": "healthy", "busy_s": stuck, "serving": batcher.load()}

    @app.get("/metrics")
    async def prometheus():
        return Response(await asyncio.to_thread(generate_latest, metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/images/{name}")
    async def image(name: str):
        """A stored picture of the experiment (<data>/images), by its file name: what the Dagster UI's rollouts samples show."""
        path = data / IMAGES / name
        if not re.fullmatch(r"[0-9a-f]{64}\.(png|jpg|webp|gif|bmp)", name) or not path.is_file():
            return error(404, f"no stored image {name!r}", code="image_not_found")
        return FileResponse(path, media_type=IMAGE_TYPES[path.suffix[1:]], headers={"Cache-Control": "public, max-age=31536000, immutable"})

    @app.get("/v1/models")
    async def models():
        names = ["promoted", *sorted(p.parent.parent.name for p in data.glob("r*/checkpoint/lineage.json"))]
        listed = []
        for name in names:
            with contextlib.suppress(UnknownModel):
                listed.append({"id": name, "object": "model", "owned_by": "rl-assets", "created": 0, "lineage": pool.resolve(name)[1]})
        return {"object": "list", "data": listed}

    async def predict(endpoint: str, raw: Request, request: _Request, **job) -> JSONResponse:
        started, code = time.perf_counter(), 500
        try:
            if request.max_tokens > max_tokens:
                raise BadRequest(f"max_tokens={request.max_tokens} exceeds the server's limit of {max_tokens}")
            path, lineage = pool.resolve(request.model)
            critic = pool.critic_for(path) if request.values else None
            sampling = Sampling(request.max_tokens, request.temperature, request.top_p, request.n, request.seed or 0)
            stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
            result = await until_answered_or_gone(raw, batcher.submit(Job(path, sampling, stop=stop, critic=critic,
                                                                            logprobs=bool(request.logprobs) or request.values, **job)))
            if result is None:  # the client hung up: its job was dropped; nobody reads this answer
                code = 499
                return error(499, "client closed the request", code="client_closed_request")
            code = 200
        except UnknownModel as problem:
            code = 404
            return error(404, str(problem), code="model_not_found")
        except BadRequest as problem:
            code = 400
            return error(400, str(problem))
        except Busy as problem:
            code = 429
            response = error(429, str(problem), kind="rate_limit_error", code="server_busy")
            response.headers["Retry-After"] = "1"
            return response
        except Exception as problem:  # noqa: BLE001 - a failed generation is a 500 with its message; the server keeps serving
            return error(500, f"{type(problem).__name__}: {problem}", kind="server_error")
        finally:
            count(endpoint, code, started)
        tokens = sum(choice.pop("tokens") for choice in result["choices"])
        usage = {"prompt_tokens": result["prompt_tokens"], "completion_tokens": tokens, "total_tokens": result["prompt_tokens"] + tokens}
        return JSONResponse({"id": f"{'chatcmpl' if job.get('messages') else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                             "model": lineage["checkpoint_id"], "lineage": {"name": request.model, "path": str(path.relative_to(root)), **lineage},
                             "usage": usage, **_shape(result["choices"], chat=job.get("messages") is not None)})

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request):
        return await predict("/v1/completions", raw, request, prompts=[request.prompt] if isinstance(request.prompt, str) else request.prompt)

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest, raw: Request):
        try:
            images = [request_image(url, root) for m in request.messages for url in m.image_urls()]
        except BadRequest as problem:
            count("/v1/chat/completions", 400, time.perf_counter())
            return error(400, str(problem))
        return await predict("/v1/chat/completions", raw, request, messages=[{"role": m.role, "content": m.parts()} for m in request.messages],
                             images=images or None)

    return app


async def until_answered_or_gone(request: Request, answer, poll: float = 0.25):
    """Await `answer`, checking every `poll` seconds that the client is still there; None (and the job dropped) once it is not."""
    task = asyncio.ensure_future(answer)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()  # Batcher.submit marks the job cancelled: the worker drops it at its next slice
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None


def _shape(choices: list[dict], chat: bool) -> dict:
    """OpenAI's response shapes; `logprobs` in each's own form, and rl-assets' `values` and `predicted_reward` when asked for."""
    shaped = []
    for i, c in enumerate(choices):
        scores, extra = c.get("scores"), {}
        logprobs = None
        if scores is not None:
            if chat:
                logprobs = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                        for t, lp in zip(scores["tokens"], scores["token_logprobs"])]}
            else:
                offsets = [sum(map(len, scores["tokens"][:k])) for k in range(len(scores["tokens"]))]
                logprobs = {"tokens": scores["tokens"], "token_logprobs": scores["token_logprobs"], "top_logprobs": None, "text_offset": offsets}
            if "values" in scores:
                extra = {"values": scores["values"], "predicted_reward": scores["predicted_reward"]}
        body = {"message": {"role": "assistant", "content": c["text"]}} if chat else {"text": c["text"]}
        shaped.append({"index": i, **body, "finish_reason": c["finish_reason"], "logprobs": logprobs, **extra})
    return {"object": "chat.completion" if chat else "text_completion", "choices": shaped}


def serve(root: Path, params: Params, host: str = "127.0.0.1", port: int = 8000, read_timeout: float = 10.0, **options) -> None:
    import uvicorn

    uvicorn.run(create_app(root, params, **options), host=host, port=port, log_level="info", http=timed_protocol(read_timeout))


def timed_protocol(read_timeout: float):
    """uvicorn's h11 protocol with a deadline for reading a request: a client that sends half a head, or its body slower than
    `read_timeout` seconds, is disconnected (uvicorn times out only idle keep-alive connections, so it held them forever)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._read_deadline = self.loop.call_later(read_timeout, self._read_timed_out)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._read_deadline.cancel()  # the next request of a kept-alive connection gets a deadline of its own
            self._read_deadline = self.loop.call_later(read_timeout, self._read_timed_out)

        def connection_lost(self, exc) -> None:
            self._read_deadline.cancel()
            super().connection_lost(exc)

        def _read_timed_out(self) -> None:
            # IDLE: not even a whole head yet; SEND_BODY: the body is still coming. DONE: read, being answered: not ours.
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                self.logger.warning(f"{self.client}: request not read within {read_timeout:.0f} s: closing the connection")
                self.transport.close()

    return TimedH11Protocol
