"""config.py: the repo's params load; every kind of mistake stops with a message naming file and key path."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from rl_assets.core import config
from rl_assets.core.config import Params, ParamsError
from rl_assets.core.params_file import apply_override, load_params, parse_params

from rl_assets_support import REPO

REPO_PARAMS = REPO / "params.yaml"


def repo_raw() -> dict:
    return yaml.safe_load(REPO_PARAMS.read_text())


def write_params(tmp_path, raw) -> str:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False) if not isinstance(raw, str) else raw)
    return str(path)


def load_error(path, overrides=()) -> str:
    with pytest.raises(ParamsError) as caught:
        load_params(path, overrides)
    return str(caught.value)


# --- valid files -------------------------------------------------------------------------------


def test_repo_params_yaml_loads_with_its_values():
    params = load_params(REPO_PARAMS)
    raw = repo_raw()
    assert isinstance(params, Params)
    assert params.seed == raw["seed"] and params.rounds == raw["rounds"]
    assert params.rollouts.samples_per_prompt == raw["rollouts"]["samples_per_prompt"]
    assert params.train.learning_rate == pytest.approx(raw["train"]["learning_rate"])
    assert params.model.tiny.hidden_size == raw["model"]["tiny"]["hidden_size"]
    jsonl = params.raw_data.sources[1]
    assert (jsonl.kind, jsonl.columns.prompt, jsonl.columns.answer, jsonl.columns.extra) == ("jsonl", "question", "solution", [])
    assert [f.name for f in params.rewards.functions] == ["arithmetic_answer"]


def test_micro_params_used_by_pipeline_tests_load():
    params = load_params(REPO / "tests" / "micro_params.yaml")
    assert params.rounds == 1 and params.compute.device == "cpu"


def test_omitted_sections_take_the_defaults_declared_in_the_models():
    params = parse_params({"raw_data": repo_raw()["raw_data"], "rewards": repo_raw()["rewards"]})
    assert params.train == config.TrainParams()
    assert params.train.epsilon == 0.2 and params.train.scale_rewards == "group"
    assert params.rollouts.samples_per_prompt == config.RolloutsParams.model_fields["samples_per_prompt"].default


def test_params_are_frozen():
    params = load_params(REPO_PARAMS)
    with pytest.raises(ValidationError):
        params.train.beta = 0.5


def _leaf_fields():
    sections = [c for c in vars(config).values() if isinstance(c, type) and issubclass(c, config.Section) and c is not config.Section]
    for section in sections:
        for name, field in section.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                continue  # a nested section; its own fields are checked
            yield f"{section.__name__}.{name}", field


@pytest.mark.parametrize("name,field", list(_leaf_fields()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_setting_has_a_description(name, field):
    assert field.description and field.description.strip(), f"{name} has no description"


# --- invalid files: one table of mutation -> expected message ------------------------------------


def _set(path: str, value):
    def mutate(raw):
        node = raw
        *parents, last = path.split("/")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return mutate


def _delete(path: str):
    def mutate(raw):
        node = raw
        *parents, last = path.split("/")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[int(last) if isinstance(node, list) else last]
    return mutate


INVALID = [
    ("unknown top-level key", _set("seeed", 1), "seeed: unknown key"),
    ("unknown nested key", _set("train/lerning_rate", 1e-3), "train.lerning_rate: unknown key"),
    ("unknown key two levels down", _set("model/tiny/hidden", 8), "model.tiny.hidden: unknown key"),
    ("unknown key inside a list item", _set("raw_data/sources/0/kind_", "x"), "raw_data.sources[0].kind_: unknown key"),
    ("wrong type", _set("train/epochs", "two"), "train.epochs: Input should be a valid integer"),
    ("fractional integer", _set("rounds", 2.5), "rounds: Input should be a valid integer"),
    ("section given as a scalar", _set("train", 5), "train: Input should be a valid dictionary"),
    ("epsilon above range", _set("train/epsilon", 1.5), "train.epsilon: Input should be less than 1"),
    ("owner that is neither email nor team", _set("owners", ["alice", "team:ml"]), "<top level>: Value error, owners must be emails or 'team:name', not ['alice']"),
    ("unknown algorithm", _set("train/algorithm", "a2c"), "train.algorithm: Input should be 'grpo', 'rloo', 'reinforce_pp', 'ppo', 'dpo' or 'rft'"),
    ("ppo dropping equal-reward groups", lambda raw: [_set("train/algorithm", "ppo")(raw), _set("train/drop_equal_reward_groups", True)(raw)],
     "<top level>: Value error, train.drop_equal_reward_groups leaves out groups whose rewards are equal"),
    ("ppo critic from a missing reward model", lambda raw: [_set("train/algorithm", "ppo")(raw), _set("train/ppo", {"critic_init": "reward_model"})(raw)],
     "<top level>: Value error, train.ppo.critic_init: 'reward_model' starts the value model from the reward_model asset"),
    ("unknown loss type", _set("train/loss_type", "token"), "train.loss_type: Input should be 'grpo', 'bnpo', 'dr_grpo' or 'dapo'"),
    ("accumulation not dividing", _set("train/gradient_accumulation_steps", 3), "train: Value error, minibatch_size=256 must be a multiple of gradient_accumulation_steps=3"),
    ("dpo weights of another length", _set("train/dpo", {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0]}), "train.dpo: Value error, loss_weights has 1 entries for 2 loss types"),
    ("multi-node without rendezvous", _set("compute/nnodes", 2), "compute: Value error, nnodes > 1 needs rdzv_endpoint"),
    ("sharding one process", _set("compute/sharding", "fsdp"), "compute: Value error, sharding fsdp needs several processes to shard over"),
    ("sharded lora", lambda raw: [_set("compute/nproc", 2)(raw), _set("compute/sharding", "fsdp")(raw), _set("train/lora", {"enabled": True})(raw)],
     "<top level>: Value error, compute.sharding fsdp with train.lora: LoRA adapters are not sharded yet"),
    ("sharded dpo", lambda raw: [_set("compute/nproc", 2)(raw), _set("compute/sharding", "fsdp")(raw), _set("train/algorithm", "dpo")(raw)],
     "<top level>: Value error, compute.sharding fsdp shards the policy-gradient step; train.algorithm 'dpo'"),
    ("unknown executor", _set("compute/executor", "lsf"), "compute.executor: Input should be 'multiprocess', 'k8s' or 'slurm'"),
    ("samples_per_prompt zero", _set("rollouts/samples_per_prompt", 0), "rollouts.samples_per_prompt: Input should be greater than or equal to 1"),
    ("eval_fraction zero", _set("prompts/eval_fraction", 0.0), "prompts.eval_fraction: Input should be greater than 0"),
    ("sft_fraction of one", _set("prompts/sft_fraction", 1.0), "prompts.sft_fraction: Input should be less than 1"),
    ("rounds above 99", _set("rounds", 100), "rounds: Input should be less than or equal to 99"),
    ("negative beta", _set("train/beta", -0.1), "train.beta: Input should be greater than or equal to 0"),
    ("literal device", _set("compute/device", "tpu"), "compute.device: Input should be 'auto', 'cpu' or 'cuda'"),
    ("literal algorithm", _set("train/algorithm", "sac"), "train.algorithm: Input should be 'grpo'"),
    ("literal source kind", _set("raw_data/sources/0/kind", "xml"), "raw_data.sources[0].kind: Input should be 'generator', 'python', 'jsonl', 'csv', 'parquet' or 'hf_dataset'"),
    ("empty sources list", _set("raw_data/sources", []), "raw_data.sources: List should have at least 1 item"),
    ("empty reward functions", _set("rewards/functions", []), "rewards.functions: List should have at least 1 item"),
    ("generator without count", _delete("raw_data/sources/0/count"), "raw_data.sources[0]: Value error, a generator source needs count >= 1"),
    ("count on a jsonl source", _set("raw_data/sources/1/count", 3), "raw_data.sources[1]: Value error, count applies to generator and python sources only"),
    ("column mapping of an unknown field", _set("raw_data/sources/1/columns/id", "x"), "raw_data.sources[1].columns.id: unknown key"),
    ("template without {prompt}", _set("prompts/template", "Q:"), "prompts: Value error, template must contain {prompt}"),
    ("missing required section", _delete("rewards"), "rewards: Field required"),
    ("reward function without name", _delete("rewards/functions/0/name"), "rewards.functions[0].name: Field required"),
]


@pytest.mark.parametrize("mutate,expected", [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_params_name_file_and_key_path(tmp_path, mutate, expected):
    raw = repo_raw()
    mutate(raw)
    path = write_params(tmp_path, raw)
    message = load_error(path)
    assert f"{path}: {expected}" in message


def test_every_error_is_reported_on_its_own_line(tmp_path):
    raw = repo_raw()
    raw["train"]["lerning_rate"] = 1.0
    raw["rollouts"]["samples_per_prompt"] = 0
    path = write_params(tmp_path, raw)
    lines = load_error(path).splitlines()
    assert sorted(lines) == sorted([
        f"{path}: train.lerning_rate: unknown key; did you mean train.learning_rate?",
        f"{path}: rollouts.samples_per_prompt: Input should be greater than or equal to 1",
    ])


def test_parse_params_names_the_given_source():
    raw = repo_raw()
    raw["train"]["lerning_rate"] = 1.0
    with pytest.raises(ParamsError, match=r"^experiment\.yaml: train\.lerning_rate: unknown key; did you mean train\.learning_rate\?$"):
        parse_params(raw, source="experiment.yaml")


@pytest.mark.parametrize("text,expected", [
    ("- a\n- b\n", "expected a mapping of sections at the top level, got list"),
    ("train: [unclosed\n", "not valid YAML"),
    ("", "raw_data: Field required"),
])
def test_malformed_files(tmp_path, text, expected):
    path = write_params(tmp_path, text)
    assert load_error(path).startswith(f"{path}: ") and expected in load_error(path)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert load_error(missing) == f"{missing}: file not found"


# --- ${ENV} interpolation ----------------------------------------------------------------------


def _with_value(key_path: str, value) -> dict:
    raw = repo_raw()
    _set(key_path, value)(raw)
    return raw


def test_env_variable_that_is_set_is_substituted(monkeypatch):
    monkeypatch.setenv("RL_TEST_SEED", "7")
    monkeypatch.setenv("RL_TEST_DIR", "extra")
    raw = _with_value("seed", "${RL_TEST_SEED}")
    raw["raw_data"]["sources"][1]["path"] = "data/${RL_TEST_DIR}/file.jsonl"
    params = parse_params(raw)
    assert params.seed == 7
    assert params.raw_data.sources[1].path == "data/extra/file.jsonl"


def test_unset_variable_with_default_uses_the_default(monkeypatch):
    monkeypatch.delenv("RL_TEST_UNSET", raising=False)
    params = parse_params(_with_value("rollouts/samples_per_prompt", "${RL_TEST_UNSET:-3}"))
    assert params.rollouts.samples_per_prompt == 3


def test_set_variable_wins_over_its_default(monkeypatch):
    monkeypatch.setenv("RL_TEST_G", "5")
    assert parse_params(_with_value("rollouts/samples_per_prompt", "${RL_TEST_G:-3}")).rollouts.samples_per_prompt == 5


@pytest.mark.parametrize("key_path,shown", [
    ("rollouts/samples_per_prompt", "rollouts.samples_per_prompt"),
    ("raw_data/sources/1/path", "raw_data.sources[1].path"),
    ("seed", "seed"),
])
def test_unset_variable_without_default_names_the_key_path(tmp_path, monkeypatch, key_path, shown):
    monkeypatch.delenv("RL_TEST_UNSET", raising=False)
    path = write_params(tmp_path, _with_value(key_path, "${RL_TEST_UNSET}"))
    message = load_error(path)
    assert message.startswith(f"{path}: {shown}: environment variable RL_TEST_UNSET is not set")
    assert "${RL_TEST_UNSET:-default}" in message


def test_a_value_that_is_only_a_variable_gets_yaml_typing(monkeypatch):
    monkeypatch.setenv("RL_TEST_CLIP", "0.25")
    monkeypatch.setenv("RL_TEST_LR", "1e-4")
    raw = _with_value("train/epsilon", "${RL_TEST_CLIP}")
    raw["train"]["learning_rate"] = "${RL_TEST_LR}"
    params = parse_params(raw)
    assert isinstance(params.train.epsilon, float) and params.train.epsilon == 0.25
    assert isinstance(params.train.learning_rate, float) and params.train.learning_rate == pytest.approx(1e-4)


def test_a_variable_inside_text_stays_text(monkeypatch):
    monkeypatch.setenv("RL_TEST_N", "1")
    assert parse_params(_with_value("model/name_or_path", "model-${RL_TEST_N}")).model.name_or_path == "model-1"


def test_env_value_that_is_not_valid_yaml_gives_params_error(monkeypatch):
    monkeypatch.setenv("RL_TEST_BAD", "[1, 2")
    with pytest.raises(ParamsError, match=r"params\.yaml: seed: "):
        parse_params(_with_value("seed", "${RL_TEST_BAD}"))


def test_text_env_value_containing_yaml_syntax_stays_text(monkeypatch):
    monkeypatch.setenv("RL_TEST_TEMPLATE", "Question: {prompt}")
    assert parse_params(_with_value("prompts/template", "${RL_TEST_TEMPLATE}")).prompts.template == "Question: {prompt}"


def test_default_applies_when_variable_is_set_but_empty(monkeypatch):
    monkeypatch.setenv("RL_TEST_EMPTY", "")
    assert parse_params(_with_value("rollouts/samples_per_prompt", "${RL_TEST_EMPTY:-3}")).rollouts.samples_per_prompt == 3


# --- --set overrides ---------------------------------------------------------------------------


def test_overrides_are_parsed_as_yaml_and_applied():
    params = parse_params(repo_raw(), overrides=[
        "train.learning_rate=1e-3", "rounds=5", "model.tiny.hidden_size=64", "compute.device=cpu",
        "rewards.functions=[{name: answer_format, weight: 2}]",
    ])
    assert params.train.learning_rate == pytest.approx(1e-3)
    assert params.rounds == 5
    assert params.model.tiny.hidden_size == 64
    assert params.compute.device == "cpu"
    assert [(f.name, f.weight) for f in params.rewards.functions] == [("answer_format", 2.0)]


def test_override_creates_an_omitted_section():
    raw = repo_raw()
    del raw["evaluation"]
    assert parse_params(raw, overrides=["evaluation.max_prompts=5"]).evaluation.max_prompts == 5


def test_load_params_applies_overrides_after_the_file(tmp_path):
    path = write_params(tmp_path, repo_raw())
    assert load_params(path, ["train.epochs=7"]).train.epochs == 7


def test_later_override_wins():
    assert parse_params(repo_raw(), overrides=["seed=1", "seed=2"]).seed == 2


def test_parse_params_leaves_the_callers_mapping_unchanged():
    raw = repo_raw()
    before = copy.deepcopy(raw)
    parse_params(raw, overrides=["train.epochs=9", "evaluation.max_prompts=3"])
    assert raw == before


def test_apply_override_edits_in_place():
    raw = {"train": {"epochs": 1}}
    apply_override(raw, "train.epochs=3")
    apply_override(raw, "rollouts.top_p=0.9")
    assert raw == {"train": {"epochs": 3}, "rollouts": {"top_p": 0.9}}


@pytest.mark.parametrize("override,expected", [
    ("train.learning_rate", "--set: 'train.learning_rate' is not of the form section.key=value"),
    ("=3", "--set: '=3' is not of the form section.key=value"),
    ("seed.value=1", "--set: seed is not a section, cannot set seed.value"),
    ("train.epochs.x=1", "--set: train.epochs is not a section, cannot set train.epochs.x"),
])
def test_malformed_overrides(override, expected):
    with pytest.raises(ParamsError) as caught:
        parse_params(repo_raw(), overrides=[override])
    assert str(caught.value) == expected


def test_apply_override_names_its_source():
    with pytest.raises(ParamsError, match=r"^cli: 'oops' is not of the form"):
        apply_override({}, "oops", source="cli")


@pytest.mark.parametrize("override,expected", [
    ("train.lerning_rate=1e-3", "--set train.lerning_rate=1e-3: train.lerning_rate: unknown key; did you mean train.learning_rate?"),
    ("trian.epochs=1", "--set trian.epochs=1: trian: unknown key; did you mean train?"),
    ("train.lora.rr=8", "--set train.lora.rr=8: train.lora.rr: unknown key; did you mean train.lora.r?"),
    ("train.epsilon=1.5", "--set train.epsilon=1.5: train.epsilon: Input should be less than 1"),
    ("rollouts.samples_per_prompt=0", "--set rollouts.samples_per_prompt=0: rollouts.samples_per_prompt: Input should be greater than or equal to 1"),
    ("model.tiny.num_heads=5", "my_task/params.yaml with --set model.tiny.num_heads=5: model.tiny: Value error, num_heads=5 must divide hidden_size"),
])
def test_overrides_are_validated_like_the_file_and_named_as_the_source(override, expected):
    """An override's error names the `--set` that wrote the value, not the file, which does not have it; a section's own
    check names both. An unknown key suggests the closest known one."""
    with pytest.raises(ParamsError) as caught:
        parse_params(repo_raw(), source="my_task/params.yaml", overrides=[override])
    assert str(caught.value).startswith(expected)


def test_an_override_the_file_does_not_cause_leaves_the_file_named():
    raw = repo_raw()
    raw["train"]["lerning_rate"] = 1.0
    with pytest.raises(ParamsError) as caught:
        parse_params(raw, source="my_task/params.yaml", overrides=["train.epochs=3", "seed=1"])
    assert str(caught.value) == "my_task/params.yaml: train.lerning_rate: unknown key; did you mean train.learning_rate?"


def test_override_value_that_is_not_valid_yaml_gives_params_error():
    with pytest.raises(ParamsError, match="train.beta"):
        parse_params(repo_raw(), overrides=["train.beta=[0.1"])


# --- section_hash --------------------------------------------------------------------------------


def test_section_hash_is_stable_and_follows_only_the_named_sections():
    base = parse_params(repo_raw())
    assert base.section_hash("train") == parse_params(repo_raw()).section_hash("train")
    assert len(base.section_hash("train")) == 16
    other_train = parse_params(repo_raw(), overrides=["train.epochs=9"])
    assert other_train.section_hash("train") != base.section_hash("train")
    assert other_train.section_hash("rollouts", "rewards") == base.section_hash("rollouts", "rewards")
    assert base.section_hash("train", "rollouts") != base.section_hash("train")


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp", "dpo"])
def test_group_algorithms_with_one_sample_per_prompt_are_refused_before_anything_runs(algorithm):
    with pytest.raises(ParamsError, match=rf"rollouts.samples_per_prompt: 1 gives each prompt a group of one, and train.algorithm '{algorithm}'"):
        load_params(REPO_PARAMS, ["rollouts.samples_per_prompt=1", f"train.algorithm={algorithm}"])


def test_rft_keeps_single_completions_by_their_reward():
    assert load_params(REPO_PARAMS, ["rollouts.samples_per_prompt=1", "train.algorithm=rft"]).rollouts.samples_per_prompt == 1
