"""Vision-language policies: the embedded tiny VLM, the processor that turns a prompt's images into model inputs.

A policy is a vision-language model when its config has a `vision_config` (LLaVA, Qwen2-VL, SmolVLM/Idefics3):
it loads with `AutoModelForImageTextToText`, and its processor expands each image placeholder of a rendered
prompt into the image's tokens and turns the images into pixel inputs (`pixel_values`, and what the model
family adds: `image_grid_thw`, `image_sizes`, `pixel_attention_mask`).

The pixel inputs of a prompt travel with its token ids as one dict (`VisionInputs`), a row of a batch
each; `batched` joins the rows of a forward pass along the first dimension, the layout LLaVA's and Qwen2-VL's
forwards take (one image after the other, in the order their placeholders appear in the batch; tested with a random
LLaVA, Qwen2-VL, whose 3-D rotary positions come from the token types `batched` adds, and Idefics3).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rl_assets.core.tokenizer import IMAGE_TOKEN, saved_processor

VisionInputs = dict[str, torch.Tensor]  # one prompt's pixel inputs; {} for a prompt without images


# Where each family keeps its vision encoder and the projector into the language model (LLaVA, Qwen2-VL, Idefics3/SmolVLM).
VISION_MODULES = ("vision_tower", "multi_modal_projector", "visual", "vision_model", "connector")
VISION_MODULES_PATTERN = rf"(.*\.)?({'|'.join(VISION_MODULES)})(\..*)?"  # PEFT's exclude_modules: no adapters there


def freeze_vision(model) -> int:
    """Stop a vision-language model's vision encoder and projector from training (train.freeze_vision); returns how many
    parameters were frozen (0 for a text model).

    >>> import torch
    >>> class Tiny(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.vision_tower, self.language_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    >>> freeze_vision(Tiny())
    6
    """
    frozen = 0
    for name, parameter in model.named_parameters():
        if any(part in VISION_MODULES for part in name.split(".")):
            parameter.requires_grad_(False)
            frozen += parameter.numel()
    return frozen


def is_vision_model(config) -> bool:
    """Whether a model (its config) reads images: it has a vision tower's config."""
    return getattr(config, "vision_config", None) is not None


def folder_is_vision_model(folder: str | Path) -> bool:
    """Whether a saved model folder holds a vision-language model (read from its config.json, no weights)."""
    import json

    config = Path(folder) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("vision_config") is not None


def build_tiny_vlm(text_config, vision, image_token_id: int, seed: int):
    """The embedded vision-language policy: a LLaVA whose language model is the tiny Llama of `text_config`
    and whose vision tower is a SigLIP encoder of `vision`'s shape (TinyVisionParams), one token per patch."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

    tower = SiglipVisionConfig(hidden_size=vision.hidden_size, intermediate_size=4 * vision.hidden_size, num_hidden_layers=vision.num_layers,
                               num_attention_heads=vision.num_heads, image_size=vision.image_size, patch_size=vision.patch_size)
    config = LlavaConfig(vision_config=tower, text_config=text_config, image_token_id=image_token_id, vision_feature_select_strategy="full",
                         vision_feature_layer=-1, image_seq_length=(vision.image_size // vision.patch_size) ** 2,
                         tie_word_embeddings=text_config.tie_word_embeddings)
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(config)


def tiny_processor(tokenizer, config):
    """The embedded VLM's processor, made from its tokenizer and config: images resized to the tower's size."""
    from transformers import LlavaProcessor, SiglipImageProcessorPil

    side = config.vision_config.image_size
    images = SiglipImageProcessorPil(size={"height": side, "width": side})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=config.vision_config.patch_size,
                          vision_feature_select_strategy="full", image_token=IMAGE_TOKEN, num_additional_image_tokens=0)


def load_processor(folder: str | Path | None, tokenizer, config):
    """The processor of a vision-language policy: the one saved in its folder (a hub VLM's), else the embedded VLM's."""
    return saved_processor(folder) or tiny_processor(tokenizer, config)


def placeholder_ids(config) -> list[int]:
    """Token ids that stand for an image or video in a VLM's input: never sampled, since a completion holding one
    would ask the next forward for pixels it was not given.

    >>> from types import SimpleNamespace
    >>> placeholder_ids(SimpleNamespace(image_token_id=99, video_token_id=None)), placeholder_ids(SimpleNamespace())
    ([99], [])
    """
    ids = (getattr(config, name, None) for name in ("image_token_id", "image_token_index", "video_token_id"))
    return sorted({i for i in ids if isinstance(i, int)})


def encode_with_images(processor, prompts: list[str], images: list[list]) -> tuple[list[list[int]], list[VisionInputs]]:
    """Token ids of each rendered prompt, its image placeholders expanded into the images' tokens, and its pixel inputs.

    `images[i]` are the PIL images of prompt i, in the order of its placeholders (none: a text prompt, {} inputs).
    """
    ids, inputs = [], []
    bos = processor.tokenizer.bos_token_id
    for prompt, shown in zip(prompts, images):
        encoded = processor(text=[prompt], images=list(shown) or None, return_tensors="pt")
        row = encoded["input_ids"][0].tolist()
        ids.append(row[1:] if bos is not None and len(row) > 1 and row[0] == row[1] == bos else row)  # as encode_prompts: one BOS
        inputs.append({key: value for key, value in encoded.items() if key not in ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")})
    return ids, inputs


def pixel_inputs(processor, images: list[list]) -> list[VisionInputs]:
    """Each row's pixel inputs from its PIL images, as `encode_with_images` gives them (training reads the stored token
    ids); rows that show the same images share one dict."""
    made: dict[tuple, VisionInputs] = {}
    rows = []
    for shown in images:
        key = tuple(id(image) for image in shown)
        if key not in made:
            made[key] = dict(processor.image_processor(images=list(shown), return_tensors="pt")) if shown else {}
        rows.append(made[key])
    return rows


def has_multimodal_positions(config) -> bool:
    """Whether a VLM puts its tokens at 3-D rotary positions (Qwen2-VL's M-RoPE): its forward computes them from which
    tokens are image tokens (`mm_token_type_ids`), so nothing may hand it 1-D position ids.

    >>> from transformers import LlamaConfig
    >>> has_multimodal_positions(LlamaConfig()), has_multimodal_positions(LlamaConfig(rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]}))
    (False, True)
    """
    text = config.get_text_config()
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    return isinstance(rope, dict) and "mrope_section" in rope


def batched(rows: list[VisionInputs] | None, model, input_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The pixel inputs of a batch's rows joined along the first dimension (images in row order), on `model`'s device
    and, the floating ones, in its dtype; {} without images. For a model with multimodal positions, the type of each of
    `input_ids`' tokens too (`mm_token_type_ids`: 1 an image's, 2 a video's), as its processor gives them."""
    if not rows:
        return {}
    weight = next(model.parameters())
    joined = {key: torch.cat([row[key] for row in rows if key in row]) for key in sorted({key for row in rows for key in row})}
    joined = {key: value.to(weight.device, weight.dtype if value.is_floating_point() else value.dtype) for key, value in joined.items()}
    config = getattr(model, "config", None) or model.module.config  # under DDP or FSDP: the wrapped model's
    if input_ids is not None and has_multimodal_positions(config):
        kinds = torch.zeros_like(input_ids)
        for kind, name in ((1, "image_token_id"), (2, "video_token_id")):
            if isinstance(getattr(config, name, None), int):
                kinds[input_ids == getattr(config, name)] = kind
        joined["mm_token_type_ids"] = kinds
    return joined
