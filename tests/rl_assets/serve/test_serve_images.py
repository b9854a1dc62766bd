"""Images to a vision-language checkpoint: `rl-assets generate --image` and OpenAI chat requests with image_url parts."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from PIL import Image

from rl_assets.core.checkpoints import read_lineage, save_checkpoint
from rl_assets.core.config import ModelParams
from rl_assets.core.params_file import load_params
from rl_assets.serve.app import create_app
from rl_assets.serve.generate import sample
from serve_support import make_served_project, running_server

VLM = ModelParams(tiny={"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
                  vision={"image_size": 16, "patch_size": 8, "hidden_size": 16, "num_layers": 1, "num_heads": 2})


def png(color: str, size: int = 24) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The served project whose r02 is the embedded VLM (r01 a text model), and two pictures in it."""
    from rl_assets.core.policy import load_base_model

    root = make_served_project(tmp_path_factory.mktemp("served-images") / "project")
    model, tokenizer = load_base_model(VLM, seed=3)
    path = root / "data/r02/checkpoint"
    card = {k: v for k, v in read_lineage(path).items() if k not in ("checkpoint_id", "code_version")}
    save_checkpoint(model, tokenizer, path, card)
    (root / "pictures").mkdir()
    for color in ("red", "blue"):
        (root / "pictures" / f"{color}.png").write_bytes(png(color))
    (root / "pictures/cut.png").write_bytes(png("red")[:60])
    return root


@pytest.fixture(scope="module")
def server(project):
    with running_server(create_app(project, load_params(project / "params.yaml"), max_tokens=8, preload=None)) as url:
        yield url


def chat(url: str, model: str, *parts: dict, **extra) -> httpx.Response:
    content = [*parts, {"type": "text", "text": "How many?"}]
    return httpx.post(f"{url}/v1/chat/completions", timeout=120,
                      json={"model": model, "max_tokens": 6, "messages": [{"role": "user", "content": content}], **extra})


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_generate_shows_a_vlm_the_image_files_and_a_text_model_refuses_them(project):
    path = project / "data/r02/checkpoint"
    red = project / "pictures/red.png"
    first = sample(path, ["How many?"], 1, 0.0, 6, 0, images=[red])
    assert first == sample(path, ["How many?"], 1, 0.0, 6, 0, images=[red])  # deterministic
    with pytest.raises(ValueError, match="a text policy .* cannot read images"):
        sample(project / "data/r01/checkpoint", ["How many?"], 1, 0.0, 6, 0, images=[red])
    with pytest.raises(ValueError, match="image file not found: .*green.png"):
        sample(path, ["How many?"], 1, 0.0, 6, 0, images=[project / "pictures/green.png"])
    with pytest.raises(ValueError, match="cut.png: not a readable image"):
        sample(path, ["How many?"], 1, 0.0, 6, 0, images=[project / "pictures/cut.png"])


def test_a_chat_request_with_an_image_is_answered_from_the_pixels(server, project):
    red = chat(server, "r02", image_part(data_url(png("red"))), logprobs=True)
    assert red.status_code == 200, red.text
    choice = red.json()["choices"][0]
    # what the server generated is what `generate --image` gives for the same prompt and picture
    expected = sample(project / "data/r02/checkpoint", ["How many?"], 1, 0.0, 6, 0, images=[project / "pictures/red.png"])[0]
    assert choice["message"]["content"] == expected["completion"]
    # a file under the project is the same picture; another picture gives other log-probs for the first token
    again = chat(server, "r02", image_part("pictures/red.png"), logprobs=True).json()["choices"][0]
    assert again["logprobs"] == choice["logprobs"]
    blue = chat(server, "r02", image_part("file://pictures/blue.png"), logprobs=True).json()["choices"][0]
    assert blue["logprobs"]["content"][0]["logprob"] != choice["logprobs"]["content"][0]["logprob"]


@pytest.mark.parametrize("url, message", [
    ("data:image/png;base64,@@@", "not base64"),
    ("data:image/png,abc", "must be base64"),
    ("https://example.com/a.png", "not fetched"),
    ("../outside.png", "outside the project folder"),
    ("pictures/green.png", "image file not found: pictures/green.png"),
    ("pictures/cut.png", "pictures/cut.png: not a readable image"),
])
def test_a_bad_image_is_a_400_naming_it(server, url, message):
    response = chat(server, "r02", image_part(url))
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text


def test_an_image_to_a_text_model_is_a_400(server):
    response = chat(server, "r01", image_part(data_url(png("red"))))
    assert response.status_code == 400 and "reads text only" in response.json()["error"]["message"], response.text


def test_stored_pictures_are_served_by_name_and_nothing_else_is(server, project):
    from rl_assets.data.images import image_id, store_images

    data = png("green")
    store_images({image_id(data): (data, "png")}, project / "data/images")
    response = httpx.get(f"{server}/images/{image_id(data)}.png", timeout=60)
    assert response.status_code == 200 and response.content == data and response.headers["content-type"] == "image/png"
    for name in (f"{image_id(data)}.jpg", "..%2Fparams.yaml", "params.yaml", f"{'0' * 64}.png"):
        assert httpx.get(f"{server}/images/{name}", timeout=60).status_code == 404, name
