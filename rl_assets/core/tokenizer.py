"""The policy's tokenizer: the embedded model's character-level one, or a Hugging Face model's own.

Apart from policy.py and vision.py so that the prompts step, which needs only the tokenizer and an image's token
count, does not import torch and the model classes.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from rl_assets.core.config import ModelParams

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
IMAGE_TOKEN = "<image>"  # the embedded VLM's image placeholder (LLaVA's)
TINY_CHARACTERS = string.digits + string.ascii_letters + " +-*/=().,:;?!#%$&'\"<>[]{}\\^_|~@\n"


def build_tiny_tokenizer(images: bool = False) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character, BOS prepended, no download.

    With `images` (the embedded VLM), one more token, IMAGE_TOKEN, stands for an image (`tokenizer.image_token`).
    """
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + list(dict.fromkeys(TINY_CHARACTERS)) + ([IMAGE_TOKEN] if images else []))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])])
    if images:  # matched whole before the split into characters
        core.add_special_tokens([IMAGE_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                   **({"extra_special_tokens": {"image_token": IMAGE_TOKEN}} if images else {}))


def load_tokenizer(params: ModelParams):
    """The base model's tokenizer (cheap: no weights are loaded), with pad = eos where the model has no pad token.
    A VLM folder's tokenizer names its processor's image placeholder (`tokenizer.image_token`), which prompts place."""
    if params.name_or_path == "tiny":
        return build_tiny_tokenizer(images=params.vision is not None)
    from transformers import AutoTokenizer  # imports torch: only for a real model's tokenizer

    tokenizer = AutoTokenizer.from_pretrained(params.name_or_path)
    processor = saved_processor(params.name_or_path) if Path(params.name_or_path).is_dir() else None
    if getattr(tokenizer, "image_token", None) is None and getattr(processor, "image_token", None) is not None:
        tokenizer = AutoTokenizer.from_pretrained(params.name_or_path, extra_special_tokens={"image_token": processor.image_token})
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def saved_processor(folder: str | Path | None):
    """The processor saved in a model folder (a hub VLM's, and every checkpoint made from one), else None."""
    if folder is not None and any((Path(folder) / name).is_file() for name in PROCESSOR_FILES):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)
    return None


def tokens_per_image(model) -> int | Callable[[object], int]:
    """How many tokens an image's placeholder expands into for the policy `model` (the params' model section) names, as
    the prompts' lengths count them: the embedded VLM's patches; what a VLM folder's processor makes of a blank picture,
    when pictures twice as large and twice as wide give as many (LLaVA, Idefics3 without splitting); 1, the placeholder
    alone, for a text model. Where a picture's size sets the count (Qwen2-VL, Idefics3 splitting large pictures into
    tiles), a function that counts what the processor makes of a given PIL picture.

    >>> from rl_assets.core.config import ModelParams
    >>> tokens_per_image(ModelParams(vision={"image_size": 48, "patch_size": 8})), tokens_per_image(ModelParams())
    (36, 1)
    """
    if model.vision is not None:
        return (model.vision.image_size // model.vision.patch_size) ** 2
    processor = saved_processor(model.name_or_path) if Path(model.name_or_path).is_dir() else None
    placeholder = getattr(processor, "image_token", None)
    if placeholder is None:
        return 1
    import json

    from PIL import Image

    bare = len(processor(text=[""], return_tensors="pt")["input_ids"][0])

    def expanded(image) -> int:
        return len(processor(text=[placeholder], images=[image], return_tensors="pt")["input_ids"][0]) - bare

    vision = json.loads((Path(model.name_or_path) / "config.json").read_text()).get("vision_config") or {}
    side = int(vision.get("image_size") or 224)
    counts = {expanded(Image.new("RGB", size)) for size in ((side, side), (2 * side, 2 * side), (2 * side, side))}
    return counts.pop() if len(counts) == 1 else expanded
