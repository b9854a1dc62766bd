"""The checks a run does before it starts: models.check_model and preflight.check_run_inputs (in-process).

The command-line path, every message and "nothing changed" are in tests/pipelines/test_run_checks.py.
"""

from __future__ import annotations

import json
import re

import pytest

from rl_assets.core.config import ModelParams, ParamsError, TinyModelParams
from rl_assets.core.params_file import parse_params
from rl_assets.core.policy import check_model
from rl_assets.run.preflight import check_run_inputs
from rl_assets.core.tokenizer import build_tiny_tokenizer

SOURCES = [{"kind": "jsonl", "path": "data/x.jsonl", "columns": {"prompt": "q", "answer": "a"}}]
REWARDS = {"functions": [{"name": "arithmetic_answer"}]}


def model_folder(path, vocab_size: int | None, config_text: str | None = None):
    build_tiny_tokenizer().save_pretrained(path)
    config = {"model_type": "llama", **({"vocab_size": vocab_size} if vocab_size is not None else {})}
    (path / "config.json").write_text(config_text if config_text is not None else json.dumps(config))
    return str(path)


def test_a_vocabulary_covering_the_tokenizer_passes(tmp_path):
    check_model(ModelParams(name_or_path=model_folder(tmp_path / "m", len(build_tiny_tokenizer()))))
    check_model(ModelParams(name_or_path=model_folder(tmp_path / "big", len(build_tiny_tokenizer()) + 64)))  # padded embeddings are fine


def test_a_vocabulary_short_of_the_tokenizer_names_the_key(tmp_path):
    tokens = len(build_tiny_tokenizer())
    folder = model_folder(tmp_path / "m", tokens - 1)
    with pytest.raises(ParamsError) as caught:
        check_model(ModelParams(name_or_path=folder), "my_params.yaml", "reward_model")
    assert str(caught.value) == (f"my_params.yaml: reward_model.name_or_path: {folder}: config.json vocab_size={tokens - 1} is smaller than "
                                 f"the tokenizer's {tokens} tokens: token ids from {tokens - 1} up would index past the embeddings; "
                                 "use the model's own tokenizer or resize its embeddings")


def test_what_cannot_be_read_cheaply_is_left_to_the_run(tmp_path):
    check_model(ModelParams())  # tiny
    check_model(ModelParams(name_or_path=model_folder(tmp_path / "m", None)))  # no vocab_size in config.json
    (tmp_path / "adapters").mkdir()
    check_model(ModelParams(name_or_path=str(tmp_path / "adapters")))  # no config.json


def test_a_broken_model_folder_stops_before_the_run(tmp_path):
    with pytest.raises(ParamsError, match=r"^params\.yaml: model\.name_or_path: \./nowhere: folder not found$"):
        check_model(ModelParams(name_or_path="./nowhere"))
    folder = model_folder(tmp_path / "m", None, config_text="{not json")
    with pytest.raises(ParamsError, match=r"^params\.yaml: model\.name_or_path: .*/m: config\.json is not valid JSON \(.+\)$"):
        check_model(ModelParams(name_or_path=folder))
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
    with pytest.raises(ParamsError, match=r"^params\.yaml: model\.name_or_path: .*/m: its tokenizer does not load: "):
        check_model(ModelParams(name_or_path=folder))


@pytest.mark.parametrize("shape,message", [
    ({"hidden_size": 48, "num_heads": 5}, "num_heads=5 must divide hidden_size=48"),
    ({"hidden_size": 36, "num_heads": 4}, "hidden_size/num_heads=36/4=9 (the head size) must be even: rotary position embeddings rotate pairs of dimensions"),
])
def test_tiny_shapes_llama_rejects_fail_at_load(shape, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TinyModelParams(**shape)
    for section in ("model", "reward_model"):
        raw = {"raw_data": {"sources": SOURCES}, "rewards": REWARDS, section: {"tiny": shape}}
        if section == "reward_model":
            raw[section]["preference_data"] = "prefs.jsonl"
        with pytest.raises(ParamsError) as caught:
            parse_params(raw)
        assert str(caught.value) == f"params.yaml: {section}.tiny: Value error, {message}"


def test_only_what_the_selected_assets_read_is_checked(tmp_path):
    params = parse_params({"raw_data": {"sources": SOURCES}, "rewards": REWARDS, "reward_model": {"preference_data": "prefs.jsonl"},
                           "model": {"name_or_path": "./no_model"}})
    with pytest.raises(ParamsError) as caught:
        check_run_inputs(params, root=tmp_path)  # the whole graph: the data checks come first, all of them at once
    assert str(caught.value) == ("params.yaml: raw_data.sources[0].path: file not found: data/x.jsonl\n"
                                 "params.yaml: reward_model.preference_data: file not found: prefs.jsonl")
    check_run_inputs(params, keys=["r01/rewards", "evaluation"], root=tmp_path)  # reads none of them
    with pytest.raises(ParamsError, match=r"^params\.yaml: raw_data\.sources\[0\]\.path: file not found: data/x\.jsonl$"):
        check_run_inputs(params, keys=["raw_data"], root=tmp_path)
    with pytest.raises(ParamsError, match=r"^params\.yaml: model\.name_or_path: \./no_model: folder not found$"):
        check_run_inputs(params, keys=["prompts"], root=tmp_path)


def test_a_malformed_jsonl_row_stops_before_the_run_naming_file_and_line(tmp_path):
    """The raw_data step would stop at line 3 seconds into the run: the preflight reads the rows first, as the step does."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data/x.jsonl").write_text('{"q": "1+1=", "a": 2}\n\n{"q": "2+2=", "a": 4\n{"q": "3+3="}\n')
    params = parse_params({"raw_data": {"sources": SOURCES}, "rewards": REWARDS})
    with pytest.raises(ParamsError) as caught:
        check_run_inputs(params, root=tmp_path)
    assert str(caught.value) == ("params.yaml: raw_data.sources[0].path: data/x.jsonl:3: invalid JSON (Expecting ',' delimiter at "
                                 "column 21); raw_data.on_bad_rows: skip drops bad rows instead")
    check_run_inputs(params, keys=["r01/rewards"], root=tmp_path)  # a run that does not read the raw data is not stopped by it
    skipping = parse_params({"raw_data": {"sources": SOURCES, "on_bad_rows": "skip"}, "rewards": REWARDS})
    check_run_inputs(skipping, root=tmp_path)  # skip: the step drops lines 3 and 4 and keeps line 1
    (tmp_path / "data/x.jsonl").write_text('{"q": "1+1="}\n')
    with pytest.raises(ParamsError, match=r"^params\.yaml: raw_data\.sources\[0\]\.path: data/x\.jsonl:1: missing column 'a' \(mapped to "
                                          r"answer\); raw_data\.on_bad_rows: skip drops bad rows instead$"):
        check_run_inputs(params, root=tmp_path)
    with pytest.raises(ParamsError, match=r"^params\.yaml: raw_data\.sources\[0\]\.path: data/x\.jsonl: no rows left after skipping bad rows$"):
        check_run_inputs(skipping, root=tmp_path)


def test_a_hub_model_that_cannot_be_had_stops_before_the_run(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and no such model in the cache
    with pytest.raises(ParamsError, match=r"^params\.yaml: model\.name_or_path: nobody/no-such-model: not a local folder, not in the "
                                          r"Hugging Face cache, and HF_HUB_OFFLINE is set; import a local copy"):
        check_model(ModelParams(name_or_path="nobody/no-such-model"))
