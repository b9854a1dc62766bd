"""Which code shapes each stage's output: the project modules it imports and the user's own modules.

Each stage starts from a few entry points (a whole module, or `module.py:function` for one function
of `stages.py`) and follows `rl_assets` imports from there by reading the source: nothing is
imported, so the code location still loads without torch. An entry's imports count wherever they
are; a module reached from it counts with its module-level imports only, because the imports
inside functions are mostly for other stages (config.py imports the rewards to validate them, not
to load raw data); a lazily imported module that does shape the stage is listed as an entry. The
user's modules (reward functions named `module:function` in params) are added to the stages that
call them. The resulting file list is what DVC lists as the stage's code deps, its content hashes
go into the Dagster code version and into the output's own lineage record, so editing any of
these files shows the stage changed in `dvc status` and stale in the UI, and nothing upstream.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import sys
from functools import lru_cache
from pathlib import Path

from rl_assets.storage import file_hash

PACKAGE = "rl_assets"
PACKAGE_DIR = Path(__file__).resolve().parent

# Entry points per stage: what the asset body or compute step calls (`file:function` when the file also serves other stages).
STAGE_ENTRIES = {
    "raw_data": ["rl_assets/raw_data.py:load_raw_data", "rl_assets/raw_files.py", "rl_assets/raw_generators.py"],
    "prompts": ["rl_assets/prompts.py:build_prompts", "rl_assets/tokenizer.py"],
    "sft": ["rl_assets/stages.py:run_sft", "rl_assets/sft.py", "rl_assets/models.py", "rl_assets/loaded.py"],
    "rollouts": ["rl_assets/stages.py:run_rollouts", "rl_assets/rollouts.py", "rl_assets/rollouts_vllm.py", "rl_assets/loaded.py"],
    "rewards": ["rl_assets/stages.py:run_rewards", "rl_assets/rewards/__init__.py"],
    "train": ["rl_assets/stages.py:run_train", "rl_assets/train.py", "rl_assets/preference.py", "rl_assets/train_state.py", "rl_assets/loaded.py"],
    "evaluation": ["rl_assets/stages.py:run_evaluation", "rl_assets/evaluation.py", "rl_assets/tracking.py", "rl_assets/loaded.py"],
    "reward_model": ["rl_assets/reward_model.py"],
}
# Stages that call the configured reward functions (evaluation scores held-out completions with them).
USES_REWARDS = {"rewards", "evaluation"}


def _module_file(module: str) -> Path | None:
    """The source file of an `rl_assets` module (a package's __init__.py), or None when there is none."""
    relative = Path(*module.split("."))
    for candidate in (PACKAGE_DIR.parent / relative.with_suffix(".py"), PACKAGE_DIR.parent / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(node: ast.AST, this_module: str, is_package: bool) -> set[str]:
    """Every `rl_assets` module that `node`'s import statements name (absolute or relative)."""
    found = set()
    for item in ast.walk(node):
        if isinstance(item, ast.Import):
            found.update(alias.name for alias in item.names if alias.name.split(".")[0] == PACKAGE)
        elif isinstance(item, ast.ImportFrom):
            if item.level:
                parts = this_module.split(".")
                base = parts[: len(parts) - item.level + (1 if is_package else 0)]
                module = ".".join(base + ([item.module] if item.module else []))
            else:
                module = item.module or ""
            if module.split(".")[0] != PACKAGE:
                continue
            found.add(module)
            # `from rl_assets.rewards import text` names a submodule; `from rl_assets.rewards import score_rollouts` does not
            found.update(f"{module}.{alias.name}" for alias in item.names if _module_file(f"{module}.{alias.name}"))
    return found


def _parsed(path: Path) -> ast.Module:
    return _parsed_version(path, path.stat().st_mtime_ns)


@lru_cache(maxsize=None)
def _parsed_version(path: Path, mtime_ns: int) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _top_level(tree: ast.Module) -> ast.Module:
    return ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])


