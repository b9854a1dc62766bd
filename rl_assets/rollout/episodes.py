"""Episodes: the policy acts, an environment (a tool, a game) answers, turn after turn, and every token is kept.

An episode starts from a prompts row: the environment's `reset(row)` gives the first observation,
the prompt. Each turn the policy generates until it ends its turn (an end-of-sequence id, or one of
the environment's `stop_strings`, e.g. `</call>` after a tool call), the environment's `step`
answers, and its observation is appended as tokens the policy did not write. The episode ends
when the environment says done, or at a limit: `max_turns` policy turns, `max_tokens` policy
tokens, or the model's context; an episode ended by a limit is `truncated`.

One token sequence per episode, after the prompt: `completion_ids` interleaves policy and
environment tokens and `completion_mask` tells them apart (1 = policy), so the log-prob pass, the
loss and the KL see the episode exactly as it was sampled and train on the policy's tokens only.
Episodes of a batch advance turn by turn together, so each turn is one batched `generate`.
A vision-language policy sees a row's images in every turn: its processor expands the first observation's
placeholders (added before the text where the environment wrote none) and each turn's forward gets the pixels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import torch

from rl_assets.data.prompts import encode_prompts


class EnvironmentFailed(RuntimeError):
    """An environment raised: names the environment, the episode and the turn."""


@dataclass
class Episode:
    row: dict
    sample_idx: int
    environment: object
    prompt_ids: list[int] = field(default_factory=list)
    vision: dict = field(default_factory=dict)  # the row's pixel inputs (a vision-language policy), {} without images
    ids: list[int] = field(default_factory=list)  # after the prompt: policy and environment tokens
    mask: list[int] = field(default_factory=list)  # 1 where the policy wrote the token
    turns: list[dict] = field(default_factory=list)  # {"role", "text", "start", "end"}: positions in `ids`
    tool_calls: list[dict] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)  # the environment's reward parts, summed over turns
    done: bool = False
    truncated: bool = False

    @property
    def policy_tokens(self) -> int:
        return sum(self.mask)

    def where(self, turn: int | None = None) -> str:
        at = f" turn {turn}" if turn is not None else ""
        return f"episode prompt_id={self.row.get('prompt_id')!r} sample {self.sample_idx}{at}"


@dataclass
class Episodes:
    """Sampled episodes in prompt-major order, the shape `rollouts.Completions` has plus what only episodes have."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    texts: list[str]  # the whole episode after the prompt, decoded (policy turns and observations)
    truncated: list[bool]
    completion_mask: list[list[int]]
    turns: list[list[dict]]
    tool_calls: list[list[dict]]
    num_turns: list[int]
    environment_rewards: list[str]  # JSON objects
    sampler_logprobs: None = None
    vision: list | None = None  # each episode's pixel inputs (a vision-language policy)


def end_of_turn(ids: list[int], tokenizer, eos_ids: set[int], stop_strings: tuple[str, ...]) -> tuple[list[int], bool]:
    """(the turn: `ids` up to and including the first end-of-sequence id or the token completing a stop string, whether it ended).

    >>> from rl_assets.core.tokenizer import build_tiny_tokenizer
    >>> tokenizer = build_tiny_tokenizer()
    >>> ids = tokenizer("<call f>1</call>xyz", add_special_tokens=False)["input_ids"]
    >>> turn, ended = end_of_turn(ids, tokenizer, {tokenizer.eos_token_id}, ("</call>",))
    >>> tokenizer.decode(turn), ended
    ('<call f>1</call>', True)
    """
    longest = max((len(s) for s in stop_strings), default=0)
    for index, token in enumerate(ids):
        if token in eos_ids:
            return ids[: index + 1], True
        # a stop string ends within the last `longest` characters, which at most that many tokens hold
        if stop_strings and any(s in tokenizer.decode(ids[max(0, index + 1 - longest) : index + 1]) for s in stop_strings):
            return ids[: index + 1], True
    return ids, False


class _StopStrings:
    """A transformers stopping criterion: a row is done once its new tokens end with one of `stop_strings`."""

    def __init__(self, tokenizer, stop_strings: tuple[str, ...], start: int):
        self.tokenizer, self.stop_strings, self.start = tokenizer, stop_strings, start
        self.window = max(len(s) for s in stop_strings)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        tails = self.tokenizer.batch_decode(input_ids[:, max(self.start, input_ids.shape[1] - self.window):])
        return torch.tensor([any(s in tail for s in self.stop_strings) for tail in tails], device=input_ids.device)


def observation_ids(tokenizer, text: str, policy_ended_with_eos: bool, eos_text: str | None) -> list[int]:
    """Tokens of an environment's observation, as the policy reads it next.

    With a chat template it is a `tool` turn between the policy's turns (the template's own text,
    found by rendering a conversation with and without it); plain text otherwise.
    """
    if getattr(tokenizer, "chat_template", None):
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        before = tokenizer.apply_chat_template(base, tokenize=False)
        after = tokenizer.apply_chat_template(base + [{"role": "tool", "content": text}], tokenize=False, add_generation_prompt=True)
        if after.startswith(before):
            closing = before[before.rindex("a") + 1 :]  # what ends an assistant turn in this template, e.g. "<|im_end|>\n"
            if policy_ended_with_eos and eos_text and closing.startswith(eos_text):
                closing = closing[len(eos_text) :]  # the policy already wrote it
            text = closing + after[len(before) :]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _call(episode: Episode, name: str, what: Callable, turn: int | None):
    try:
        return what()
    except Exception as error:
        raise EnvironmentFailed(f"environment {name!r} failed on {episode.where(turn)}: {type(error).__name__}: {error}") from error


