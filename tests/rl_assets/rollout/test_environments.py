"""environments.py: the state the built-in environments keep across turns, the OpenEnv adapter against a client shaped like
OpenEnv's, loading environments and their options, and the episode limits."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from typing import Any

import pytest

from rl_assets.rollout.environments import (BUILT_IN, Environment, EpisodeLimits, GuessTheNumber, OpenEnvAdapter, ToolEnvironment,
                                    load_environment)

USER_MODULE = "rl_assets_test_user_environments"


def play(env, row: dict, turns: list[str]) -> list[tuple]:
    """Reset with `row`, then one step per turn; the first observation followed by each step's result."""
    return [env.reset(row)] + [env.step(turn) for turn in turns]


def totals(steps: list[tuple]) -> dict[str, float]:
    """An episode's reward parts: the sums of its turns' parts."""
    summed = {}
    for _, parts, _ in steps:
        for key, value in parts.items():
            summed[key] = summed.get(key, 0.0) + value
    return summed


# --- GuessTheNumber --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer,turns,replies", [
    ("42", ["50", "I think 25", "between 25 and 50: 37", "42"], ["lower", "higher", "higher", None]),
    ("42", ["42"], [None]),
    (" 7 ", ["hmm", "first 50 then 5", "so 5-7"], ["say a number", "higher", None]),  # a range's last number is 7, not -7
    ("1", ["-3", "0", "1"], ["higher", "higher", None]),
])
def test_guess_the_number_answers_each_turn(answer, turns, replies):
    game = GuessTheNumber()
    first, *steps = play(game, {"prompt": "Guess.", "answer": answer, "prompt_id": "p"}, turns)
    assert first == "Guess."
    assert [observation for observation, _, _ in steps] == replies
    assert [done for _, _, done in steps] == [False] * (len(turns) - 1) + [True]
    assert totals(steps) == {"solved": 1.0, "turns": float(len(turns))}


def test_guess_the_number_unsolved_episode_scores_no_solve():
    steps = play(GuessTheNumber(), {"prompt": "Guess.", "answer": "10"}, ["1", "2", "99"])[1:]
    assert [s[0] for s in steps] == ["higher", "higher", "lower"] and not any(s[2] for s in steps)
    assert totals(steps) == {"solved": 0.0, "turns": 3.0}


def test_binary_search_solves_within_seven_turns_for_every_secret():
    """Playing against the replies needs the game to remember its secret across turns."""
    game = GuessTheNumber(1, 100)
    for secret in range(1, 101):
        game.reset({"prompt": "Guess.", "answer": str(secret)})
        low, high, turns = 1, 100, 0
        while True:
            guess, turns = (low + high) // 2, turns + 1
            observation, parts, done = game.step(f"my guess is {guess}")
            if done:
                break
            low, high = (guess + 1, high) if observation == "higher" else (low, guess - 1)
        assert guess == secret and parts["solved"] == 1.0 and turns <= 7


def test_guess_the_number_draws_the_secret_from_the_prompt_id():
    def secret(prompt_id: str, low: int = 1, high: int = 100) -> int:
        game = GuessTheNumber(low, high)
        game.reset({"prompt": "Guess.", "prompt_id": prompt_id, "answer": None})
        return game.secret

    secrets = [secret(f"id{i}") for i in range(50)]
    assert secrets == [secret(f"id{i}") for i in range(50)]  # the same row hides the same number, in any process
    assert all(1 <= s <= 100 for s in secrets) and len(set(secrets)) > 20
    assert all(5 <= secret(f"id{i}", 5, 6) <= 6 for i in range(20)) and len({secret(f"id{i}", 5, 6) for i in range(20)}) == 2


def test_guess_the_number_reset_starts_a_new_episode():
    game = GuessTheNumber()
    assert game.reset({"answer": "3"}) == "Guess the number between 1 and 100."  # a row without a prompt
    assert game.step("3")[2] is True
    game.reset({"prompt": "again", "answer": "80"})
    assert game.step("3") == ("higher", {"solved": 0.0, "turns": 1.0}, False)


@pytest.mark.parametrize("row,message", [
    ({"prompt": "Guess.", "answer": "forty", "prompt_id": "p7"}, "row prompt_id='p7': answer 'forty' is not an integer in [1, 100]"),
    ({"prompt": "Guess.", "answer": "4.5", "prompt_id": "p7"}, "answer '4.5' is not an integer"),
    ({"prompt": "Guess.", "answer": "101", "prompt_id": "p7"}, "answer '101' is not an integer in [1, 100]"),
    ({"prompt": "Guess."}, "a row needs an `answer` (the secret) or a `prompt_id`"),
])
def test_guess_the_number_bad_rows(row, message):
    with pytest.raises(ValueError, match="^guess_the_number: ") as error:
        GuessTheNumber().reset(row)
    assert message in str(error.value)


@pytest.mark.parametrize("low,high", [(5, 5), (10, 1), (1.5, 10), ("1", 10)])
def test_guess_the_number_bad_range(low, high):
    with pytest.raises(ValueError, match="low and high must be integers with low < high"):
        GuessTheNumber(low, high)


