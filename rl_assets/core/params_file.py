"""Reading a params file into `Params`: the YAML read, `${VAR}` and `${VAR:-default}` interpolated, `--set`
overrides applied, then validated, each error naming the file and the key path (a `ParamsError`)."""

from __future__ import annotations

import difflib
import os
import re
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from rl_assets.core.config import Params, ParamsError

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value, path: str, source: str):
    """Replace ${VAR} and ${VAR:-default} in every string value."""
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k), source) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if os.environ.get(name):
            return os.environ[name]
        if default is not None:  # as in the shell, ${VAR:-x} also covers a set but empty VAR
            return default
        if name in os.environ:
            return ""
        raise ParamsError(f"{source}: {path}: environment variable {name} is not set (use ${{{name}:-default}} for a fallback)")

    replaced = _ENV_PATTERN.sub(substitute, value)
    if not _ENV_PATTERN.fullmatch(value):
        return replaced
    # A value that is only a variable gets a scalar YAML type ("3" -> 3, "true" -> True); text stays text.
    try:
        typed = yaml.safe_load(replaced)
    except yaml.YAMLError:
        return replaced
    return typed if isinstance(typed, (int, float, bool)) else replaced


def apply_override(raw: dict, override: str, source: str = "--set") -> None:
    """Apply one `section.key=value` override in place; the value is parsed as YAML."""
    key_path, sep, text = override.partition("=")
    if not sep or not key_path:
        raise ParamsError(f"{source}: {override!r} is not of the form section.key=value")
    node = raw
    keys = key_path.split(".")
    for depth, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ParamsError(f"{source}: {'.'.join(keys[: depth + 1])} is not a section, cannot set {key_path}")
        node = child
    try:
        node[keys[-1]] = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ParamsError(f"{source}: {override!r}: the value is not valid YAML ({error.problem})") from None


def _format_error(error: ValidationError, source: str, overrides: tuple[str, ...] | list[str] = (), written: dict | None = None) -> str:
    """One line per error: where the value came from (the file, or the `--set` that wrote it), the key path, the message.

    `written`: the params as the file has them, before the overrides.
    """
    lines = []
    for item in error.errors():
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in item["loc"]).replace(".[", "[")
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key"
            parent = loc.rpartition(".")[0]
            if close := difflib.get_close_matches(str(item["loc"][-1]), _known_keys(item["loc"][:-1]), n=1):
                message += f"; did you mean {parent + '.' if parent else ''}{close[0]}?"
        lines.append(f"{_origin(item['loc'], source, overrides, written)}: {loc or '<top level>'}: {message}")
    return "\n".join(lines)


def _origin(loc: tuple, source: str, overrides: tuple[str, ...] | list[str], written: dict) -> str:
    """Where the value at `loc` came from: `--set KEY=VALUE` when the last override of it (or of a section holding it)
    wrote it, or when only overrides inside it made it (`--set trian.epochs=1` makes `trian`); `FILE with --set ...` when
    overrides changed keys inside what the file (`written`, before overrides) has; else the file. A top-level error (a
    check across sections) names the file."""
    path = [str(part) for part in loc if not isinstance(part, int)]
    if not path:
        return source
    inside = []
    for override in reversed(overrides):
        keys = override.partition("=")[0].split(".")
        if path[: len(keys)] == keys:
            return f"--set {override}"
        if keys[: len(path)] == path:
            inside.insert(0, f"--set {override}")
    if not inside:
        return source
    return f"{source} with {', '.join(inside)}" if _has(written, loc) else inside[-1]


def _has(raw, loc: tuple) -> bool:
    """Whether the mapping `raw` holds a value at `loc` (keys and list indices)."""
    for part in loc:
        if isinstance(part, int) and isinstance(raw, list) and part < len(raw):
            raw = raw[part]
        elif isinstance(raw, dict) and part in raw:
            raw = raw[part]
        else:
            return False
    return True


def _known_keys(loc: tuple) -> list[str]:
    """The keys the section at `loc` (a path into Params) accepts, for a "did you mean"; [] when it cannot be told."""
    model = Params
    for part in loc:
        if isinstance(part, int):  # an item of a list: the list's own model already stands for it
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return []
    return list(model.model_fields)


def _model_in(annotation) -> type[BaseModel] | None:
    """The pydantic model in an annotation such as `SourceParams`, `list[SourceParams]` or `LoraParams | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((model for arg in typing.get_args(annotation) if (model := _model_in(arg)) is not None), None)


def experiment_name(params_file: str | Path) -> str:
    """The experiment a params file names when it sets no `experiment`: 'default' for the project's params.yaml, else its path.

    The project's params.yaml is ./params.yaml, or a params.yaml outside the working directory (another
    project's root, named by an absolute path).

    >>> experiment_name("params.yaml"), experiment_name("examples/gsm8k/params.yaml"), experiment_name("my params.yml")
    ('default', 'examples-gsm8k-params', 'my-params')
    """
    path = Path(params_file)
    try:
        path = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        if path.name == "params.yaml":
            return "default"
    if path == Path("params.yaml"):
        return "default"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", path.with_suffix("").as_posix().replace("/", "-")).strip("-._")
    return slug or "default"


def resolved_raw(raw: dict, source: str = "params.yaml", overrides: tuple[str, ...] | list[str] = ()) -> dict:
    """The params mapping a run uses, before validation: ${VAR} interpolated, then `--set` overrides applied."""
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    raw = _interpolate(raw, "", source)
    for override in overrides:
        apply_override(raw, override)
    return raw


def parse_params(raw: dict, source: str = "params.yaml", overrides: tuple[str, ...] | list[str] = ()) -> Params:
    """Validate a params mapping (after interpolation and overrides) into `Params`.

    The experiment defaults to the one `source` names, and a non-default experiment keeps its promoted
    models in models/experiments/<experiment> unless `promotion.directory` says otherwise.
    """
    written, raw = raw, resolved_raw(raw, source, overrides)  # resolved_raw copies: `written` stays as the file has it
    raw.setdefault("experiment", experiment_name(source))
    promotion = raw.get("promotion")
    if raw["experiment"] != "default" and (promotion is None or isinstance(promotion, dict)) and "directory" not in (promotion or {}):
        raw["promotion"] = {**(promotion or {}), "directory": f"models/experiments/{raw['experiment']}"}
    try:
        return Params.model_validate(raw)
    except ValidationError as error:
        raise ParamsError(_format_error(error, source, overrides, written)) from None


# libyaml's loader (PyYAML's C binding) reads the same YAML much faster; every code-location load reads the params file.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_params_file(path: str | Path) -> dict:
    """The params file as written (a mapping), with the file named in every error."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: file not found")
    try:
        raw = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except yaml.YAMLError as error:
        raise ParamsError(f"{path}: not valid YAML: {error}") from None
    return raw or {}


def load_params(path: str | Path = "params.yaml", overrides: tuple[str, ...] | list[str] = ()) -> Params:
    """Read, interpolate, override and validate a params file.

    >>> load_params("does-not-exist.yaml")
    Traceback (most recent call last):
    ...
    rl_assets.core.config.ParamsError: does-not-exist.yaml: file not found
    """
    return parse_params(read_params_file(path), str(path), overrides)