def _function_imports(tree: ast.Module, name: str, module: str) -> set[str]:
    """Imports of one top-level function, its module's top-level imports, and those of the module's functions it calls."""
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if name not in functions:
        raise ValueError(f"{module}: no top-level function {name!r} (stage_code.STAGE_ENTRIES is out of date)")
    found, seen, todo = _imported_modules(_top_level(tree), module, False), set(), [name]
    while todo:
        function = functions[todo.pop()]
        seen.add(function.name)
        found |= _imported_modules(function, module, False)
        called = {n.func.id for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        todo += [c for c in called if c in functions and c not in seen]
    return found


def _module_name(path: Path) -> str:
    parts = path.resolve().relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_code(entries: list[str]) -> list[str]:
    """The `rl_assets` source files that `entries` import, transitively, as paths relative to the project.

    Cached per entry list until a file of the package changes (the code location builds every asset's list).

    >>> "rl_assets/prompts.py" in project_code(["rl_assets/prompts.py"])
    True
    >>> "rl_assets/train.py" in project_code(["rl_assets/stages.py:run_rollouts"])
    False
    """
    state = _package_state()
    known = _known_closures(state)
    key = "|".join(entries)
    if key not in known:
        known[key] = [str(path) for path in _project_files(entries)]
        _remember_closures(state, known)
    return [_relative(path) for path in known[key]]


@lru_cache(maxsize=1)
def _package_state() -> str:
    """The package's files as this process first saw them: which imports exist only changes with a new process (a code-location
    reload starts one); each file's content is hashed afresh (`code_hashes`)."""
    return hashlib.md5(json.dumps([(str(path), path.stat().st_mtime_ns, path.stat().st_size)
                                   for path in sorted(PACKAGE_DIR.rglob("*.py"))]).encode()).hexdigest()


# Reading every module's imports costs ~0.1 s per code-location load; the closures are kept on disk until a file changes.
_CACHE_FILE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rl-assets" / \
    f"stage-code-{hashlib.md5(str(PACKAGE_DIR).encode()).hexdigest()[:12]}.json"


@lru_cache(maxsize=4)
def _known_closures(state: str) -> dict:
    try:
        stored = json.loads(_CACHE_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return stored.get("closures", {}) if stored.get("state") == state else {}


def _remember_closures(state: str, closures: dict) -> None:
    try:  # a cache only: a read-only home directory just means parsing again next time
        _CACHE_FILE.parent.mkdir(parents=True, exist_ok=True)
        temporary = _CACHE_FILE.with_name(f".{_CACHE_FILE.name}.{os.getpid()}")
        temporary.write_text(json.dumps({"state": state, "closures": closures}))
        os.replace(temporary, _CACHE_FILE)
    except OSError:
        pass


def _project_files(entries: list[str]) -> list[Path]:
    files: set[Path] = set()
    todo: list[str] = []
    for entry in entries:
        location, _, function = entry.partition(":")
        path = PACKAGE_DIR.parent / location
        files.add(path)
        module = _module_name(path)
        todo += sorted(_function_imports(_parsed(path), function, module) if function else
                       _imported_modules(_parsed(path), module, path.name == "__init__.py"))
    seen = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(module)
        if path is None:
            continue
        files.add(path)
        parents = module.split(".")[:-1]  # importing a.b.c runs a/__init__ and a/b/__init__ too
        todo += [".".join(parents[:i]) for i in range(1, len(parents) + 1)]
        todo += sorted(_imported_modules(_top_level(_parsed(path)), module, path.name == "__init__.py"))
    return sorted(files)


def _relative(path: str | Path) -> str:
    """A path relative to the working directory (the project root) when inside it, else absolute."""
    return _relative_to(str(path), os.getcwd())


@lru_cache(maxsize=4096)  # every asset of a stage lists the same files; resolving each costs a stat per path component
def _relative_to(path: str, cwd: str) -> str:
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(Path(cwd).resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def user_module_file(name: str) -> str | None:
    """The source file of the module in a `module:function` reference, found without importing it (None: built in)."""
    if ":" not in name:
        return None
    module = name.partition(":")[0]
    if module.split(".")[0] == PACKAGE:
        return None  # part of the project code, already followed
    relative = Path(*module.split("."))
    for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):  # in the project, as `python -m` in its root imports it
        if candidate.is_file():
            return candidate.as_posix()
    if os.getcwd() not in sys.path:  # as load_reward_function looks for it
        sys.path.append(os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None  # params validation reports an unloadable module with its own message
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    return _relative(Path(spec.origin))


def stage_code(stage: str, params) -> list[str]:
    """Every source file that shapes `stage`'s output under `params`: project modules, then the user's."""
    files = set(project_code(STAGE_ENTRIES[stage]))
    if stage in USES_REWARDS:
        files.update(f for f in (user_module_file(function.name) for function in params.rewards.functions) if f)
    return sorted(files)


def code_hashes(files: list[str]) -> dict[str, str]:
    """{path: md5 of its content}: what the output records about the code that made it."""
    hashes = {}
    for path in files:
        try:
            info = os.stat(path)
        except OSError:
            hashes[path] = "missing"
            continue
        hashes[path] = _file_md5(path, info.st_mtime_ns, info.st_size)
    return hashes


@lru_cache(maxsize=1024)
def _file_md5(path: str, mtime_ns: int, size: int) -> str:  # every asset of a stage hashes the same files
    return file_hash(path)


def stage_version(stage: str, params, sections: list[str]) -> str:
    """The Dagster code version of a stage: its code's content and its params sections' effective values."""
    blob = json.dumps({"code": code_hashes(stage_code(stage, params)), "params": _sections(params, sections)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sections(params, keys: list[str]) -> dict:
    """{key: effective value} for params keys such as `train` or `model.name_or_path`."""
    values, found = params.model_dump(mode="json"), {}
    for key in keys:
        value = values
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        found[key] = value
    return found


def stage_lineage(stage: str, params, sections: list[str]) -> dict:
    """What an output records about how it was made: the experiment, its params sections' values and its code's hashes."""
    return {"experiment": params.experiment, "params": _sections(params, sections),
            "code": {stage: code_hashes(stage_code(stage, params))}}
