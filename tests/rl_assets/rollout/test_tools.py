"""tools.py: the exact calculator, the sandboxed python tool, parsing both call formats, running calls without ever
raising, formatting results, schemas and loading tools."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from fractions import Fraction

import pytest

from rl_assets.rollout import tools
from rl_assets.core.sandbox import Limits
from rl_assets.rollout.tools import (ToolCall, ToolResult, calculator, execute_tool_calls, format_tool_results, load_tool, parse_tool_calls,
                             python, tool_call_prompt, tool_messages, tool_schema)

from rl_assets_support import REPO

USER_MODULE = "rl_assets_test_user_tools"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def fails(text: str) -> str:
    """Always fails.

    Args:
        text: Anything.
    """
    raise RuntimeError("boom")


def chatty(text: str) -> str:
    """Says a lot.

    Args:
        text: Anything.
    """
    return "x" * 5000


TOOLS = {"calculator": calculator, "add": add, "fails": fails, "chatty": chatty}


# --- calculator -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expression,expected", [
    ("12*34", "408"),
    ("0.1+0.2", "3/10"),  # decimal literals are exact: no 0.30000000000000004
    ("1/3 + 1/6", "1/2"),
    ("6 / 4", "3/2"),
    ("-7/2", "-7/2"),
    ("(1.5+2)/7", "1/2"),
    ("2**10", "1024"),
    ("2 ** 3 ** 2", "512"),  # right-associative, as in Python
    ("2**-2", "1/4"),
    ("(-2)**3", "-8"),
    ("-3 // 2", "-2"),  # floor division rounds down, as in Python
    ("-7 % 3", "2"),
    ("7.5 % 2", "3/2"),
    ("+-+5", "-5"),
    ("1e3 + 1_000", "2000"),
    ("2.5e-1", "1/4"),
    ("0x10 + 0b11", "19"),
    ("123456789012345678901234567890 * 10 + 1", "1234567890123456789012345678901"),
    (" ( 1 ) ", "1"),
    ("1 ** 100000000", "1"),  # a huge exponent of 1 is no danger
    ("10**1000", "1" + "0" * 1000),  # within the bound
])
def test_calculator_is_exact(expression, expected):
    assert calculator(expression) == expected
    assert Fraction(calculator(expression)) == Fraction(expected)


def test_calculator_matches_python_on_integer_arithmetic():
    rng = random.Random(0)
    for _ in range(200):
        a, b, c = (rng.randint(-999, 999) for _ in range(3))
        op1, op2 = rng.choice("+-*"), rng.choice(["+", "-", "*", "//", "%"])
        if op2 in ("//", "%") and c == 0:
            continue
        expression = f"({a} {op1} {b}) {op2} {c}"
        assert calculator(expression) == str(eval(expression)), expression  # eval of digits and operators only, in the test


@pytest.mark.parametrize("expression,message", [
    ("9**9**9", "the power has more than 4096 bits"),
    ("2**100000", "the power has more than 4096 bits"),
    ("10**1000 * 10**1000", "a value has more than 4096 bits"),  # each is fine, the product is not
    ("(10**1000)**2", "the power has more than 4096 bits"),
    ("1e99999999", "too large or too small"),
    ("1/0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("5 // (2 - 2)", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("2 ** 0.5", "an exponent must be an integer"),
    ("x + 1", "Name is not allowed"),
    ("abs(-1)", "Call is not allowed"),
    ("__import__('os').system('touch /tmp/pwned')", "Call is not allowed"),
    ("(1).real", "Attribute is not allowed"),
    ("'a' * 3", "Constant is not allowed"),
    ("True + 1", "Constant is not allowed"),
    ("1j * 1j", "Constant is not allowed"),
    ("1 < 2", "Compare is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("1 << 2000", "LShift is not allowed"),
    ("~1", "Invert is not allowed"),
    ("3 @ 4", "MatMult is not allowed"),
    ("1 if 1 else 2", "IfExp is not allowed"),
    ("1 +", "not an arithmetic expression"),
    ("import os", "not an arithmetic expression"),
    ("", "not an arithmetic expression"),
    ("(" * 300 + "1" + ")" * 300, "calculator: "),  # the parser's nesting limit, as a ValueError
    ("1" * 1001, "longer than 1000 characters"),
])
def test_calculator_refuses(expression, message):
    with pytest.raises(ValueError, match="calculator: ") as error:
        calculator(expression)
    assert message in str(error.value)


# --- parsing ---------------------------------------------------------------------------------------------------------

def hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


@pytest.mark.parametrize("text,expected", [
    ("<call calculator>12*34</call>", [("calculator", "12*34", None)]),
    ("I will compute. <call calculator>1+1</call> and <call python>print(1)\nprint(2)</call> then answer",
     [("calculator", "1+1", None), ("python", "print(1)\nprint(2)", None)]),
    ('<call add>{"a": 1, "b": 2}</call>', [("add", {"a": 1, "b": 2}, None)]),
    ('<call add>{"a": 1</call>', [("add", '{"a": 1', None)]),  # not a JSON object: the bare text
    ("<call calculator></call>", [("calculator", "", None)]),
    ("<call calculator>12*34", [("", {}, "the call is not closed with </call>")]),
    ("<call calculator>1</call><call calculator>2", [("calculator", "1", None), ("", {}, "the call is not closed with </call>")]),
    ("<call>12</call>", [("", {}, "a call opens with <call NAME>")]),
    ("<call calc ulator>12</call>", [("", {}, "a call opens with <call NAME>")]),
    ("<call 9lives>12</call>", [("", {}, "a call opens with <call NAME>")]),
    ("<answer>408</answer> <result>1</result> <callback>x</callback>", []),  # other tags are not calls
    ("408", []),
    ("", []),
])
def test_parse_tagged(text, expected):
    assert [(c.name, c.arguments, c.error) for c in parse_tool_calls(text, "tagged")] == expected


@pytest.mark.parametrize("text,expected", [
    (hermes('{"name": "calculator", "arguments": {"expression": "12*34"}}'), [("calculator", {"expression": "12*34"}, None)]),
    ("thinking " + hermes('{"name": "a", "arguments": {}}') + "\n" + hermes('{"name": "b", "arguments": {"x": [1]}}'),
     [("a", {}, None), ("b", {"x": [1]}, None)]),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call>', [("f", {}, None)]),  # no newlines
    (hermes('{"name": "f"}'), [("f", {}, None)]),  # a function without parameters
    (hermes('{"name": "f", "arguments": {"x": 1}'), [("", {}, "the call is not valid JSON (Expecting ',' delimiter)")]),
    (hermes("calculator(12*34)"), [("", {}, "the call is not valid JSON (Expecting value)")]),
    (hermes('{"arguments": {}}'), [("", {}, 'a call is {"name": string, "arguments": object}')]),
    (hermes('{"name": 3, "arguments": {}}'), [("", {}, 'a call is {"name": string, "arguments": object}')]),
    (hermes('{"name": "f", "arguments": [1]}'), [("", {}, 'a call is {"name": string, "arguments": object}')]),
    (hermes('["f", {}]'), [("", {}, 'a call is {"name": string, "arguments": object}')]),
    ('<tool_call>\n{"name": "f", "arguments": {}}', [("", {}, "the call is not closed with </tool_call>")]),
    ("<call calculator>1</call>", []),  # the other format is plain text here
])
def test_parse_hermes(text, expected):
    assert [(c.name, c.arguments, c.error) for c in parse_tool_calls(text, "hermes")] == expected


def test_parse_keeps_the_raw_call():
    text = 'a <call add>{"a": 1, "b": 2}</call> b ' + hermes('{"name": "add"}')
    assert [c.raw for c in parse_tool_calls(text, "tagged")] == ['<call add>{"a": 1, "b": 2}</call>']
    assert [c.raw for c in parse_tool_calls(text, "hermes")] == [hermes('{"name": "add"}')]


def test_parse_refuses_an_unknown_format():
    with pytest.raises(ValueError, match="format 'json' is not one of"):
        parse_tool_calls("", "json")


# --- running calls ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,format,expected", [
    ("<call calculator>12*34</call>", "tagged", [("calculator", {"expression": "12*34"}, "408", None)]),
    ('<call add>{"a": 1, "b": 2}</call>', "tagged", [("add", {"a": 1, "b": 2}, "3", None)]),  # output is the str() of the value
    (hermes('{"name": "add", "arguments": {"a": 2, "b": 3}}'), "hermes", [("add", {"a": 2, "b": 3}, "5", None)]),
    ("<call nope>1</call>", "tagged", [("nope", {}, "", "unknown tool 'nope'; tools: ['add', 'calculator', 'chatty', 'fails']")]),
    ("<call add>1</call>", "tagged", [("add", {}, "", "wrong arguments for add: it takes parameters ['a', 'b']: give them as a JSON object")]),
    ('<call add>{"a": 1}</call>', "tagged", [("add", {"a": 1}, "", "wrong arguments for add: missing a required argument: 'b'")]),
    (hermes('{"name": "calculator", "arguments": {}}'), "hermes",
     [("calculator", {}, "", "wrong arguments for calculator: missing a required argument: 'expression'")]),
    (hermes('{"name": "calculator", "arguments": {"expression": "1", "x": 2}}'), "hermes",
     [("calculator", {"expression": "1", "x": 2}, "", "wrong arguments for calculator: got an unexpected keyword argument 'x'")]),
    ("<call calculator>1/0</call>", "tagged", [("calculator", {"expression": "1/0"}, "", "ValueError: calculator: division by zero")]),
    ("<call fails>x</call>", "tagged", [("fails", {"text": "x"}, "", "RuntimeError: boom")]),
    ("<call chatty>x</call>", "tagged", [("chatty", {"text": "x"}, "x" * 100 + "...", None)]),  # clipped at max_chars
    ("<call calculator>1", "tagged", [("", {}, "", "the call is not closed with </call>")]),
    (hermes("{bad"), "hermes", [("", {}, "", "the call is not valid JSON (Expecting property name enclosed in double quotes)")]),
])
def test_execute(text, format, expected):
    results = execute_tool_calls(parse_tool_calls(text, format), TOOLS, max_chars=100)
    assert [(r.name, r.arguments, r.output, r.error) for r in results] == expected


def test_execute_never_raises_on_any_text():
    """Random texts built from the pieces of both formats: every call found gets exactly one result, none raises."""
    pieces = ["<call ", "calculator", "add", "fails", "nope", ">", "</call>", "<tool_call>", "</tool_call>", '{"name": "add"',
              '"arguments": {"a": 1, "b": 2}}', '{"a": "x", "b": []}', "}", "12*34", "1/0", "9**9**9", "__import__('os')", " ", "\n"]
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        for format in ("tagged", "hermes"):
            calls = parse_tool_calls(text, format)
            results = execute_tool_calls(calls, TOOLS)
            assert len(results) == len(calls) and all(isinstance(r, ToolResult) for r in results)
            assert all(r.output == "" for r in results if r.error is not None)


def test_execute_turns_a_tool_without_a_readable_signature_into_an_error():
    results = execute_tool_calls([ToolCall("calculator", "1", "<call calculator>1</call>")], {"calculator": object()})
    assert results[0].error.startswith("wrong arguments for calculator: ")


# --- formatting results ----------------------------------------------------------------------------------------------

RESULTS = [ToolResult("calculator", {"expression": "12*34"}, "408"), ToolResult("python", {"code": "1/0"}, "", "ZeroDivisionError: division by zero")]


def test_format_tool_results():
    assert format_tool_results(RESULTS, "tagged") == "<result>408</result>\n<result>error: ZeroDivisionError: division by zero</result>"
    assert format_tool_results(RESULTS, "hermes") == (
        "<tool_response>\n408\n</tool_response>\n<tool_response>\nerror: ZeroDivisionError: division by zero\n</tool_response>")
    assert format_tool_results([], "tagged") == ""
    with pytest.raises(ValueError, match="format 'xml' is not one of"):
        format_tool_results(RESULTS, "xml")


def test_tool_messages():
    assert tool_messages(RESULTS) == [{"role": "tool", "name": "calculator", "content": "408"},
                                      {"role": "tool", "name": "python", "content": "error: ZeroDivisionError: division by zero"}]


def test_tagged_format_fits_the_tiny_tokenizer():
    from rl_assets.core.tokenizer import TINY_CHARACTERS  # transformers: only this test needs it

    text = "<call calculator>12*34</call>" + format_tool_results(RESULTS, "tagged") + tool_call_prompt({"calculator": calculator}, "tagged")
    assert set(text) <= set(TINY_CHARACTERS), set(text) - set(TINY_CHARACTERS)


# --- schemas, prompts and loading ------------------------------------------------------------------------------------

@pytest.mark.parametrize("function,parameter", [(calculator, "expression"), (python, "code")])
def test_built_in_schemas(function, parameter):
    schema = tool_schema(function)
    assert schema["type"] == "function" and schema["function"]["name"] == function.__name__
    assert schema["function"]["parameters"]["properties"][parameter]["type"] == "string"
    assert schema["function"]["parameters"]["required"] == [parameter]
    assert ">>>" not in json.dumps(schema)  # the doctests stay out of what the policy is shown
    assert schema["function"]["description"] and schema["function"]["parameters"]["properties"][parameter]["description"]


def test_tool_call_prompt():
    tagged = tool_call_prompt({"calculator": calculator, "add": add}, "tagged")
    assert "calculator(expression): Exact arithmetic" in tagged and "add(a, b): Add two integers." in tagged and "<call NAME>" in tagged
    hermes_prompt = tool_call_prompt({"calculator": calculator}, "hermes")
    listed = hermes_prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(listed)["function"]["name"] == "calculator" and "<tool_call>" in hermes_prompt
    with pytest.raises(ValueError, match="format 'xml' is not one of"):
        tool_call_prompt({"calculator": calculator}, "xml")


def test_load_built_in():
    assert load_tool("calculator") is calculator


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user tool module in a fresh working directory (load_tool puts the cwd on sys.path), forgotten afterwards."""
    (tmp_path / f"{USER_MODULE}.py").write_text(textwrap.dedent('''
        NOT_A_FUNCTION = 3

        def double(x: int) -> int:
            """Twice x.

            Args:
                x: A number.
            """
            return 2 * x

        def no_docstring(x: int) -> int:
            return x

        def no_hint(x) -> int:
            """Hi.

            Args:
                x: A number.
            """

        def undocumented_argument(x: int, y: int) -> int:
            """Hi.

            Args:
                x: A number.
            """
    '''))
    (tmp_path / "rl_assets_test_broken_tools.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in (USER_MODULE, "rl_assets_test_broken_tools"):
        sys.modules.pop(name, None)


def test_load_user_tool(user_module):
    assert load_tool(f"{USER_MODULE}:double")(x=4) == 8


@pytest.mark.parametrize("name,message", [
    ("nope", "rollouts.tools: unknown tool 'nope'; built in: ['calculator', 'python'], or use 'module:function'"),
    ("no_such_module_xyz:f", "rollouts.tools: cannot load 'no_such_module_xyz:f': No module named 'no_such_module_xyz'"),
    (f"{USER_MODULE}:missing", f"rollouts.tools: cannot load '{USER_MODULE}:missing': module '{USER_MODULE}' has no attribute 'missing'"),
    ("rl_assets_test_broken_tools:f", "rollouts.tools: cannot load 'rl_assets_test_broken_tools:f': RuntimeError: broken at import"),
    (f"{USER_MODULE}:NOT_A_FUNCTION", f"rollouts.tools: '{USER_MODULE}:NOT_A_FUNCTION' is not callable"),
    (f"{USER_MODULE}:no_docstring", "has no docstring"),
    (f"{USER_MODULE}:no_hint", "missing a type hint"),
    (f"{USER_MODULE}:undocumented_argument", "no description for the argument 'y'"),
])
def test_load_tool_errors(user_module, name, message):
    with pytest.raises(ValueError, match="^rollouts.tools: ") as error:
        load_tool(name)
    assert message in str(error.value) and repr(name) in str(error.value)


def test_importing_tools_is_cheap():
    """The sampler and Dagster's code location import these modules: transformers and torch come only with a schema."""
    code = "import sys, rl_assets.rollout.tools, rl_assets.rollout.environments; print(sorted({'torch', 'transformers', 'trl'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --- the python tool, in the sandbox ---------------------------------------------------------------------------------

QUICK = Limits(cpu_seconds=1, memory_mb=256, wall_seconds=1.5, max_processes=8)


# make test installs bubblewrap (the Makefile's sandbox target): without it this fails, as the code_execution tests do
@pytest.mark.parametrize("code,output,error", [
    ("print(2+2)", "4", None),
    ("print('x' * 5000)", "x" * 2000, None),  # stdout is clipped
    ("import os\nprint(os.getcwd(), os.path.exists('/work'))", "/sandbox False", None),  # it runs inside the sandbox
    ("raise KeyError('k')", "", "ValueError: KeyError: 'k'"),
    ("1/0", "", "ValueError: ZeroDivisionError: division by zero"),
    ("print(1)\nwhile True:\n    pass", "", "ValueError: timed out ("),  # the CPU limit, or on a loaded machine the wall clock
    ("import time\ntime.sleep(30)", "", "ValueError: timed out (wall-clock limit of 1.5 s)"),
    ("import os\nos._exit(3)", "", "ValueError: exit status 3"),
    ("syntax error", "", "ValueError: SyntaxError: invalid syntax"),
])
def test_python_tool_runs_in_the_sandbox(monkeypatch, code, output, error):
    monkeypatch.setattr(tools, "PYTHON_LIMITS", QUICK)
    assert load_tool("python") is python
    [result] = execute_tool_calls(parse_tool_calls(f"<call python>{code}</call>", "tagged"), {"python": python})
    assert result.output == output
    assert (result.error is None) if error is None else result.error.startswith(error), result.error
