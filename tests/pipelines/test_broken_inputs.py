"""The broken-input corpus (tests/broken_inputs/manifest.yaml) through the raw_data asset itself.

Each case runs the asset in a private project that already holds a good `data/raw_data.parquet`;
it must stop with exactly the manifest's message (or one matching its `error_regex`) and leave every file as it was (no new, changed
or temporary file). The `skipped` cases run with `on_bad_rows: skip` and must report what they dropped.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from dagster import build_asset_context

from conftest import REPO, import_pipelines
from rl_assets.core.config import ParamsError
from rl_assets.data.raw_data import RawDataError
from rl_assets.core.schemas import read_table

CORPUS = REPO / "tests" / "broken_inputs"
MANIFEST = yaml.safe_load((CORPUS / "manifest.yaml").read_text())
REWARDS = {"functions": [{"name": "arithmetic_answer"}]}
GOOD_SOURCES = [{"kind": "jsonl", "path": "data/raw/good.jsonl", "columns": {"prompt": "question", "answer": "solution", "extra": ["level"]}},
                {"kind": "generator", "path": "data/raw/templates.json", "count": 20}]


def params_text(case: dict) -> str:
    if "params" in case:
        return (CORPUS / "params" / case["params"]).read_text()
    sources = case.get("sources") or [case["source"]]
    return yaml.safe_dump({"raw_data": {"sources": sources, **case.get("raw_data", {})}, "rewards": REWARDS}, sort_keys=False)


def run_raw_data(assets, project: Path):
    from pipelines.launch.params import ParamsResource

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.setenv("DAGSTER_HOME", str(project / ".dagster"))
        for name in ("DVC_STAGE", "RL_ASSETS_DVC_COMMIT", "RL_ASSETS_DVC", "RL_ASSETS_SET"):
            patch.delenv(name, raising=False)
        params = ParamsResource(path="params.yaml", overrides=[])
        raw_data, _ = assets.data_assets(params.load())
        with build_asset_context() as context:  # the body yields its materialization (and guards), then may raise
            return list(raw_data(context, params=params))[0]


def snapshot(project: Path) -> dict[str, bytes]:
    """Every file of the project (bytecode caches aside) and its bytes."""
    return {p.relative_to(project).as_posix(): p.read_bytes() for p in sorted(project.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def assets():
    return import_pipelines("pipelines.definitions.assets")


@pytest.fixture(scope="module")
def reference(assets, tmp_path_factory) -> Path:
    """A project whose raw_data.parquet came from a successful run on good inputs."""
    project = tmp_path_factory.mktemp("broken") / "reference"
    shutil.copytree(CORPUS / "data", project / "data" / "raw")
    (project / "params.yaml").write_text(yaml.safe_dump({"raw_data": {"sources": GOOD_SOURCES}, "rewards": REWARDS}))
    run_raw_data(assets, project)
    assert read_table(project / "data" / "raw_data.parquet", "raw_data").num_rows == 22
    return project


def project_for(case: dict, reference: Path, tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(reference, project)
    (project / "params.yaml").write_text(params_text(case))
    return project


def test_the_corpus_is_large_and_every_file_is_used():
    cases = MANIFEST["cases"]
    assert len(cases) >= 20 and len({c["name"] for c in cases}) == len(cases)
    text = (CORPUS / "manifest.yaml").read_text()
    unused = [p.name for p in (CORPUS / "data").iterdir() if p.name not in text and p.stem not in text]
    unused += [p.name for p in (CORPUS / "params").iterdir() if p.name not in text]
    assert unused == []


@pytest.mark.parametrize("case", MANIFEST["cases"], ids=[c["name"] for c in MANIFEST["cases"]])
def test_broken_input_stops_with_its_error_and_changes_nothing(assets, reference, tmp_path, case):
    project = project_for(case, reference, tmp_path)
    before = snapshot(project)
    with pytest.raises((RawDataError, ParamsError)) as caught:
        run_raw_data(assets, project)
    if "error_regex" in case:  # the message quotes a library's own words
        assert re.fullmatch(case["error_regex"], str(caught.value), re.DOTALL), str(caught.value)
    else:
        assert str(caught.value) == case["error"]
    assert snapshot(project) == before


@pytest.mark.parametrize("case", MANIFEST["skipped"], ids=[c["name"] for c in MANIFEST["skipped"]])
def test_skipped_bad_rows_are_counted_and_sampled(assets, reference, tmp_path, case):
    project = project_for({**case, "raw_data": {"on_bad_rows": "skip"}}, reference, tmp_path)
    result = run_raw_data(assets, project)
    table = read_table(project / "data" / "raw_data.parquet", "raw_data")
    assert table.num_rows == result.metadata["rows"] == case["rows"]
    assert result.metadata["dropped_bad_rows"] == len(case["dropped"])
    assert result.metadata["dropped_bad_rows_sample"].value == "\n".join(f"- `{message}`" for message in case["dropped"])


def test_chat_template_on_a_tokenizer_without_one_stops_prompts_and_writes_nothing(assets, reference, tmp_path):
    from pipelines.launch.params import ParamsResource
    from rl_assets.data.prompts import ChatTemplateError

    project = project_for({"sources": GOOD_SOURCES}, reference, tmp_path)
    params = yaml.safe_load((project / "params.yaml").read_text())
    (project / "params.yaml").write_text(yaml.safe_dump({**params, "prompts": {"chat_template": True}}))
    before = snapshot(project)
    with pytest.MonkeyPatch.context() as patch, build_asset_context() as context:
        patch.chdir(project)
        resource = ParamsResource(path="params.yaml", overrides=[])
        _, prompts = assets.data_assets(resource.load())
        with pytest.raises(ChatTemplateError, match=r"^prompts\.chat_template: the policy tokenizer \(\w+\) has no chat template"):
            list(prompts(context, params=resource))
    assert snapshot(project) == before
