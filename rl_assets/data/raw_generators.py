"""Dynamic sources: the seeded templates generator and a user generator given as `module:function`.

A templates file holds several templates, each a prompt with `{placeholders}`, an integer range
per variable and the answer as an arithmetic expression over the variables, e.g.::

    {"templates": [{"prompt": "{a}+{b}=", "answer": "a+b", "ranges": {"a": [0, 99], "b": [0, 99]}, "weight": 2}]}

Answers allow + - * // % unary minus and parentheses (no `eval`). The whole file is checked before
anything is drawn, so a typo in the tenth template fails with its index and key, not mid-way.

A user generator is any function `f(count: int, seed: int) -> list[dict]` in a module of the
project (or on sys.path); each dict is a row whose keys are mapped like a static file's columns.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import operator
import random
import string
import sys
from pathlib import Path

from rl_assets.data.raw_files import BadRow, RawDataError, Records

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_SYMBOLS = {ast.Pow: "**", ast.Div: "/", ast.MatMult: "@", ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<",
            ast.RShift: ">>", ast.UAdd: "unary +", ast.Invert: "~", ast.Not: "not"}
ALLOWED = "+ - * // % unary - and parentheses"
TEMPLATE_KEYS = ("answer", "prompt", "ranges", "weight")


def evaluate_expression(expression: str, variables: dict[str, int]) -> int:
    """Evaluate an integer arithmetic expression without `eval`.

    >>> evaluate_expression("a * (b - 3)", {"a": 4, "b": 5})
    8
    """

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in variables:
            return variables[node.id]
        raise ValueError(f"unsupported element {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval"))


def expression_problem(expression: str, names: set[str]) -> str | None:
    """Why `expression` is not a valid answer over `names`, or None when it is.

    >>> expression_problem("a ** 2", {"a"})
    'unsupported operator ** (allowed: + - * // % unary - and parentheses)'
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as error:
        return f"not an arithmetic expression ({error.msg})"
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.UnaryOp)):
            allowed = type(node.op) in _OPERATORS or isinstance(node.op, ast.USub)
            if not allowed:
                return f"unsupported operator {_SYMBOLS.get(type(node.op), type(node.op).__name__)} (allowed: {ALLOWED})"
        elif isinstance(node, ast.Name):
            if node.id not in names:
                return f"unknown variable {node.id!r}; ranges define: {', '.join(sorted(names)) or 'nothing'}"
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                return f"only integer constants are allowed, got {node.value!r}"
        elif not isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.unaryop)):
            return f"unsupported element {type(node).__name__} (allowed: {ALLOWED})"
    return None


def _check_template(template, at: str) -> None:
    if not isinstance(template, dict):
        raise RawDataError(f"{at}: expected an object, got {type(template).__name__}")
    unknown = sorted(set(template) - set(TEMPLATE_KEYS))
    if unknown:
        raise RawDataError(f"{at}: unknown key {unknown[0]!r}; allowed: {', '.join(TEMPLATE_KEYS)}")
    for key in ("prompt", "answer", "ranges"):
        if key not in template:
            raise RawDataError(f"{at}: missing key {key!r}")
    ranges = template["ranges"]
    if not isinstance(ranges, dict):
        raise RawDataError(f"{at}.ranges: expected an object of variable: [low, high]")
    for name, bounds in ranges.items():
        valid = (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
                 and bounds[0] <= bounds[1])
        if not name.isidentifier() or not valid:
            raise RawDataError(f"{at}.ranges.{name}: expected [low, high] integers with low <= high, got {json.dumps(bounds)}")
    if not isinstance(template["prompt"], str) or not template["prompt"].strip():
        raise RawDataError(f"{at}.prompt: expected non-empty text")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template["prompt"]) if f is not None]
    except ValueError as error:
        raise RawDataError(f"{at}.prompt: {error}") from None
    for field in fields:
        if field not in ranges:
            raise RawDataError(f"{at}.prompt: placeholder {{{field}}} has no range")
    if not isinstance(template["answer"], str):
        raise RawDataError(f"{at}.answer: expected an expression as text, got {type(template['answer']).__name__}")
    problem = expression_problem(template["answer"], set(ranges))
    if problem:
        raise RawDataError(f"{at}.answer: {problem}")
    weight = template.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
        raise RawDataError(f"{at}.weight: expected a number >= 0, got {json.dumps(weight)}")