# --- ToolEnvironment -------------------------------------------------------------------------------------------------

def test_tool_environment_turns():
    env = ToolEnvironment(["calculator"])
    first, *steps = play(env, {"prompt": "What is 12*34+5?", "prompt_id": "p"},
                         ["<call calculator>12*34</call>", "<call calculator>408+5</call><call calculator>1/0</call>", "413"])
    assert first == "What is 12*34+5?"
    assert steps == [
        ("<result>408</result>", {"tool_calls": 1.0, "tool_errors": 0.0}, False),
        ("<result>413</result>\n<result>error: ValueError: calculator: division by zero</result>", {"tool_calls": 2.0, "tool_errors": 1.0}, False),
        (None, {"tool_calls": 0.0, "tool_errors": 0.0}, True),
    ]
    assert totals(steps) == {"tool_calls": 3.0, "tool_errors": 1.0}


def test_tool_environment_counts_malformed_and_unknown_calls_as_errors():
    env = ToolEnvironment(["calculator"])
    env.reset({"prompt": "x"})
    observation, parts, done = env.step("<call sum>1</call> <call calculator>2")
    assert parts == {"tool_calls": 2.0, "tool_errors": 2.0} and done is False
    assert observation == ("<result>error: unknown tool 'sum'; tools: ['calculator']</result>\n"
                           "<result>error: the call is not closed with </call></result>")


def test_tool_environment_limits_calls_per_episode():
    env = ToolEnvironment(["calculator"], max_calls=2)
    env.reset({"prompt": "x"})
    observation, parts, done = env.step("<call calculator>1+1</call><call calculator>2+2</call><call calculator>3+3</call>")
    assert observation == "<result>2</result>\n<result>4</result>\n<result>error: over the limit of 2 tool calls per episode</result>"
    assert (parts, done) == ({"tool_calls": 3.0, "tool_errors": 1.0}, False)
    observation, parts, done = env.step("<call calculator>4+4</call>")  # nothing left to run: the episode ends
    assert (observation, parts, done) == (None, {"tool_calls": 1.0, "tool_errors": 1.0}, True)
    assert [r.error for r in env.results] == ["over the limit of 2 tool calls per episode"]
    env.reset({"prompt": "y"})  # a new episode has its calls again
    assert env.step("<call calculator>5+5</call>") == ("<result>10</result>", {"tool_calls": 1.0, "tool_errors": 0.0}, False)


def test_tool_environment_hermes_format_keeps_results_for_chat_templates():
    from rl_assets.rollout.tools import tool_messages

    env = ToolEnvironment(["calculator"], format="hermes")
    env.reset({"prompt": "x"})
    observation, _, done = env.step('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2**5"}}\n</tool_call>')
    assert observation == "<tool_response>\n32\n</tool_response>" and done is False
    assert tool_messages(env.results) == [{"role": "tool", "name": "calculator", "content": "32"}]
    assert env.step("<call calculator>1</call>")[2] is True  # the tagged format is plain text here


@pytest.mark.parametrize("options,message", [
    ({"tools": ["nope"]}, "rollouts.tools: unknown tool 'nope'"),
    ({"tools": ["calculator", "calculator"]}, "two tools are named 'calculator'"),
    ({"tools": ["calculator"], "format": "xml"}, "format 'xml' is not one of ['hermes', 'tagged']"),
    ({"tools": ["calculator"], "max_calls": 0}, "max_calls must be a positive integer, got 0"),
])
def test_tool_environment_bad_options(options, message):
    with pytest.raises(ValueError) as error:
        ToolEnvironment(**options)
    assert message in str(error.value)


def test_tool_environment_needs_a_prompt():
    with pytest.raises(ValueError, match="row prompt_id='p3' has no `prompt` text"):
        ToolEnvironment(["calculator"]).reset({"prompt_id": "p3"})


# --- OpenEnv ---------------------------------------------------------------------------------------------------------

@dataclass
class StepResult:  # openenv.core.client_types.StepResult
    observation: Any
    reward: float | None = None
    done: bool = False
    metadata: dict | None = None


@dataclass
class EchoObservation:
    echoed_message: str


@dataclass
class EchoAction:
    message: str


class FakeEchoClient:
    """Shaped like OpenEnv's synchronous clients (HTTPEnvClient, EnvClient.sync()): reset(**kwargs) and step(action) -> StepResult."""

    def __init__(self):
        self.resets, self.actions = [], []

    def reset(self, **kwargs) -> StepResult:
        self.resets.append(kwargs)
        return StepResult(EchoObservation("ready"))

    def step(self, action: EchoAction) -> StepResult:
        self.actions.append(action)
        return StepResult(EchoObservation(action.message.upper()), reward=None if action.message == "hi" else 0.5, done=action.message == "bye")


