"""The run spec: a run's params resolved once into one immutable file that every process of the run is given by path.

A run starts from a params file, its `${VAR}` values and `--set` overrides. They are read once, by whoever
starts the run (`rl-assets run`), into a spec: the validated params, the file's keys as written and resolved
(what DVC lists and records for a stage), where they came from, the experiment and its data folder. The file is
named by its content's hash and never rewritten, so a step, a compute child or a stage recorded in dvc.lock
after the run reads exactly what the run used, whatever happened to params.yaml or the environment since.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rl_assets.core.config import Params, ParamsError
from rl_assets.core.params_file import parse_params, read_params_file, resolved_raw
from rl_assets.core.paths import data_dir
from rl_assets.core.storage import atomic_path

FOLDER = Path(".rl_assets") / "runs"
VERSION = 1


@dataclass(frozen=True)
class RunSpec:
    path: Path  # the spec's own file
    params_file: str  # where the params came from, with the overrides applied to it
    overrides: tuple[str, ...]
    params: Params  # validated, every field
    written: dict  # the params file's keys as written, ${VAR} and --set applied (DVC's params, typed by the file)

    @property
    def experiment(self) -> str:
        return self.params.experiment

    @property
    def data(self) -> Path:
        return data_dir(self.params.experiment)


def write_run_spec(params_file: str, overrides: list[str] | tuple[str, ...] = (), folder: Path = FOLDER) -> Path:
    """Resolve the params once and write them as a spec; its path (the same file for the same resolved content)."""
    written = read_params_file(params_file)
    resolved = resolved_raw(copy.deepcopy(written), params_file, overrides)
    params = parse_params(written, params_file, overrides)
    content = {"version": VERSION, "params_file": str(params_file), "overrides": list(overrides), "experiment": params.experiment,
               "data": data_dir(params.experiment).as_posix(), "params": params.model_dump(mode="json"), "written": resolved}
    text = json.dumps(content, sort_keys=True, indent=1)
    path = folder / f"spec-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file():  # content-addressed: an existing file already holds exactly this
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    return path


@lru_cache(maxsize=16)
def read_run_spec(path: str | Path) -> RunSpec:
    """The spec at `path`, validated as it was written (never resolved again); an error names the file."""
    path = Path(path)
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ParamsError(f"{path}: not a readable run spec ({type(error).__name__}: {error})") from None
    if content.get("version") != VERSION:
        raise ParamsError(f"{path}: run spec version {content.get('version')!r}, this code reads {VERSION}; start the run again")
    return RunSpec(path=path, params_file=content["params_file"], overrides=tuple(content["overrides"]),
                   params=Params.model_validate(content["params"]), written=content["written"])