def read_templates(path: Path, label: str) -> list[dict]:
    """The checked templates of a templates file."""
    try:
        data = path.read_bytes()
        spec = json.loads(data.decode("utf-8"))
    except OSError as error:
        raise RawDataError(f"{label}: cannot read ({error.strerror})") from None
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise RawDataError(f"{label}:{line}: not UTF-8 text ({error.reason})") from None
    except json.JSONDecodeError as error:
        raise RawDataError(f"{label}:{error.lineno}: invalid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("templates"), list):
        raise RawDataError(f"{label}: expected an object with a 'templates' list")
    templates = spec["templates"]
    if not templates:
        raise RawDataError(f"{label}: 'templates' is empty")
    for number, template in enumerate(templates):
        _check_template(template, f"{label}: templates[{number}]")
    if not any(t.get("weight", 1.0) for t in templates):
        raise RawDataError(f"{label}: every template has weight 0")
    return templates


def generate_problems(templates_path: Path, count: int, seed: int, label: str | None = None) -> list[dict]:
    """Draw `count` problems from the templates file, reproducibly for a given seed; errors name `label` (default: the path)."""
    label = label or str(templates_path)
    templates = read_templates(Path(templates_path), label)
    rng = random.Random(seed)
    weights = [t.get("weight", 1.0) for t in templates]
    rows = []
    for index in range(count):
        number = rng.choices(range(len(templates)), weights)[0]
        template = templates[number]
        variables = {name: rng.randint(low, high) for name, (low, high) in sorted(template["ranges"].items())}
        try:
            answer = evaluate_expression(template["answer"], variables)
        except ZeroDivisionError:
            shown = ", ".join(f"{k}={v}" for k, v in variables.items())
            raise RawDataError(f"{label}: templates[{number}].answer: division by zero with {shown}") from None
        rows.append({"source_row": index, "prompt": template["prompt"].format(**variables), "answer": str(answer)})
    return rows


def module_file(module: str, root: Path) -> Path | None:
    """The source file of `module` under `root` or on sys.path, found without importing anything."""
    parts = module.split(".")
    for base in [root, *(Path(p) for p in sys.path)]:
        for candidate in (base.joinpath(*parts[:-1], parts[-1] + ".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def run_user_generator(function: str, count: int, seed: int, root: Path) -> Records:
    """Rows of `module:function(count=count, seed=seed)`, loaded afresh from the file that is hashed."""
    label = f"python:{function}"
    module_name, _, attribute = function.partition(":")
    file = module_file(module_name, root)
    if file is None:
        raise RawDataError(f"{label}: module {module_name!r} not found in the project or on sys.path")
    package = [str(file.parent)] if file.name == "__init__.py" else None
    spec = importlib.util.spec_from_file_location(module_name, file, submodule_search_locations=package)
    module = importlib.util.module_from_spec(spec)
    project = str(root.resolve())
    sys.path.insert(0, project)  # so the module can import its neighbours, at load time and when called
    try:
        try:
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        except Exception as error:  # a user module may fail in any way; report it as a data error
            sys.modules.pop(module_name, None)
            raise RawDataError(f"{label}: importing {file} failed: {type(error).__name__}: {error}") from None
        generate = getattr(module, attribute, None)
        if not callable(generate):
            raise RawDataError(f"{label}: {file} has no function {attribute!r}")
        try:
            rows = generate(count=count, seed=seed)
            if isinstance(rows, (str, bytes, dict)) or not hasattr(rows, "__iter__"):
                raise RawDataError(f"{label}: returned {type(rows).__name__}; expected a list of row dicts")
            rows = list(rows)
        except RawDataError:
            raise
        except Exception as error:
            raise RawDataError(f"{label}: raised {type(error).__name__}: {error}") from None
    finally:
        sys.path.remove(project)
    if len(rows) != count:
        raise RawDataError(f"{label}: returned {len(rows)} rows; expected count={count}")
    for number, row in enumerate(rows):
        yield number, row if isinstance(row, dict) else BadRow(f"{label}: row {number}: expected a dict, got {type(row).__name__}")
