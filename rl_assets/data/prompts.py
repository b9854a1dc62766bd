"""prompts: dedupe raw problems, split them by a stable hash, drop over-long prompts.

Three splits: `eval` (held out), `sft` (reference answers for the warm start) and `rl` (prompts the
rounds sample from). RL on prompts the warm start has not memorised is what makes its gains carry
over to held-out prompts.

The text the policy sees is `prompts.template` with the problem filled in, then, with
`prompts.chat_template`, wrapped as one user turn by the tokenizer's chat template (with the
generation prompt). `prompt_id` hashes the problem, the answer and the images (their ids) only: neither the
templates nor the `extra` reward inputs, so two rows with the same problem, answer and images are one prompt
(the first kept). The same question about two images is two prompts, each with its own answer.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from rl_assets.core.config import PromptsParams
from rl_assets.core.schemas import PROMPTS
from rl_assets.data.images import open_images


def prompt_id(problem: str, answer: str, image_ids: list[str] = ()) -> str:
    """Stable content hash of a problem, its reference answer and the images it shows (a text prompt's id has no images part).

    >>> prompt_id("2+2=", "4") == prompt_id("2+2=", "4") != prompt_id("2+2=", "5")
    True
    >>> prompt_id("How many?", "3", ["ab12"]) != prompt_id("How many?", "3", ["cd34"]) != prompt_id("How many?", "3")
    True
    """
    images = "".join(f"\0image:{identifier}" for identifier in image_ids)
    return hashlib.sha256(f"{problem}\0{answer}{images}".encode()).hexdigest()[:16]


def split_of(pid: str, eval_fraction: float, sft_fraction: float) -> str:
    """'eval', 'sft' or 'rl', decided by the id alone so adding data never moves a row.

    >>> split_of(prompt_id("2+2=", "4"), 0.5, 0.5) in {"eval", "sft", "rl"}
    True
    """
    bucket = int(hashlib.sha256(f"split:{pid}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    if bucket < eval_fraction:
        return "eval"
    return "sft" if bucket < eval_fraction + sft_fraction * (1 - eval_fraction) else "rl"


def require_text_prompts(prompts: pa.Table, model: str, reads_images: bool = False) -> None:
    """Stop a model stage whose prompts show images to a policy that reads text only: a round that sampled and trained
    on the text alone would report training on images the policy never saw.

    >>> require_text_prompts(pa.table({"image_ids": [["ab12"], []]}), "tiny")
    Traceback (most recent call last):
    ...
    ValueError: 1 of 2 prompts show images, but the policy (tiny) reads text only: use a vision-language policy (model.vision for the embedded one, or a VLM's folder), or remove the sources' image column
    >>> require_text_prompts(pa.table({"image_ids": [["ab12"], []]}), "tiny", reads_images=True)
    """
    if reads_images:
        return
    if "image_ids" in prompts.column_names and (shown := sum(1 for ids in prompts["image_ids"].to_pylist() if ids)):
        raise ValueError(f"{shown} of {prompts.num_rows} prompts show images, but the policy ({model}) reads text only: use a vision-language "
                         "policy (model.vision for the embedded one, or a VLM's folder), or remove the sources' image column")


class ChatTemplateError(ValueError):
    """prompts.chat_template is on but the policy tokenizer has no chat template."""


def render(problem: str, params: PromptsParams, tokenizer, images: int = 0) -> str:
    """The prompt text for one problem: the template, then the chat template when asked for.

    A vision-language policy's tokenizer (one with an `image_token`) gets a placeholder per image before the text,
    or, through a chat template, an image content part per image (the layout VLM chat templates take); the
    processor expands each into the image's tokens at sampling time. A text policy gets the text alone.
    """
    text = params.template.replace("{prompt}", problem)
    placeholder = getattr(tokenizer, "image_token", None) if images else None
    if params.chat_template is False:
        return placeholder * images + text if placeholder else text
    custom = params.chat_template if isinstance(params.chat_template, str) else None
    if custom is None and not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(f"prompts.chat_template: the policy tokenizer ({type(tokenizer).__name__}) has no chat template; "
                                "set chat_template to a Jinja template string, or to false")
    content = [{"type": "image"}] * images + [{"type": "text", "text": text}] if placeholder else text
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], chat_template=custom, tokenize=False, add_generation_prompt=True)


def encode_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each prompt, special tokens added once.

    A chat template that starts with the BOS text (Llama 3's `<|begin_of_text|>`) would otherwise get
    a second BOS from the tokenizer's own post-processor.
    """
    bos = tokenizer.bos_token_id
    encoded = tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else []
    return [ids[1:] if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos else ids for ids in encoded]


def _question(record: dict) -> tuple[str, tuple[str, ...]]:
    """What a reference answer answers: the problem text and the images it shows."""
    return record["prompt"], tuple(record.get("image_ids") or ())


def _answer_policy(records: list[dict], policy: str) -> dict[tuple, str | None]:
    """{(problem, image ids): the answer kept (None: none)} for every question that appears with more than one answer.

    >>> rows = [{"prompt": "3+4=", "answer": a, "source": "f.jsonl", "source_row": i} for i, a in enumerate(["7", "6", "7"])]
    >>> _answer_policy(rows, "first"), _answer_policy(rows, "drop")
    ({('3+4=', ()): '7'}, {('3+4=', ()): None})
    """
    answers: dict[tuple, dict[str, list[str]]] = {}
    for record in records:
        where = f"{record.get('source')}:{record.get('source_row')}"
        answers.setdefault(_question(record), {}).setdefault(record["answer"], []).append(where)
    conflicting = {problem: found for problem, found in answers.items() if len(found) > 1}
    if conflicting and policy == "error":
        shown = [f"{problem!r}" + (f" (image {images[0][:12]})" if images else "") + ": "
                 + ", ".join(f"{answer!r} ({', '.join(rows[:3])}{', ...' if len(rows) > 3 else ''})" for answer, rows in found.items())
                 for (problem, images), found in list(conflicting.items())[:5]]
        raise ValueError(f"{len(conflicting)} problems appear with different answers (source:row):\n  " + "\n  ".join(shown)
                         + "\nFix the data, or set prompts.conflicting_answers to drop (leave them out) or first (keep the first answer)")
    return {question: next(iter(found)) if policy == "first" else None for question, found in conflicting.items()}


def build_prompts(raw: pa.Table, params: PromptsParams, tokenizer, image_tokens: int | Callable[[object], int] = 1,
                  images_dir: Path | None = None) -> tuple[pa.Table, dict]:
    """The `PROMPTS` table and counts of what was dropped (duplicates, conflicting answers, over-long prompts).

    `image_tokens`: how many tokens each image's placeholder expands into (rl_assets.core.tokenizer.tokens_per_image), or
    a function counting them for a picture, each stored picture then read from `images_dir`; counted in a prompt's
    length (`n_tokens`, max_prompt_tokens) as the policy will read it.
    """
    seen, rows = set(), []
    dropped = {"duplicates": 0, "too_long": 0, "conflicting": 0}
    records = raw.to_pylist()
    keep = _answer_policy(records, params.conflicting_answers)
    for record in records:
        if _question(record) in keep and keep[_question(record)] != record["answer"]:
            dropped["conflicting"] += 1
            continue
        image_ids = record.get("image_ids") or []
        pid = prompt_id(record["prompt"], record["answer"], image_ids)
        if pid in seen:
            dropped["duplicates"] += 1
            continue
        seen.add(pid)
        rows.append({"prompt_id": pid, "prompt": render(record["prompt"], params, tokenizer, len(image_ids)), "problem": record["prompt"], "answer": record["answer"],
                     "split": split_of(pid, params.eval_fraction, params.sft_fraction),
                     "image_ids": image_ids, **{k: record[k] for k in ("source", "source_hash", "source_row", "extra")}})
    count = functools.cache(lambda i: image_tokens(open_images([[i]], images_dir)[0][0])) if callable(image_tokens) else lambda i: image_tokens
    lengths = [len(ids) + sum(count(i) - 1 for i in row["image_ids"])  # what generation will feed
               for ids, row in zip(encode_prompts(tokenizer, [r["prompt"] for r in rows]), rows)]
    kept = []
    for row, length in zip(rows, lengths):
        if length > params.max_prompt_tokens:
            dropped["too_long"] += 1
            continue
        kept.append({**row, "n_tokens": length})
    if rows and not kept:  # an empty table would replace a good one, and the rounds fail later naming something else
        longest = max(range(len(rows)), key=lengths.__getitem__)
        raise ValueError(f"prompts.max_prompt_tokens: {params.max_prompt_tokens} drops every prompt ({len(rows)} of {len(rows)}); "
                         f"the shortest has {min(lengths)} tokens, the longest {lengths[longest]} ({rows[longest]['source']} row "
                         f"{rows[longest]['source_row']}: {rows[longest]['problem'][:60]!r}); raise it to {lengths[longest]} to keep them all")
    table = pa.Table.from_pylist(kept, schema=PROMPTS)
    return table, dropped