def test_openenv_adapter():
    client = FakeEchoClient()
    env = OpenEnvAdapter(client, to_action=EchoAction, observation_text=lambda o: o.echoed_message,
                         reset_kwargs=lambda row: {"seed": len(row["prompt_id"])})
    assert isinstance(env, Environment)
    steps = play(env, {"prompt": "say hi", "prompt_id": "abc"}, ["hi", "there", "bye"])
    assert steps == ["ready", ("HI", {"reward": 0.0}, False), ("THERE", {"reward": 0.5}, False), (None, {"reward": 0.5}, True)]
    assert client.resets == [{"seed": 3}] and client.actions == [EchoAction("hi"), EchoAction("there"), EchoAction("bye")]


def test_openenv_adapter_defaults():
    client = FakeEchoClient()
    env = OpenEnvAdapter(client, to_action=EchoAction)
    assert env.reset({"prompt": "x"}) == "EchoObservation(echoed_message='ready')" and client.resets == [{}]


# --- loading ---------------------------------------------------------------------------------------------------------

def test_load_built_ins_gives_fresh_instances():
    factory = load_environment("guess_the_number", {"low": 1, "high": 10})
    first, second = factory(), factory()
    assert first is not second and (first.low, first.high) == (1, 10)
    first.reset({"answer": "3"})
    second.reset({"answer": "9"})
    assert first.step("5")[0] == "lower" and second.step("5")[0] == "higher"  # each keeps its own state
    tools = load_environment("tools", {"tools": ["calculator"], "max_calls": 1})()
    assert isinstance(tools, ToolEnvironment) and tools.max_calls == 1
    assert all(isinstance(load_environment(name, {"tools": ["calculator"]} if name == "tools" else None)(), Environment) for name in BUILT_IN)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user environment module in a fresh working directory (load_environment puts the cwd on sys.path), forgotten afterwards."""
    (tmp_path / f"{USER_MODULE}.py").write_text(textwrap.dedent("""
        class Countdown:
            def __init__(self, start=3):
                self.start = start

            def reset(self, row):
                self.left = self.start
                return f"{self.left} left"

            def step(self, assistant_text):
                self.left -= 1
                return (None if self.left == 0 else f"{self.left} left"), {"steps": 1.0}, self.left == 0

        class NoStep:
            def reset(self, row):
                return ""

        def flexible(**options):
            return Countdown(**options)

        NOT_CALLABLE = 3
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    sys.modules.pop(USER_MODULE, None)


def test_load_user_environment(user_module):
    env = load_environment(f"{USER_MODULE}:Countdown", {"start": 2})()
    assert play(env, {}, ["a", "b"]) == ["2 left", ("1 left", {"steps": 1.0}, False), (None, {"steps": 1.0}, True)]
    assert load_environment(f"{USER_MODULE}:flexible", {"start": 1})().start == 1  # **options: checked by building one


@pytest.mark.parametrize("name,options,message", [
    ("nope", None, "unknown environment 'nope'; built in: ['guess_the_number', 'tools'], or use 'module:Class'"),
    ("guess_the_number", {"hi": 10, "lo": 1}, "'guess_the_number' has no option 'hi', 'lo'; its options: ['high', 'low']"),
    ("guess_the_number", {"low": 10, "high": 1}, "'guess_the_number' with options {'low': 10, 'high': 1}: ValueError: guess_the_number: low and high"),
    ("tools", None, "'tools' with options {}: TypeError:"),  # `tools` is required
    ("tools", {"tools": ["nope"]}, "rollouts.tools: unknown tool 'nope'"),
    ("no_such_module_xyz:Env", None, "cannot load 'no_such_module_xyz:Env': No module named 'no_such_module_xyz'"),
    (f"{USER_MODULE}:Missing", None, f"module '{USER_MODULE}' has no attribute 'Missing'"),
    (f"{USER_MODULE}:NOT_CALLABLE", None, f"'{USER_MODULE}:NOT_CALLABLE' is not callable"),
    (f"{USER_MODULE}:NoStep", None, f"'{USER_MODULE}:NoStep' builds a NoStep, which lacks reset(row) and step(text)"),
    (f"{USER_MODULE}:Countdown", {"begin": 1}, "has no option 'begin'; its options: ['start']"),
    (f"{USER_MODULE}:flexible", {"begin": 1}, "TypeError: Countdown.__init__() got an unexpected keyword argument 'begin'"),
])
def test_load_environment_errors(user_module, name, options, message):
    with pytest.raises(ValueError, match="^rollouts.environment: ") as error:
        load_environment(name, options)
    assert message in str(error.value)


# --- limits ----------------------------------------------------------------------------------------------------------

def test_episode_limits():
    assert (EpisodeLimits().max_turns, EpisodeLimits().max_tokens) == (4, 512)
    assert EpisodeLimits(max_turns=1, max_tokens=64) == EpisodeLimits(1, 64)
    for bad in ({"max_turns": 0}, {"max_tokens": -1}, {"max_turns": 2.0}, {"max_tokens": True}):
        with pytest.raises(ValueError, match="EpisodeLimits: max_t.* must be a positive integer"):
            EpisodeLimits(**bad)
