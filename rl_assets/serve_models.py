"""The model side of `rl-assets serve`: checkpoints by name, loaded once, and one thread that batches requests.

Every request becomes a `Job` on one queue. A single worker thread owns the models and tokenizers: it
takes the first waiting job, drains the jobs that queued up meanwhile (up to `max_batch` completions),
and runs one batched `generate` per group of jobs that share a checkpoint and sampling settings. So
requests that arrive while a batch is generating share the next one, and nothing else touches torch.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rl_assets.checkpoints import read_lineage
from rl_assets.config import PromotionParams
from rl_assets.generate import resolve_checkpoint
from rl_assets.promotion import read_card

LINEAGE_KEYS = ("checkpoint_id", "round", "parent", "algorithm", "params_hash", "code_version", "trained_on", "experiment")


class BadRequest(ValueError):
    """A request the model cannot take (too long a prompt, an empty one): answered 400 with this message."""


class UnknownModel(FileNotFoundError):
    """No checkpoint by that name: answered 404."""


@dataclass(frozen=True)
class Sampling:
    """What a batch must share: greedy when temperature is 0."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0


@dataclass
class Job:
    path: Path
    sampling: Sampling
    prompts: list[str] | None = None  # /v1/completions
    messages: list[dict] | None = None  # /v1/chat/completions: rendered by the worker with the model's tokenizer
    stop: list[str] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future | None = None


def lineage_of(path: Path) -> dict:
    """The lineage a response carries: the checkpoint card's ids, and the promotion card's when it is a promoted model."""
    card = read_lineage(path)
    out = {key: card[key] for key in LINEAGE_KEYS if key in card}
    promoted = read_card(path)
    if promoted:
        out["promotion"] = {key: promoted.get(key) for key in ("source", "promoted_at", "previous", "experiment")}
    return out


class ModelPool:
    """Checkpoint folders by request name (promoted, rNN, a folder inside the project, an id prefix), models by checkpoint id."""

    def __init__(self, root: Path, promotion: PromotionParams, device: str = "cpu", keep: int = 2):
        self.root, self.promotion, self.device, self.keep = root, promotion, device, keep
        self.loaded: dict[str, tuple] = {}  # checkpoint id -> (model, tokenizer); touched by the worker thread only

    def resolve(self, name: str) -> tuple[Path, dict]:
        """(folder, lineage) of a model name; `UnknownModel` when there is none (or it lies outside the project)."""
        try:
            path = resolve_checkpoint(name, self.promotion, self.root)
        except FileNotFoundError as error:
            raise UnknownModel(str(error)) from None
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise UnknownModel(f"{name!r}: not a checkpoint of this project")
        return path, lineage_of(path)

    def get(self, path: Path):
        from rl_assets.models import load_policy

        key = read_lineage(path)["checkpoint_id"]  # `promoted` may have changed since the last request: the id says
        if key not in self.loaded:
            while len(self.loaded) >= self.keep:
                self.loaded.pop(next(iter(self.loaded)))
            self.loaded[key] = load_policy(path, self.device)
        return self.loaded[key]


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The prompt text of a chat: the tokenizer's chat template, else the messages' contents one per line."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n".join(message["content"] for message in messages)


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """The text before the first stop string, and whether one was found.

    >>> cut_at_stop("12\\nNext", ["\\n"])
    ('12', True)
    """
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


