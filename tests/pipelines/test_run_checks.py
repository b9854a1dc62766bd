"""`rl-assets run` checks what it will read before it starts a run (tests/broken_inputs/manifest.yaml, `before_run`).

A missing data source, a model shape LlamaConfig would reject and a local model whose vocabulary
does not cover its tokenizer stop the command with exit 2 and a `file: key.path: message` line, as
params errors do: no Dagster run starts, and no file of the project changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import REPO, python

CORPUS = REPO / "tests" / "broken_inputs"
MANIFEST = yaml.safe_load((CORPUS / "manifest.yaml").read_text())
REWARDS = {"functions": [{"name": "arithmetic_answer"}]}
GOOD = {"kind": "jsonl", "path": "data/raw/good.jsonl", "columns": {"prompt": "question", "answer": "solution"}}

pytestmark = pytest.mark.e2e


def snapshot(project: Path) -> dict[str, bytes]:
    return {p.relative_to(project).as_posix(): p.read_bytes() for p in sorted(project.rglob("*")) if p.is_file()}


def project_with(tmp_path: Path, params: dict) -> Path:
    """The corpus files under data/raw/ and a params.yaml; the code is the repo's (on PYTHONPATH)."""
    project = tmp_path / "project"
    shutil.copytree(CORPUS / "data", project / "data" / "raw")
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return project


def stopped_before_the_run(project: Path, overrides: list[str] = ()) -> str:
    """`python -m pipelines run` in `project`: exit 2, nothing changed; its stderr."""
    before = snapshot(project)
    done = python(["-m", "pipelines", "run", *[arg for o in overrides for arg in ("--set", o)]], project, timeout=300, check=False,
                  PYTHONPATH=str(REPO))  # this checkout's code, installed or not
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "dagster run" not in done.stdout + done.stderr  # no run was started
    assert snapshot(project) == before
    return done.stderr


@pytest.mark.parametrize("case", MANIFEST["before_run"], ids=[c["name"] for c in MANIFEST["before_run"]])
def test_run_stops_before_it_starts(tmp_path, case):
    params = {"raw_data": {"sources": case["sources"]}, "rewards": REWARDS, **case.get("extra", {})}
    stderr = stopped_before_the_run(project_with(tmp_path, params), case.get("set", []))
    assert stderr == f"error: {case['error']}\n"


def test_a_model_folder_whose_vocabulary_misses_tokenizer_tokens(tmp_path):
    from rl_assets.core.tokenizer import build_tiny_tokenizer

    project = project_with(tmp_path, {"raw_data": {"sources": [GOOD]}, "rewards": REWARDS})
    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(project / "models" / "base")
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": len(tokenizer) - 2, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2}
    (project / "models" / "base" / "config.json").write_text(json.dumps(config))
    stderr = stopped_before_the_run(project, ["model.name_or_path=models/base"])
    assert stderr == (f"error: params.yaml: model.name_or_path: models/base: config.json vocab_size={len(tokenizer) - 2} is smaller than "
                      f"the tokenizer's {len(tokenizer)} tokens: token ids from {len(tokenizer) - 2} up would index past the embeddings; "
                      "use the model's own tokenizer or resize its embeddings\n")
