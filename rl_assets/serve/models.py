"""The model side of `rl-assets serve`: checkpoints by name, loaded once, and one thread that batches requests.

Every request becomes a `Job` on one queue. A single worker thread owns the models and tokenizers: it
takes the first waiting job, drains the jobs that queued up meanwhile (up to `max_batch` completions),
and runs one batched `generate` per group of jobs that share a checkpoint and sampling settings. So
requests that arrive while a batch is generating share the next one, and nothing else touches torch.

Fairness: a job is generated a slice at a time (at most `max_batch` completions), and a job with slices
left goes to the back of the queue, so a request of 500 prompts x 16 samples lets the small requests that
arrived meanwhile through between its slices. Each job costs prompts x n x max_tokens completion tokens:
one above `max_request_tokens` is refused (400), and one that would take the tokens admitted and not yet
answered past `max_queued_tokens` is told to come back (429). A job whose client hung up is dropped at its
next slice.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.run_params import PromotionParams
from rl_assets.serve.generate import critic_of, resolve_checkpoint, token_scores
from rl_assets.eval.promotion import read_card

LINEAGE_KEYS = ("checkpoint_id", "round", "parent", "algorithm", "params_hash", "code_version", "trained_on", "experiment")


class BadRequest(ValueError):
    """A request the model cannot take (too long a prompt, an empty one): answered 400 with this message."""


class UnknownModel(FileNotFoundError):
    """No checkpoint by that name: answered 404."""


class Busy(RuntimeError):
    """The server has admitted as much work as it takes: answered 429, with when to retry."""


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
    images: list | None = None  # the chat's images (PIL), in the order of their parts, for a vision-language model
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False  # each token's log-prob with each choice
    critic: Path | None = None  # and each token's value by this value model (PPO's rNN/critic)
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future | None = None
    cancelled: bool = False  # the client hung up: no more slices
    finished: bool = False  # answered (or dropped), its tokens given back to the budget
    texts: list[str] | None = None  # the prompts as generated (chat rendered), once checked
    lengths: list[int] = field(default_factory=list)
    choices: list[dict] = field(default_factory=list)  # the slices done so far

    @property
    def cost(self) -> int:
        """The completion tokens this job may generate: prompts x n x max_tokens."""
        return len(self.prompts or [1]) * self.sampling.n * self.sampling.max_tokens

    def slice_prompts(self, max_batch: int) -> int:
        """How many prompts its next slice takes: at most `max_batch` completions, at least one prompt."""
        left = len(self.texts if self.texts is not None else self.prompts or [1]) - len(self.choices) // self.sampling.n
        return max(1, min(left, max_batch // self.sampling.n))


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

    def __init__(self, root: Path, promotion: PromotionParams, data: Path, device: str = "cpu", keep: int = 2):
        self.root, self.promotion, self.data, self.device, self.keep = root, promotion, data, device, keep
        self.loaded: dict[str, tuple] = {}  # checkpoint id -> (model, tokenizer); touched by the worker thread only

    def resolve(self, name: str) -> tuple[Path, dict]:
        """(folder, lineage) of a model name; `UnknownModel` when there is none (or it lies outside the project)."""
        try:
            path = resolve_checkpoint(name, self.promotion, self.root, self.data)
        except FileNotFoundError as error:
            raise UnknownModel(str(error)) from None
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise UnknownModel(f"{name!r}: not a checkpoint of this project")
        return path, lineage_of(path)

    def critic_for(self, path: Path) -> Path:
        """The value model of the round that made checkpoint `path`; BadRequest when that round trained none (not PPO)."""
        try:
            return critic_of(path, self.data)
        except FileNotFoundError as error:
            raise BadRequest(f"values: {error}") from None

    def get(self, path: Path):
        """(model, tokenizer) of a checkpoint folder, loaded once and kept (the `keep` most recent)."""
        from rl_assets.core.policy import load_policy

        return self._cached(path, lambda: load_policy(path, self.device))

    def get_critic(self, path: Path):
        from rl_assets.train.critic import load_critic

        return self._cached(path, lambda: load_critic(path, self.device))

    def _cached(self, path: Path, load):
        key = read_lineage(path)["checkpoint_id"]  # `promoted` may have changed since the last request: the id says
        if key not in self.loaded:
            while len(self.loaded) >= self.keep:
                self.loaded.pop(next(iter(self.loaded)))
            self.loaded[key] = load()
        return self.loaded[key]


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The prompt text of a chat: the tokenizer's chat template, else the messages' contents one per line (an image part as
    the tokenizer's image placeholder)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = lambda content: content if isinstance(content, str) else "".join(  # noqa: E731
        getattr(tokenizer, "image_token", "") if part["type"] == "image" else part["text"] for part in content)
    return "\n".join(text(message["content"]) for message in messages)


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """The text before the first stop string, and whether one was found.

    >>> cut_at_stop("12\\nNext", ["\\n"])
    ('12', True)
    """
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


class Batcher:
    """One worker thread that runs every job, batching those waiting together (see the module docstring)."""

    def __init__(self, pool: ModelPool, max_batch: int = 32, max_prompt_chars: int = 20_000, on_batch=None,
                 max_request_tokens: int = 32 * 256, max_queued_tokens: int | None = None, rendering=None):
        self.pool, self.max_batch, self.max_prompt_chars, self.on_batch = pool, max_batch, max_prompt_chars, on_batch
        self.rendering = rendering  # the params' prompts section: completions' prompts are rendered as training's were
        self.max_request_tokens = max_request_tokens
        self.max_queued_tokens = 4 * max_request_tokens if max_queued_tokens is None else max_queued_tokens
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="rl-assets-batcher", daemon=True)
        self.busy_since: float | None = None  # when the batch now generating began (None: idle)
        self.queued_tokens = 0  # the cost of the jobs admitted and not yet answered
        self.refused_busy = 0  # requests told to come back (429)
        self._lock = threading.Lock()

    def stuck_for(self) -> float | None:
        """Seconds the worker has been on its current batch, None when it is idle; `inf` when the worker is gone."""
        if not self.thread.is_alive():
            return float("inf")
        return None if self.busy_since is None else time.monotonic() - self.busy_since

    def load(self) -> dict:
        """What /health shows of the queue: the tokens admitted, the budget, whether a request of the largest size is refused now."""
        return {"queued_tokens": self.queued_tokens, "max_queued_tokens": self.max_queued_tokens, "jobs_waiting": self.jobs.qsize(),
                "saturated": self.queued_tokens + self.max_request_tokens > self.max_queued_tokens, "refused_busy": self.refused_busy}

    def start(self, preload: Path | None = None) -> None:
        if preload is not None:
            self.jobs.put(Job(preload, Sampling()))  # loads the model before the first request; no future to answer
        self.thread.start()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=30)

    def admit(self, job: Job) -> None:
        """Take `job`'s cost from the budget, or raise BadRequest (too large ever) or Busy (too large now)."""
        if job.cost > self.max_request_tokens:
            raise BadRequest(f"this request may generate {job.cost:,} tokens ({len(job.prompts or [1])} prompts x n={job.sampling.n} "
                             f"x max_tokens={job.sampling.max_tokens}), more than the server's limit of {self.max_request_tokens:,} "
                             "a request: split it")
        with self._lock:
            if self.queued_tokens + job.cost > self.max_queued_tokens:
                self.refused_busy += 1
                raise Busy(f"the server has {self.queued_tokens:,} tokens of requests to generate (limit {self.max_queued_tokens:,}); "
                           "retry in a moment")
            self.queued_tokens += job.cost

    async def submit(self, job: Job) -> dict:
        self.admit(job)
        job.loop = asyncio.get_running_loop()
        job.future = job.loop.create_future()
        self.jobs.put(job)
        try:
            return await job.future
        except asyncio.CancelledError:  # the request's task was cancelled: the client went away
            job.cancelled = True
            raise

    def _release(self, job: Job) -> None:
        with self._lock:
            self.queued_tokens -= job.cost

    def _work(self) -> None:
        while (first := self.jobs.get()) is not None:
            batch, size = [first], first.slice_prompts(self.max_batch) * first.sampling.n
            while size < self.max_batch:  # what queued up while the last batch ran
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self.jobs.put(None)
                    break
                batch.append(job)
                size += job.slice_prompts(self.max_batch) * job.sampling.n
            groups: dict[tuple, list[Job]] = {}
            for job in batch:
                if job.cancelled:  # the client hung up: generate nothing more for it
                    self._finish(job)
                    continue
                groups.setdefault((job.path, job.sampling), []).append(job)
            self.busy_since = time.monotonic()
            for (path, sampling), jobs in groups.items():
                self._run(path, sampling, jobs)
            self.busy_since = None
            for job in batch:
                if job.future is None or job.finished:
                    continue
                if job.cancelled or job.future.done():  # its client hung up while this batch ran
                    self._finish(job)
                else:  # slices left: after the jobs that came while this batch ran
                    self.jobs.put(job)

    def _finish(self, job: Job, result: dict | None = None, error: BaseException | None = None) -> None:
        if job.future is not None and not job.finished:
            job.finished = True
            self._release(job)
        _answer(job, result=result, error=error)

    def _rendered(self, prompts: list[str], tokenizer) -> list[str]:
        from rl_assets.data.prompts import render

        return prompts if self.rendering is None else [render(prompt, self.rendering, tokenizer) for prompt in prompts]

    def _run(self, path: Path, sampling: Sampling, jobs: list[Job]) -> None:
        from rl_assets.core.vision import is_vision_model
        from rl_assets.data.prompts import encode_prompts
        from rl_assets.rollout.generation import generate

        try:
            model, tokenizer = self.pool.get(path)
        except Exception as error:  # noqa: BLE001 - a checkpoint that fails to load answers every job waiting on it
            for job in jobs:
                self._finish(job, error=error)
            return
        limit = getattr(model.config, "max_position_embeddings", None)
        ready, prompts = [], []
        for job in jobs:
            if job.future is None:  # the preload job
                continue
            if job.texts is None:  # its first slice: check every prompt once
                try:
                    if job.images and not is_vision_model(model.config):
                        raise BadRequest(f"the model {path.name} ({type(model).__name__}) reads text only; send images to a vision-language checkpoint")
                    texts = (self._rendered(_checked(job.prompts, self.max_prompt_chars), tokenizer) if job.prompts is not None
                             else [render_chat(tokenizer, job.messages)])
                    lengths = [len(ids) for ids in encode_prompts(tokenizer, _checked(texts, self.max_prompt_chars))]
                    if limit and max(lengths) + sampling.max_tokens > limit:
                        raise BadRequest(f"prompt of {max(lengths)} tokens plus max_tokens={sampling.max_tokens} exceeds the model's "
                                         f"context of {limit} tokens")
                except Exception as error:  # noqa: BLE001 - a bad prompt fails its own request, not the batch
                    self._finish(job, error=error if isinstance(error, BadRequest) else BadRequest(str(error)))
                    continue
                job.texts, job.lengths = texts, lengths
            start = len(job.choices) // sampling.n
            part = job.texts[start : start + job.slice_prompts(self.max_batch)]
            ready.append((job, part))
            prompts += part
        if not ready:
            return
        started = time.perf_counter()
        try:
            images, processor = None, None
            if any(job.images for job, _ in ready):  # a chat job is one prompt
                from rl_assets.core.vision import load_processor

                images = [list(job.images or []) for job, part in ready for _ in part]
                processor = load_processor(path, tokenizer, model.config)
            out = generate(model, tokenizer, prompts, sampling.n, greedy=sampling.temperature == 0,
                           temperature=sampling.temperature or 1.0, top_p=sampling.top_p, max_new_tokens=sampling.max_tokens,
                           batch_size=max(len(prompts) * sampling.n, 1), seed=sampling.seed, images=images, processor=processor)
        except Exception as error:  # noqa: BLE001 - answered 500 to each job; the worker keeps serving
            for job, _ in ready:
                self._finish(job, error=error)
            return
        if self.on_batch:
            self.on_batch(len(prompts) * sampling.n, sum(map(len, out.completion_ids)), time.perf_counter() - started)
        at = 0
        for job, part in ready:
            rows = range(at, at + len(part) * sampling.n)
            try:
                scores = self._scores(job, model, tokenizer, out, rows, sampling) if job.logprobs else None
            except Exception as error:  # noqa: BLE001 - a value model that fails to load fails its own request
                self._finish(job, error=error)
                at += len(rows)
                continue
            for index, row in enumerate(rows):
                text, stopped = cut_at_stop(out.texts[row], job.stop)
                choice = {"text": text, "finish_reason": "length" if out.truncated[row] and not stopped else "stop",
                          "tokens": len(out.completion_ids[row])}
                if scores is not None:
                    choice["scores"] = _up_to(scores[index], len(text)) if stopped else scores[index]
                job.choices.append(choice)
            at += len(rows)
            if len(job.choices) == len(job.texts) * sampling.n:
                self._finish(job, result={"choices": job.choices, "prompt_tokens": sum(job.lengths)})


    def _scores(self, job: Job, model, tokenizer, out, rows: range, sampling: Sampling) -> list[dict]:
        """token_scores of a job's rows of the batch: log-probs at the request's temperature, values by its value model."""
        critic = self.pool.get_critic(job.critic) if job.critic is not None else None
        if critic is not None and job.images:
            raise BadRequest("values with images: a value model reads text only")
        return token_scores(model, tokenizer, [out.prompt_ids[r] for r in rows], [out.completion_ids[r] for r in rows],
                            sampling.temperature or 1.0, critic, vision=[out.vision[r] for r in rows] if out.vision else None)


def _up_to(scores: dict, chars: int) -> dict:
    """The scores of the tokens that wrote a choice's first `chars` characters (the text before its stop string)."""
    kept, written = 0, 0
    while kept < len(scores["tokens"]) and written < chars:
        written += len(scores["tokens"][kept])
        kept += 1
    return {key: value[:kept] if isinstance(value, list) else value for key, value in scores.items()}


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
