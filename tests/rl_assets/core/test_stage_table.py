"""stage_table.py: each stage's declared code covers what its runner imports; content hashes; user modules."""

from __future__ import annotations

import ast

import pytest
import yaml

from conftest import REPO, import_pipelines, in_repo
from rl_assets.core.params_file import load_params
from rl_assets.core.stage_table import STAGE_TABLE, code_hashes, project_code, stage_code, stage_lineage, stage_params, stage_version


@pytest.fixture
def params(tmp_path, monkeypatch):
    """Micro params with a user reward module in the project (cwd)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text("def exact(completions, answer, **kwargs):\n    return [1.0 for _ in completions]\n")
    raw = yaml.safe_load((REPO / "tests" / "micro_params.yaml").read_text())
    raw["rewards"]["functions"].append({"name": "my_rewards:exact", "weight": 1.0})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    return load_params("params.yaml")


# --- what a runner imports, read from the source: its function's imports, then each module's top-level ones ------------

def _module_file(module: str):
    relative = REPO.joinpath(*module.split("."))
    for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(node: ast.AST) -> set[str]:
    found = set()
    for item in ast.walk(node):
        if isinstance(item, ast.Import):
            found.update(alias.name for alias in item.names if alias.name.split(".")[0] == "rl_assets")
        elif isinstance(item, ast.ImportFrom) and (item.module or "").split(".")[0] == "rl_assets":
            found.add(item.module)
            found.update(f"{item.module}.{alias.name}" for alias in item.names if _module_file(f"{item.module}.{alias.name}"))
    return found


def _top_level(tree: ast.Module) -> ast.Module:
    return ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])


def imported_by_runner(runner: str) -> set[str]:
    """The project files a runner `file:function` imports: the function's own imports (and those of the module's functions
    it calls), then, transitively, each reached module's top-level imports (a module's lazy imports serve other stages)."""
    location, _, name = runner.partition(":")
    path = REPO / "rl_assets" / location
    tree = ast.parse(path.read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert name in functions, f"{runner}: no such function"
    todo, seen, modules = [name], set(), _imported(_top_level(tree))
    while todo:
        function = functions[todo.pop()]
        seen.add(function.name)
        modules |= _imported(function)
        called = {n.func.id for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        todo += [c for c in called if c in functions and c not in seen]
    files, done = {path}, set()
    while modules:
        module = modules.pop()
        if module in done or (file := _module_file(module)) is None:
            continue
        done.add(module)
        files.add(file)
        parts = module.split(".")
        modules |= {".".join(parts[:i]) for i in range(1, len(parts))}  # importing a.b.c runs a/__init__ and a/b/__init__
        modules |= _imported(_top_level(ast.parse(file.read_text())))
    return {f.relative_to(REPO).as_posix() for f in files}


@pytest.mark.parametrize("stage", sorted(STAGE_TABLE))
def test_each_stage_declares_all_the_code_its_runner_imports(stage):
    with in_repo():
        declared = set(project_code(stage))
    missing = imported_by_runner(STAGE_TABLE[stage].runner) - declared
    assert not missing, f"add to STAGE_TABLE[{stage!r}].code: {sorted(missing)}"


def test_declared_code_is_the_stage_own_not_everything():
    with in_repo():
        rollouts, train, raw_data = (set(project_code(s)) for s in ("rollouts", "train", "raw_data"))
    assert {"rl_assets/rollout/sampling.py", "rl_assets/rollout/vllm_sampling.py", "rl_assets/core/policy.py", "rl_assets/run/stages.py",
            "rl_assets/run/loaded.py", "rl_assets/rollout/__init__.py"} <= rollouts
    assert not any(p.startswith("rl_assets/train/") for p in rollouts)
    assert {"rl_assets/train/policy_gradient.py", "rl_assets/train/losses.py", "rl_assets/train/advantages.py"} <= train
    assert not any(p.startswith(("rl_assets/rewards/", "rl_assets/rollout/")) for p in raw_data)


def test_a_declared_file_that_does_not_exist_is_an_error_naming_it(monkeypatch):
    from rl_assets.core import stage_table

    monkeypatch.setitem(stage_table.STAGE_TABLE, "rewards", stage_table.Stage("run/stages.py:run_rewards", ("rNN/rewards",), ("rewards",),
                                                                               ("rewards/no_such_module.py",)))
    with pytest.raises(ValueError, match=r"^stage_table: rl_assets/rewards/no_such_module.py does not exist$"):
        project_code("rewards")


def test_user_reward_modules_count_for_the_stages_that_call_them(params):
    assert "my_rewards.py" in stage_code("rewards", params) and "my_rewards.py" in stage_code("evaluation", params)
    assert "my_rewards.py" not in stage_code("rollouts", params) and "my_rewards.py" not in stage_code("train", params)


def test_the_stage_version_follows_the_code_content_and_the_params(params, tmp_path):
    before = {stage: stage_version(stage, params) for stage in ("rewards", "rollouts")}
    hashes = code_hashes(stage_code("rewards", params))
    (tmp_path / "my_rewards.py").write_text((tmp_path / "my_rewards.py").read_text().replace("1.0", "0.5"))
    assert stage_version("rewards", params) != before["rewards"]
    assert stage_version("rollouts", params) == before["rollouts"]
    assert code_hashes(stage_code("rewards", params))["my_rewards.py"] != hashes["my_rewards.py"]
    changed = params.model_copy(update={"rollouts": params.rollouts.model_copy(update={"temperature": 0.5})})
    assert stage_version("rollouts", changed) != before["rollouts"] and stage_version("rewards", changed) == stage_version("rewards", params)


def test_lineage_and_code_version_read_the_same_params(params):
    """One list per stage: what an output's card records is what its asset's code version and DVC stage track."""
    assert stage_params("sft", params) == ["seed", "model", "sft", "rollouts.tools", "rollouts.tool_format", "rollouts.environment"]
    promoted = params.model_copy(update={"promotion": params.promotion.model_copy(update={"warm_start": "promoted"})})
    assert stage_params("sft", promoted)[-1] == "promotion.warm_start"
    for stage in STAGE_TABLE:
        assert list(stage_lineage(stage, params)["params"]) == stage_params(stage, params)


def test_dvc_records_the_params_a_run_used_typed_as_dvc_reads_them(tmp_path, monkeypatch):
    dvc = import_pipelines("pipelines.records.dvc")
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((REPO / "tests" / "micro_params.yaml").read_text())
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(raw).replace("learning_rate: 0.01", "learning_rate: 1e-2"))
    monkeypatch.setenv("MICRO_MODEL", "tiny")
    (tmp_path / "other.yaml").write_text((tmp_path / "other.yaml").read_text().replace("name_or_path: tiny", "name_or_path: ${MICRO_MODEL}"))
    values = dvc.effective_dvc_params(["train", "model.name_or_path", "seed"], "other.yaml", ["train.epochs=3"])
    assert values["train"]["learning_rate"] == 0.01 and isinstance(values["train"]["learning_rate"], float)  # YAML 1.1 reads 1e-2 as text
    assert values["train"]["epochs"] == 3 and set(values["train"]) == set(raw["train"]) | {"epochs"}  # only the keys written, as DVC records
    assert values["model.name_or_path"] == "tiny" and values["seed"] == 0