class Batcher:
    """One worker thread that runs every job, batching those waiting together (see the module docstring)."""

    def __init__(self, pool: ModelPool, max_batch: int = 32, max_prompt_chars: int = 20_000, on_batch=None):
        self.pool, self.max_batch, self.max_prompt_chars, self.on_batch = pool, max_batch, max_prompt_chars, on_batch
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="rl-assets-batcher", daemon=True)
        self.busy_since: float | None = None  # when the batch now generating began (None: idle)

    def stuck_for(self) -> float | None:
        """Seconds the worker has been on its current batch, None when it is idle; `inf` when the worker is gone."""
        if not self.thread.is_alive():
            return float("inf")
        return None if self.busy_since is None else time.monotonic() - self.busy_since

    def start(self, preload: Path | None = None) -> None:
        if preload is not None:
            self.jobs.put(Job(preload, Sampling()))  # loads the model before the first request; no future to answer
        self.thread.start()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=30)

    async def submit(self, job: Job) -> dict:
        job.loop = asyncio.get_running_loop()
        job.future = job.loop.create_future()
        self.jobs.put(job)
        return await job.future

    def _work(self) -> None:
        while (first := self.jobs.get()) is not None:
            batch, size = [first], len(first.prompts or [1]) * first.sampling.n
            while size < self.max_batch:  # what queued up while the last batch ran
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self.jobs.put(None)
                    break
                batch.append(job)
                size += len(job.prompts or [1]) * job.sampling.n
            groups: dict[tuple, list[Job]] = {}
            for job in batch:
                groups.setdefault((job.path, job.sampling), []).append(job)
            self.busy_since = time.monotonic()
            for (path, sampling), jobs in groups.items():
                self._run(path, sampling, jobs)
            self.busy_since = None

    def _run(self, path: Path, sampling: Sampling, jobs: list[Job]) -> None:
        from rl_assets.prompts import encode_prompts
        from rl_assets.rollouts import generate

        try:
            model, tokenizer = self.pool.get(path)
        except Exception as error:  # noqa: BLE001 - a checkpoint that fails to load answers every job waiting on it
            for job in jobs:
                _answer(job, error=error)
            return
        limit = getattr(model.config, "max_position_embeddings", None)
        ready, prompts = [], []
        for job in jobs:
            if job.future is None:  # the preload job
                continue
            try:
                texts = job.prompts if job.prompts is not None else [render_chat(tokenizer, job.messages)]
                lengths = [len(ids) for ids in encode_prompts(tokenizer, _checked(texts, self.max_prompt_chars))]
                if limit and max(lengths) + sampling.max_tokens > limit:
                    raise BadRequest(f"prompt of {max(lengths)} tokens plus max_tokens={sampling.max_tokens} exceeds the model's "
                                     f"context of {limit} tokens")
            except Exception as error:  # noqa: BLE001 - a bad prompt fails its own request, not the batch
                _answer(job, error=error if isinstance(error, BadRequest) else BadRequest(str(error)))
                continue
            ready.append((job, texts, lengths))
            prompts += texts
        if not ready:
            return
        started = time.perf_counter()
        try:
            out = generate(model, tokenizer, prompts, sampling.n, greedy=sampling.temperature == 0,
                           temperature=sampling.temperature or 1.0, top_p=sampling.top_p, max_new_tokens=sampling.max_tokens,
                           batch_size=max(len(prompts) * sampling.n, 1), seed=sampling.seed)
        except Exception as error:  # noqa: BLE001 - answered 500 to each job; the worker keeps serving
            for job, _, _ in ready:
                _answer(job, error=error)
            return
        if self.on_batch:
            self.on_batch(len(prompts) * sampling.n, sum(map(len, out.completion_ids)), time.perf_counter() - started)
        at = 0
        for job, texts, lengths in ready:
            choices = []
            for index in range(len(texts) * sampling.n):
                text, stopped = cut_at_stop(out.texts[at + index], job.stop)
                choices.append({"text": text, "finish_reason": "length" if out.truncated[at + index] and not stopped else "stop",
                                "tokens": len(out.completion_ids[at + index])})
            at += len(texts) * sampling.n
            _answer(job, result={"choices": choices, "prompt_tokens": sum(lengths)})


def _checked(texts: list[str], max_chars: int) -> list[str]:
    if not texts or any(not isinstance(text, str) or not text for text in texts):
        raise BadRequest("every prompt must be a non-empty string")
    longest = max(len(text) for text in texts)
    if longest > max_chars:
        raise BadRequest(f"prompt of {longest} characters exceeds the server's limit of {max_chars}")
    return texts


def _answer(job: Job, result: dict | None = None, error: BaseException | None = None) -> None:
    if job.future is None:  # the preload job: nobody waits for it
        return

    def settle():
        if not job.future.done():  # the client may have gone
            job.future.set_exception(error) if error is not None else job.future.set_result(result)

    job.loop.call_soon_threadsafe(settle)
