"""Environments: multi-turn episodes in which the policy's text is answered, turn after turn, until the episode ends.

An environment is any object with `reset(row) -> str` and `step(assistant_text) -> (observation,
reward_parts, done)` (the `Environment` protocol), one instance per episode since it keeps the
episode's state. `reset` gets a prompts-table row as a dict (`prompt`, `answer`, `prompt_id`,
`extra`, ...) and returns the first observation; each `step` gets the policy's turn and returns
the text it reads next (None once done), this turn's reward parts and whether the episode is over.
An episode's reward parts are the sums of its turns' parts, so a count is reported as one per turn
and a bonus once, on the turn that earns it.

Built in: `tools` (ToolEnvironment: tool calls answered by their results, so tool use is one kind
of environment) and `guess_the_number` (GuessTheNumber: a game that needs the state across turns).
Others load as `package.module:Class` (any callable returning an environment), and OpenEnvAdapter
wraps an OpenEnv client. EpisodeLimits bound every episode; the rollout sampler enforces them.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from rl_assets.rollout.tools import FORMATS, ToolResult, execute_tool_calls, format_tool_results, load_tool, parse_tool_calls
from rl_assets.core.user_code import load_named


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: dict) -> str:
        """Start an episode for a prompts-table row; the first observation."""

    def step(self, assistant_text: str) -> tuple[str | None, dict[str, float], bool]:
        """The policy's turn in: (next observation or None, this turn's reward parts, done)."""


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 4  # policy turns per episode; an episode still running after them ends there, truncated
    max_tokens: int = 512  # policy tokens per episode, all turns together (observations do not count)

    def __post_init__(self):
        for name in ("max_turns", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"EpisodeLimits: {name} must be a positive integer, got {value!r}")


def _prompt(row: dict) -> str:
    if not isinstance(row.get("prompt"), str):
        raise ValueError(f"environment: row prompt_id={row.get('prompt_id')!r} has no `prompt` text")
    return row["prompt"]


class ToolEnvironment:
    """Each turn's tool calls run and their results are the next observation; a turn without calls ends the episode.

    Reward parts: `tool_calls` (calls made) and `tool_errors` (malformed, unknown, wrong arguments,
    failed or over the limit). Calls past `max_calls` in an episode are answered with an error, and a
    turn whose calls are all past it ends the episode. `results` holds the last turn's ToolResults,
    for a chat-template tokenizer (`tools.tool_messages`).

    >>> env = ToolEnvironment(["calculator"])
    >>> env.reset({"prompt": "12*34="})
    '12*34='
    >>> env.step("<call calculator>12*34</call>")
    ('<result>408</result>', {'tool_calls': 1.0, 'tool_errors': 0.0}, False)
    >>> env.step("408")
    (None, {'tool_calls': 0.0, 'tool_errors': 0.0}, True)
    """

    def __init__(self, tools: list[str], format: str = "tagged", max_calls: int = 4, max_output_chars: int = 2000):
        if format not in FORMATS:
            raise ValueError(f"format {format!r} is not one of {list(FORMATS)}")
        if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls <= 0:
            raise ValueError(f"max_calls must be a positive integer, got {max_calls!r}")
        self.tools = {}
        for name in tools:
            function = load_tool(name)
            if function.__name__ in self.tools:  # the policy calls a tool by its function's name: two would be one
                raise ValueError(f"two tools are named {function.__name__!r}: {tools}")
            self.tools[function.__name__] = function
        self.format, self.max_calls, self.max_output_chars = format, max_calls, max_output_chars
        self.stop_strings = ("</call>",) if format == "tagged" else ("</tool_call>",)  # the policy's turn ends with its call
        self.calls, self.results = 0, []

    def reset(self, row: dict) -> str:
        self.calls, self.results = 0, []
        return _prompt(row)

    def step(self, assistant_text: str) -> tuple[str | None, dict[str, float], bool]:
        calls = parse_tool_calls(assistant_text, self.format)
        allowed = max(self.max_calls - self.calls, 0)
        over = [ToolResult(c.name, c.arguments if isinstance(c.arguments, dict) else {}, "",
                           f"over the limit of {self.max_calls} tool calls per episode") for c in calls[allowed:]]
        self.results = execute_tool_calls(calls[:allowed], self.tools, self.max_output_chars) + over
        self.calls += len(calls)
        parts = {"tool_calls": float(len(calls)), "tool_errors": float(sum(r.error is not None for r in self.results))}
        if not calls or allowed == 0:
            return None, parts, True
        return format_tool_results(self.results, self.format), parts, False


class GuessTheNumber:
    """Guess a secret integer in [low, high]: each guess (the last integer of the turn) is answered "higher" or "lower"; the right one ends it.

    The secret is the row's `answer` (an integer string), or, for a row without one, drawn from its
    `prompt_id` (the same row always hides the same number). Reward parts: `solved` (1.0 on the
    turn that guesses it) and `turns` (1.0 a turn). A turn without a number is answered "say a number".

    >>> game = GuessTheNumber()
    >>> game.reset({"prompt": "Guess my number (1-100).", "answer": "42"})
    'Guess my number (1-100).'
    >>> [game.step(text) for text in ["50", "maybe 25?", "42"]]
    [('lower', {'solved': 0.0, 'turns': 1.0}, False), ('higher', {'solved': 0.0, 'turns': 1.0}, False), (None, {'solved': 1.0, 'turns': 1.0}, True)]
    """

    def __init__(self, low: int = 1, high: int = 100):
        if not (isinstance(low, int) and isinstance(high, int) and low < high):
            raise ValueError(f"guess_the_number: low and high must be integers with low < high, got {low!r} and {high!r}")
        self.low, self.high, self.secret = low, high, None

    def reset(self, row: dict) -> str:
        answer = str(row.get("answer") or "").strip()
        if answer:
            if not re.fullmatch(r"[-+]?\d+", answer) or not self.low <= int(answer) <= self.high:
                raise ValueError(f"guess_the_number: row prompt_id={row.get('prompt_id')!r}: answer {answer!r} is not an integer "
                                 f"in [{self.low}, {self.high}]")
            self.secret = int(answer)
        elif row.get("prompt_id"):
            digest = int(hashlib.sha256(str(row["prompt_id"]).encode()).hexdigest(), 16)
            self.secret = self.low + digest % (self.high - self.low + 1)
        else:
            raise ValueError("guess_the_number: a row needs an `answer` (the secret) or a `prompt_id` to draw it from")
        return row.get("prompt") or f"Guess the number between {self.low} and {self.high}."

    def step(self, assistant_text: str) -> tuple[str | None, dict[str, float], bool]:
        numbers = re.findall(r"(?<!\d)-?\d+", assistant_text)  # "5-7" reads 5 and 7, not 5 and -7
        if not numbers:
            return "say a number", {"solved": 0.0, "turns": 1.0}, False
        guess = int(numbers[-1])
        if guess == self.secret:
            return None, {"solved": 1.0, "turns": 1.0}, True
        return "higher" if guess < self.secret else "lower", {"solved": 0.0, "turns": 1.0}, False


class OpenEnvAdapter:
    """An OpenEnv client as an Environment: the turn becomes an action, the StepResult's observation the next text.

    `env` is a synchronous client: OpenEnv's `HTTPEnvClient`, or an async `EnvClient`'s `.sync()`.
    Its `reset(**kwargs)` and `step(action)` return a `StepResult(observation, reward, done)`;
    `reset_kwargs(row)` gives reset's arguments (a seed, say). The reward part is `reward`, the
    StepResult's reward (None counts 0), one per turn.
    """

    def __init__(self, env: Any, to_action: Callable[[str], Any], observation_text: Callable[[Any], str] = str,
                 reset_kwargs: Callable[[dict], dict] | None = None):
        self.env, self.to_action, self.observation_text, self.reset_kwargs = env, to_action, observation_text, reset_kwargs

    def reset(self, row: dict) -> str:
        result = self.env.reset(**(self.reset_kwargs(row) if self.reset_kwargs else {}))
        return self.observation_text(result.observation)

    def step(self, assistant_text: str) -> tuple[str | None, dict[str, float], bool]:
        result = self.env.step(self.to_action(assistant_text))
        done = bool(result.done)
        return (None if done else self.observation_text(result.observation)), {"reward": float(result.reward or 0.0)}, done


BUILT_IN = {"tools": ToolEnvironment, "guess_the_number": GuessTheNumber}


def load_environment(name: str, options: dict | None = None) -> Callable[[], Environment]:
    """A factory of fresh environments: a built-in by name or `package.module:Class`, with `options` for its constructor.

    One instance is built now, so an unknown tool or a bad option stops here rather than mid-rollout.

    >>> load_environment("guess_the_number", {"hi": 10})
    Traceback (most recent call last):
    ...
    ValueError: rollouts.environment: 'guess_the_number' has no option 'hi'; its options: ['high', 'low']
    """
    make = load_named(name, BUILT_IN, "rollouts.environment", "environment")
    options = options or {}
    try:
        parameters = inspect.signature(make).parameters
    except (TypeError, ValueError):
        parameters = None  # cannot be checked here; building one below still is
    if parameters is not None and not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        unknown = sorted(set(options) - set(parameters))
        if unknown:
            raise ValueError(f"rollouts.environment: {name!r} has no option {', '.join(map(repr, unknown))}; its options: {sorted(parameters)}")
    factory = functools.partial(make, **options)
    try:
        environment = factory()
    except Exception as error:
        raise ValueError(f"rollouts.environment: {name!r} with options {options}: {type(error).__name__}: {error}") from None
    if not isinstance(environment, Environment):
        raise ValueError(f"rollouts.environment: {name!r} builds a {type(environment).__name__}, which lacks reset(row) and step(text)")
    return factory
