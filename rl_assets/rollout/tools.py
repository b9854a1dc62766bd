"""Tools: plain functions the policy calls from its own text, parsed, run and answered without ever raising.

A tool is a Python function with type hints and a Google-style docstring (`Args:` naming every
parameter), the shape TRL's `tools=` and transformers chat templates take; `tool_schema` gives its
JSON schema. Built in: `calculator` (exact arithmetic, no eval) and `python` (the bubblewrap sandbox
of `rl_assets/core/sandbox.py`). Others load as `package.module:function` from the project.

Two call formats:

- `"hermes"`, what Qwen2.5 / Hermes chat templates teach: one or more blocks of
  `<tool_call>\\n{"name": "calculator", "arguments": {"expression": "12*34"}}\\n</tool_call>`;
  results go back as `role: tool` messages (`tool_messages`), or as `<tool_response>` blocks.
- `"tagged"`, short enough for the embedded character-level model to learn (every character is a
  token of its vocabulary): `<call calculator>12*34</call>`, answered `<result>408</result>`
  (`<result>error: ...</result>` on failure). The argument is the text between the tags, given to
  the tool's one required parameter; several parameters go as a JSON object,
  `<call f>{"a": 1, "b": 2}</call>` (an argument that parses as a JSON object is always read so).
  Other tags (`<answer>`, `<think>`) are not calls.

A malformed call (bad JSON, unclosed tag, no name) is a ToolCall with `error` set, and running it,
an unknown tool, wrong arguments or a tool that raises are ToolResults with `error` set: the
policy sees what went wrong and the rollout goes on.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import signal
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from rl_assets.core.sandbox import Limits, require_sandbox, run_sandboxed
from rl_assets.core.user_code import load_named

FORMATS = ("hermes", "tagged")  # see the module docstring
MAX_EXPRESSION_CHARS = 1000  # the calculator's input; longer is not arithmetic a policy should be writing
MAX_BITS = 4096  # numerator and denominator of every calculator value (~1,200 digits): 9**9**9 stops here
OUTPUT_CHARS = 2000  # tool output kept, in `python` and by default in `execute_tool_calls`
PYTHON_LIMITS = Limits(cpu_seconds=2, memory_mb=512, wall_seconds=5, max_processes=8)  # a tool call, not a test suite


def _bits(value: Fraction) -> int:
    return max(abs(value.numerator).bit_length(), value.denominator.bit_length())


def _bounded(value: Fraction) -> Fraction:
    if _bits(value) > MAX_BITS:
        raise ValueError(f"calculator: a value has more than {MAX_BITS} bits (about {MAX_BITS * 3 // 10} digits)")
    return value


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ValueError("calculator: an exponent must be an integer (the result would not be exact)")
    # Estimate before computing: 2**10**9 would take minutes and gigabytes to build only to be refused.
    if (_bits(base) - 1) * abs(exponent.numerator) > MAX_BITS:
        raise ValueError(f"calculator: the power has more than {MAX_BITS} bits (about {MAX_BITS * 3 // 10} digits)")
    return base ** exponent.numerator


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
           ast.FloorDiv: lambda a, b: Fraction(a // b), ast.Mod: lambda a, b: a % b, ast.Pow: _power}
_UNARY = {ast.UAdd: lambda a: a, ast.USub: lambda a: -a}


def _evaluate(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _bounded(_BINARY[type(node.op)](_evaluate(node.left, source), _evaluate(node.right, source)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, source))
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _bounded(Fraction(node.value))
    if isinstance(node, ast.Constant) and type(node.value) is float:
        literal = ast.get_source_segment(source, node).replace("_", "")  # the text, not the float: 0.1 is exactly 1/10
        exponent = re.search(r"[eE]([+-]?\d+)", literal)
        if exponent and abs(int(exponent.group(1))) > MAX_BITS:  # Fraction("1e99999999") would build that power of ten first
            raise ValueError(f"calculator: the number {literal} is too large or too small")
        return _bounded(Fraction(literal))
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise ValueError(f"calculator: {what} is not allowed (only numbers, + - * / // % **, unary + - and parentheses)")


def calculator(expression: str) -> str:
    """Exact arithmetic on integers and decimals with + - * / // % ** and parentheses.

    The result is an integer, or a reduced fraction such as 3/10 when it is not one.

    Args:
        expression: The arithmetic expression, such as "12*34" or "(1.5+2)/7".

    Returns:
        The exact value as an integer or a fraction a/b.

    Raises:
        ValueError: Not arithmetic (names, calls, ...), division by zero, or a result too large.

    >>> [calculator(e) for e in ["12*34", "0.1+0.2", "-(7 // 2) ** 3", "2/4", "1e3 % 7"]]
    ['408', '3/10', '-27', '1/2', '6']
    >>> calculator("9**9**9")
    Traceback (most recent call last):
    ...
    ValueError: calculator: the power has more than 4096 bits (about 1228 digits)
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"calculator: the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        with warnings.catch_warnings():  # "77*4a" warns before it fails: the policy's typo is its tool error, not the log's
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
        value = _evaluate(tree.body, expression.strip())
    except SyntaxError as error:
        raise ValueError(f"calculator: not an arithmetic expression ({error.msg})") from None
    except ZeroDivisionError:
        raise ValueError("calculator: division by zero") from None
    except (RecursionError, MemoryError):  # nesting deep enough to exhaust the parser or the walk
        raise ValueError("calculator: the expression is nested too deeply") from None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def python(code: str) -> str:
    """Run a Python program in a sandbox (no network, no files kept, a few seconds of CPU) and return what it prints.

    Args:
        code: The program; use print() to show results.

    Returns:
        Its standard output (the first 2000 characters).

    Raises:
        ValueError: The program failed (the last line of its error) or timed out.
    """
    outcome = run_sandboxed({"main.py": code}, ["main.py"], limits=PYTHON_LIMITS)
    if outcome.timed_out:
        raise ValueError(f"timed out (wall-clock limit of {PYTHON_LIMITS.wall_seconds:g} s)")
    # RLIMIT_CPU ends a busy loop before the wall clock: the program is its PID namespace's init, which ignores
    # SIGXCPU, so the hard limit's SIGKILL ends it, and bwrap reports that as the exit status 128 + 9.
    if outcome.returncode == 128 + signal.SIGKILL:
        raise ValueError(f"timed out (CPU limit of {PYTHON_LIMITS.cpu_seconds} s)")
    if outcome.returncode != 0:
        lines = outcome.stderr.strip().splitlines()
        raise ValueError(lines[-1] if lines else f"exit status {outcome.returncode}")
    return outcome.stdout.rstrip()[:OUTPUT_CHARS]


