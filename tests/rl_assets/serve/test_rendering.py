"""Prompts sent to `generate` and `/v1/completions` are rendered as training rendered problems (prompts.template, and the
chat template when prompts.chat_template says so): a raw question reaches a chat model as a user turn (issue 31)."""

from __future__ import annotations

import httpx
import pytest

from rl_assets.core.config import PromptsParams
from rl_assets.core.params_file import load_params
from rl_assets.serve.generate import sample
from rl_assets.data.prompts import ChatTemplateError
from rl_assets.serve.app import create_app
from serve_support import make_served_project, running_server, status_command


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_served_project(tmp_path_factory.mktemp("rendering") / "project")


def prompt_tokens(project, prompts: PromptsParams) -> int:
    params = load_params(project / "params.yaml").model_copy(update={"prompts": prompts})
    app = create_app(project, params, status_command=status_command({"healthy": True}), max_tokens=8)
    with running_server(app) as url:
        done = httpx.post(f"{url}/v1/completions", json={"prompt": "12+7=", "max_tokens": 2}, timeout=60)
    assert done.status_code == 200, done.text
    return done.json()["usage"]["prompt_tokens"]


def test_completions_are_rendered_with_the_training_template(project):
    plain = prompt_tokens(project, PromptsParams())
    assert prompt_tokens(project, PromptsParams(template="{prompt} {prompt}")) == 2 * plain  # one character a token, BOS included once


def test_generate_renders_too_and_says_when_a_chat_template_is_missing(project):
    checkpoint = project / "data/r01/checkpoint"
    assert len(sample(checkpoint, ["12+7="], 2, 1.0, 3, 0, PromptsParams(template="{prompt}"))) == 2
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        sample(checkpoint, ["12+7="], 1, 0.0, 3, 0, PromptsParams(chat_template=True))
    assert sample(checkpoint, ["12+7="], 1, 0.0, 3, 0, None)[0]["prompt"] == "12+7="  # --raw
