"""The params of the project's runs as Dagster sees them: the resource, what a run records about them, the asset keys they shape.

A run started by `rl-assets run` (or `materialize`, so each `dvc repro` stage) has a run spec
(rl_assets.core.run_spec): its params resolved once, named by $RL_ASSETS_RUN_SPEC, which every step and child
reads instead of the params file. A run launched from the UI or a schedule has the resource's file and `--set`
overrides (editable in the launchpad), resolved by each step. The code location reads them when asked
(`project_params`), never at import.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from dagster import AssetExecutionContext, AssetKey, ConfigurableResource, DagsterError

from pipelines.records.dvc import MISSING, dotted
from rl_assets.core.config import Params
from rl_assets.core.params_file import load_params
from rl_assets.core.paths import asset_key_path
from rl_assets.core.run_spec import read_run_spec

RUN_SPEC_ENV = "RL_ASSETS_RUN_SPEC"


class ParamsResource(ConfigurableResource):
    """Which params the run uses: its run spec when it has one, else a params file and `--set` overrides (the launchpad's)."""

    path: str = "params.yaml"
    overrides: list[str] = []
    spec: str = ""  # a run spec's path: params resolved once; `path` and `overrides` then say where they came from

    def load(self) -> Params:
        return read_run_spec(self.spec).params if self.spec else load_params(self.path, self.overrides)


def project_params() -> ParamsResource:
    """The project's params as this process was asked for them: the run spec in $RL_ASSETS_RUN_SPEC, else $RL_ASSETS_PARAMS
    and the `--set` overrides in $RL_ASSETS_SET.

    Read when called, never at import: `rl-assets run --set k=v` writes the spec and sets the variable, then builds the
    code location.
    """
    if spec := os.environ.get(RUN_SPEC_ENV):
        run = read_run_spec(spec)
        return ParamsResource(path=run.params_file, overrides=list(run.overrides), spec=spec)
    return ParamsResource(path=os.environ.get("RL_ASSETS_PARAMS", "params.yaml"),
                          overrides=[item for item in os.environ.get("RL_ASSETS_SET", "").split(";") if item])


def run_tags(params: ParamsResource) -> dict[str, str]:
    """What a run records about its params: experiment, params file, overrides and the hash of the effective params."""
    loaded = params.load()
    tags = {"rl_assets/experiment": loaded.experiment, "rl_assets/params_file": params.path,
            "rl_assets/params_hash": loaded.section_hash(*Params.model_fields)}
    if params.overrides:
        tags["rl_assets/overrides"] = ";".join(params.overrides)
    if params.spec:
        tags["rl_assets/run_spec"] = params.spec
    return tags


def tag_run(context: AssetExecutionContext, params: ParamsResource) -> None:
    """Put `run_tags` on the running run, however it was launched (CLI, UI launchpad, schedule, sensor)."""
    try:
        current = context.run.tags
    except DagsterError:  # an asset body invoked directly (tests): there is no run to tag (DagsterInvalidPropertyError)
        return
    tags = run_tags(params)
    if any(current.get(k) != v for k, v in tags.items()):
        context.instance.add_run_tags(context.run_id, tags)


def asset_key(key: str) -> AssetKey:
    """The Dagster asset key of output `key` (e.g. 'r01/rollouts') in the project params' experiment
    (paths.asset_key_path: experiments other than the default live under experiments/<name>/; paths.output_key is the way back)."""
    return AssetKey(asset_key_path(key, load_project_params().experiment))


def load_project_params() -> Params:
    """The project's params (`project_params`): what the code location is built from (pipelines.definitions.code_location.defs) and the CLI reads.

    Parsed once per file content, overrides, environment and working directory: the same object until one changes.
    """
    resource = project_params()
    if resource.spec:
        return resource.load()
    path = Path(resource.path)
    text = path.read_bytes() if path.is_file() else b""
    return _parsed_params(resource.path, tuple(resource.overrides), text, frozenset(os.environ.items()), str(Path.cwd()))


def written_keys(keys: list[str]) -> list[str]:
    """The params keys a DVC stage can list: every section, and a dotted key (`rollouts.tools`) only where the params file has it.

    DVC refuses to run a stage whose params key is missing from params.yaml; the default it would have is in the code version.
    The file is read as the run reads it (`--set` overrides included), so an override names its key too.
    """
    resource = project_params()
    path = Path(resource.path)
    raw = read_run_spec(resource.spec).written if resource.spec else \
        _written_params(resource.path, tuple(resource.overrides), path.read_bytes() if path.is_file() else b"", frozenset(os.environ.items()))
    return [key for key in keys if "." not in key or dotted(raw, key) is not MISSING]


@functools.lru_cache(maxsize=8)
def _written_params(path: str, overrides: tuple[str, ...], text: bytes, environment: frozenset) -> dict:
    """The params file as written, as a run reads it (${VAR} and overrides applied), parsed once per content."""
    from rl_assets.core.params_file import read_params_file, resolved_raw

    return resolved_raw(read_params_file(path), path, overrides) if text else {}


@functools.lru_cache(maxsize=8)
def _parsed_params(path: str, overrides: tuple[str, ...], text: bytes, environment: frozenset, cwd: str) -> Params:
    return load_params(path, list(overrides))