BUILT_IN = {f.__name__: f for f in (calculator, python)}


def tool_schema(function: Callable) -> dict:
    """The JSON schema transformers' chat templates and TRL take for a tool (what `tools=[function]` would build).

    >>> tool_schema(calculator)["function"]["parameters"]["required"]
    ['expression']
    """
    from transformers.utils import get_json_schema  # here: importing this module must not import transformers

    return get_json_schema(function)


def load_tool(name: str) -> Callable:
    """A built-in tool by name, or `package.module:function` from the user's project (imported and checked now)."""
    function = load_named(name, BUILT_IN, "rollouts.tools", "tool")
    try:  # the schema is what the policy is shown: a tool without one cannot be described to it
        tool_schema(function)
    except Exception as error:
        raise ValueError(f"rollouts.tools: {name!r} needs type hints on every parameter and a docstring whose Args: "
                         f"describes each: {error}") from None
    if function is python:
        require_sandbox()  # now, with the reason, rather than as an error inside every call of a rollout
    return function


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict | str  # a JSON object's keys, or a tagged call's bare text (for the tool's one required parameter)
    raw: str  # the call as the policy wrote it
    error: str | None = None  # why it is malformed; None when it can run


@dataclass(frozen=True)
class ToolResult:
    name: str
    arguments: dict  # as the tool received them
    output: str
    error: str | None = None


# format -> (where a call opens, how it closes)
_SYNTAX = {"hermes": (re.compile(r"<tool_call>"), "</tool_call>"), "tagged": (re.compile(r"<call\b"), "</call>")}
_TAGGED_HEAD = re.compile(r"<call ([A-Za-z_][A-Za-z0-9_]*)>")


def _hermes_call(raw: str) -> ToolCall:
    try:
        value = json.loads(raw[len("<tool_call>"):-len("</tool_call>")])
    except json.JSONDecodeError as error:
        return ToolCall("", {}, raw, f"the call is not valid JSON ({error.msg})")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(value.get("arguments", {}), dict):
        return ToolCall("", {}, raw, 'a call is {"name": string, "arguments": object}')
    return ToolCall(value["name"], value.get("arguments", {}), raw)


def _tagged_call(raw: str) -> ToolCall:
    head = _TAGGED_HEAD.match(raw)
    if head is None:
        return ToolCall("", {}, raw, "a call opens with <call NAME>")
    body = raw[head.end():-len("</call>")]
    try:
        arguments = json.loads(body)
    except json.JSONDecodeError:
        arguments = None
    return ToolCall(head.group(1), arguments if isinstance(arguments, dict) else body, raw)