def sample_episodes(model, tokenizer, rows: list[dict], samples_per_prompt: int, make_environment: Callable, environment_name: str, *,
                    greedy: bool, temperature: float, top_p: float, max_new_tokens: int, max_turns: int, max_tokens: int,
                    batch_size: int, seed: int, eos_ids: list[int], autocast=None, images: list[list] | None = None,
                    processor=None) -> Episodes:
    """`samples_per_prompt` episodes for each prompts row, `max_new_tokens` policy tokens a turn at most. `images`: each
    row's PIL images, shown through a vision-language policy's `processor`."""
    import contextlib

    from rl_assets.core.vision import batched, encode_with_images, placeholder_ids
    from rl_assets.rollout.generation import plain_generation_defaults, sampling_config

    torch.manual_seed(seed)
    device = next(model.parameters()).device
    context_limit = getattr(model.config.get_text_config(), "max_position_embeddings", None) or 10**9
    eos_text = tokenizer.decode([eos_ids[0]]) if eos_ids else None
    episodes = []
    for index, row in enumerate(rows):
        shown = images[index] if images is not None else []
        encoded = {}  # a row's samples mostly start from the same observation: its images are processed once
        for sample in range(samples_per_prompt):
            episode = Episode(row, sample, make_environment())
            first = _call(episode, environment_name, lambda: episode.environment.reset(dict(row)), None)
            if shown:
                placeholder = processor.image_token
                first = first if placeholder in first else placeholder * len(shown) + first
                if first not in encoded:
                    encoded[first] = encode_with_images(processor, [first], [shown])
                (episode.prompt_ids,), (episode.vision,) = encoded[first]
            else:
                episode.prompt_ids = encode_prompts(tokenizer, [first])[0]
            episodes.append(episode)
    stops = tuple(getattr(episodes[0].environment, "stop_strings", ())) if episodes else ()
    ends = set(eos_ids)
    with plain_generation_defaults(model), autocast or contextlib.nullcontext(), torch.no_grad():
        for turn in range(1, max_turns + 1):
            active = [e for e in episodes if not e.done]
            for start in range(0, len(active), batch_size):
                chunk = active[start : start + batch_size]
                contexts = [e.prompt_ids + e.ids for e in chunk]
                budgets = [min(max_new_tokens, max_tokens - e.policy_tokens, context_limit - len(c)) for e, c in zip(chunk, contexts)]
                width = max(map(len, contexts))
                config = sampling_config(eos_ids, tokenizer.pad_token_id, greedy=greedy, temperature=temperature, top_p=top_p,
                                         max_new_tokens=max(1, max(budgets)), suppress=placeholder_ids(model.config))
                input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(c)) + c for c in contexts], device=device)
                attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device)
                criteria = [_StopStrings(tokenizer, stops, width)] if stops else None
                pixels = batched([e.vision for e in chunk], model, input_ids) if any(e.vision for e in chunk) else {}
                generated = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config, stopping_criteria=criteria,
                                           **pixels)
                for episode, budget, new in zip(chunk, budgets, generated[:, width:].tolist()):
                    _advance(episode, new[: max(budget, 0)], turn, tokenizer, ends, stops, environment_name, eos_text,
                             out_of_room=budget < 1 or episode.policy_tokens + budget >= max_tokens or len(episode.prompt_ids + episode.ids) + budget >= context_limit)
        for episode in episodes:
            if not episode.done:  # still going after max_turns
                episode.done = episode.truncated = True
    return Episodes(
        prompt_ids=[e.prompt_ids for e in episodes], completion_ids=[e.ids for e in episodes],
        texts=[tokenizer.decode(e.ids, skip_special_tokens=True) for e in episodes], truncated=[e.truncated for e in episodes],
        completion_mask=[e.mask for e in episodes], turns=[e.turns for e in episodes], tool_calls=[e.tool_calls for e in episodes],
        num_turns=[sum(t["role"] == "assistant" for t in e.turns) for e in episodes],
        environment_rewards=[json.dumps(e.rewards, sort_keys=True) for e in episodes],
        vision=[e.vision for e in episodes] if any(e.vision for e in episodes) else None)


def _advance(episode: Episode, new: list[int], turn: int, tokenizer, ends: set[int], stops: tuple[str, ...], name: str,
             eos_text: str | None, out_of_room: bool) -> None:
    """One policy turn into `episode`, then the environment's answer to it (unless a limit ends the episode first)."""
    ids, ended = end_of_turn(new, tokenizer, ends, stops)
    start = len(episode.ids)
    episode.ids += ids
    episode.mask += [1] * len(ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    episode.turns.append({"role": "assistant", "text": text, "start": start, "end": len(episode.ids)})
    if not ended and out_of_room:  # cut off by the episode's token budget or the context: not a turn the environment can read
        episode.done = episode.truncated = True
        return
    observation, parts, done = _call(episode, name, lambda: episode.environment.step(text), turn)
    for key, value in (parts or {}).items():
        episode.rewards[key] = episode.rewards.get(key, 0.0) + float(value)
    for result in getattr(episode.environment, "results", None) or []:  # a tool environment's calls of this turn
        episode.tool_calls.append({"turn": turn, "name": result.name, "arguments": json.dumps(result.arguments, sort_keys=True),
                                   "output": result.output, "error": result.error})
    if done or observation is None:
        episode.done, episode.truncated = True, not ended  # the last turn was cut at max_new_tokens
        return
    observed = observation_ids(tokenizer, observation, bool(ids) and ids[-1] in ends, eos_text)
    start = len(episode.ids)
    episode.ids += observed
    episode.mask += [0] * len(observed)
    episode.turns.append({"role": "environment", "text": observation, "start": start, "end": len(episode.ids)})