def parse_tool_calls(text: str, format: str) -> list[ToolCall]:
    """The tool calls in `text`, in order; malformed ones carry `error` (this never raises for any text).

    >>> parse_tool_calls("so <call calculator>12*34</call>", "tagged")
    [ToolCall(name='calculator', arguments='12*34', raw='<call calculator>12*34</call>', error=None)]
    >>> [c.error for c in parse_tool_calls('<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call><tool_call>{"name"', "hermes")]
    [None, 'the call is not closed with </tool_call>']
    """
    if format not in FORMATS:
        raise ValueError(f"tool call format {format!r} is not one of {list(FORMATS)}")
    (opening, close), calls, position = _SYNTAX[format], [], 0
    while found := opening.search(text, position):
        end = text.find(close, found.end())
        if end < 0:
            calls.append(ToolCall("", {}, text[found.start():], f"the call is not closed with {close}"))
            break
        position = end + len(close)
        calls.append((_hermes_call if format == "hermes" else _tagged_call)(text[found.start():position]))
    return calls


def _bind(function: Callable, arguments: dict | str) -> dict:
    """Keyword arguments for `function`: a bare text goes to its one required parameter; TypeError when they do not fit."""
    signature = inspect.signature(function)
    if isinstance(arguments, str):
        required = [n for n, p in signature.parameters.items() if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if len(required) != 1:
            raise TypeError(f"it takes parameters {list(signature.parameters)}: give them as a JSON object")
        arguments = {required[0]: arguments}
    signature.bind(**arguments)
    return arguments


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _run(call: ToolCall, tools: dict[str, Callable], max_chars: int) -> ToolResult:
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    if call.error is not None:
        return ToolResult(call.name, arguments, "", call.error)
    if call.name not in tools:
        return ToolResult(call.name, arguments, "", f"unknown tool {call.name!r}; tools: {sorted(tools)}")
    try:
        arguments = _bind(tools[call.name], call.arguments)
    except (TypeError, ValueError) as error:  # ValueError: a callable whose signature cannot be read
        return ToolResult(call.name, arguments, "", f"wrong arguments for {call.name}: {error}")
    try:
        return ToolResult(call.name, arguments, _clip(str(tools[call.name](**arguments)), max_chars))
    except Exception as error:  # the tool's failure is the policy's feedback, not the rollout's end
        return ToolResult(call.name, arguments, "", _clip(f"{type(error).__name__}: {error}", max_chars))


def execute_tool_calls(calls: list[ToolCall], tools: dict[str, Callable], max_chars: int = OUTPUT_CHARS) -> list[ToolResult]:
    """Run each call with the tool of its name; every failure is a ToolResult with `error` (this never raises).

    >>> [(r.output, r.error) for r in execute_tool_calls(parse_tool_calls("<call calculator>1/0</call><call sum>1</call>", "tagged"),
    ...                                                  {"calculator": calculator})]
    [('', 'ValueError: calculator: division by zero'), ('', "unknown tool 'sum'; tools: ['calculator']")]
    """
    return [_run(call, tools, max_chars) for call in calls]


def _content(result: ToolResult) -> str:
    return result.output if result.error is None else f"error: {result.error}"


def format_tool_results(results: list[ToolResult], format: str) -> str:
    """The results as the text the policy reads next: `<result>` tags, or Qwen's `<tool_response>` blocks for hermes.

    >>> format_tool_results([ToolResult("calculator", {}, "408"), ToolResult("f", {}, "", "boom")], "tagged")
    '<result>408</result>\\n<result>error: boom</result>'
    """
    if format not in FORMATS:
        raise ValueError(f"tool call format {format!r} is not one of {list(FORMATS)}")
    if format == "tagged":
        return "\n".join(f"<result>{_content(r)}</result>" for r in results)
    return "\n".join(f"<tool_response>\n{_content(r)}\n</tool_response>" for r in results)  # as Qwen2.5's template renders them


def tool_messages(results: list[ToolResult]) -> list[dict]:
    """The results as chat messages, for a tokenizer's chat template to render."""
    return [{"role": "tool", "name": r.name, "content": _content(r)} for r in results]


def tool_call_prompt(tools: dict[str, Callable], format: str) -> str:
    """A short system text describing the tools and how to call them (chat templates given `tools=` do this themselves)."""
    schemas = [tool_schema(function)["function"] for function in tools.values()]
    if format == "hermes":
        listed = "\n".join(json.dumps({"type": "function", "function": s}) for s in schemas)
        return (f"You may call functions to help you. They are:\n<tools>\n{listed}\n</tools>\nTo call one, write\n"
                f'<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')
    if format != "tagged":
        raise ValueError(f"tool call format {format!r} is not one of {list(FORMATS)}")
    listed = "\n".join(f"{s['name']}({', '.join(s['parameters']['properties'])}): {s['description'].splitlines()[0]}" for s in schemas)
    return f"Tools:\n{listed}\nCall one with <call NAME>ARGUMENT</call>; the result comes back as <result>...</result>."
