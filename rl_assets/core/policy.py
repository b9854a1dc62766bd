"""The policy model: the embedded tiny Llama (its character-level tokenizer is in tokenizer.py), or any HF causal LM;
with `model.vision`, the embedded tiny VLM, or any HF image-text-to-text model (rl_assets.core.vision).

`tiny` needs no download: the tokenizer's vocabulary is fixed and the weights are initialised
from the seed, so every machine builds the same base model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rl_assets.core.config import LoraParams, ModelParams, ParamsError
from rl_assets.core.tokenizer import load_tokenizer


def build_tiny_model(params: ModelParams, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """The embedded Llama-style policy (~1M parameters at the default shape); with `params.vision`, that Llama in a LLaVA."""
    shape = params.tiny
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    if params.vision is not None:
        from rl_assets.core.vision import build_tiny_vlm

        return build_tiny_vlm(config, params.vision, tokenizer.convert_tokens_to_ids(tokenizer.image_token), seed)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def model_class(folder: str | Path):
    """The Auto class a model folder loads with: image-text-to-text for a vision-language model, else causal LM."""
    from rl_assets.core.vision import folder_is_vision_model

    if Path(folder).is_dir() and folder_is_vision_model(folder):
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def check_model(params: ModelParams, source: str = "params.yaml", key: str = "model") -> None:
    """Before a run: a local model folder's vocabulary covers its tokenizer (`ParamsError` naming `key.name_or_path`).

    A tokenizer with more tokens than config.json's vocab_size yields ids past the embedding matrix,
    which fails (or, on a GPU, corrupts memory) inside the first compute step. Only the config and
    the tokenizer are read, no weights. A hub id must be in the local Hugging Face cache or answer on the hub
    (`reachable_on_hub`): a model that cannot be had stops the run before anything is written, not in r00's step.
    """
    import json

    folder = Path(params.name_or_path)
    where = f"{source}: {key}.name_or_path: {params.name_or_path}"
    if params.name_or_path == "tiny":
        return
    if not folder.is_dir():
        if params.name_or_path.startswith(("/", "./", "../")) or params.name_or_path.count("/") > 1:  # a path, not a hub id
            raise ParamsError(f"{where}: folder not found")
        if why := unreachable_on_hub(params.name_or_path):
            raise ParamsError(f"{where}: not a local folder, not in the Hugging Face cache, and {why}; import a local copy "
                              "(`rl-assets import-model`, or a folder saved with save_pretrained) and name its folder")
        return
    if not (folder / "config.json").is_file():
        return  # not a full model folder; loading it reports what is missing
    try:
        config = json.loads((folder / "config.json").read_text())
    except ValueError as error:
        raise ParamsError(f"{where}: config.json is not valid JSON ({error})") from None
    vocab_size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    if not isinstance(vocab_size, int):
        return
    try:
        tokens = len(AutoTokenizer.from_pretrained(folder))
    except Exception as error:  # noqa: BLE001 - the run would stop on the same error, later
        raise ParamsError(f"{where}: its tokenizer does not load: {type(error).__name__}: {error}") from None
    if tokens > vocab_size:
        raise ParamsError(f"{where}: config.json vocab_size={vocab_size} is smaller than the tokenizer's {tokens} tokens: token ids "
                          f"from {vocab_size} up would index past the embeddings; use the model's own tokenizer or resize its embeddings")


def unreachable_on_hub(repo_id: str, timeout: float = 10.0) -> str | None:
    """Why the hub model `repo_id` cannot be had (None when it is cached locally or the hub answers for it)."""
    import os

    from huggingface_hub import model_info, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    try:
        model_info(repo_id, timeout=timeout)
    except Exception as error:  # noqa: BLE001 - no network, no such repo, a gated one: each says why
        return f"the hub did not answer for it ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    return None


def load_base_model(params: ModelParams, seed: int):
    """(model, tokenizer) of the base policy named in params."""
    tokenizer = load_tokenizer(params)
    if params.name_or_path == "tiny":
        return build_tiny_model(params, tokenizer, seed), tokenizer
    return model_class(params.name_or_path).from_pretrained(params.name_or_path, dtype=torch.float32), tokenizer  # fp32 master weights


def load_policy(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32, chain: bool = False):
    """(model, tokenizer) of a saved checkpoint folder, in eval mode on `device`.

    `dtype` is explicit: transformers 5 would keep a bf16 checkpoint in bf16 (see precision.py).
    `chain`: the weights the next round continues from, the float32 ones a compact checkpoint was rounded from
    (train.checkpoint_dtype); otherwise the folder's, as evaluation, serving and promotion use them.
    """
    from rl_assets.core.checkpoints import load_master_weights
    from rl_assets.core.verify import checkpoint_intact

    checkpoint_intact(path)  # weights that are not those its card names (truncated, overwritten) stop here, naming the file
    adapters = (Path(path) / "adapter_config.json").is_file()  # LoRA adapters (lora.merge off): on their checked base
    folder = adapter_base(path) if adapters else path
    model = model_class(folder).from_pretrained(folder, dtype=dtype)
    if adapters:
        model.load_adapter(str(path))
    elif chain:
        load_master_weights(model, path)
    model = model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model.eval()
    return model, tokenizer


def adapter_base(path: str | Path, base_path: str | Path | None = None) -> str:
    """The base folder the LoRA adapter folder at `path` sits on, checked against the checkpoint id its card records.

    save_checkpoint records `lora_base` (the base's absolute path and checkpoint id). The base is
    `base_path` (e.g. this project's r00) or the recorded path, whichever holds that id; neither
    does when r00 was retrained or replaced underneath the adapters, and that is an error.
    """
    import json

    from rl_assets.core.checkpoints import checkpoint_id, read_lineage

    recorded = read_lineage(path).get("lora_base")
    if recorded is None:  # saved before adapters named their base: the given base or adapter_config's, unchecked
        return str(base_path) if base_path is not None else json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"]
    if recorded["checkpoint_id"] is None:  # a base without a lineage card (e.g. a hub model id): nothing to check
        return recorded["path"]
    found = {}
    for candidate in dict.fromkeys(str(Path(p).resolve()) for p in (base_path, recorded["path"]) if p is not None):
        try:
            found[candidate] = checkpoint_id(candidate)
        except FileNotFoundError:
            found[candidate] = "no checkpoint"
        if found[candidate] == recorded["checkpoint_id"]:
            return candidate
    now = "; ".join(f"{folder} holds {held}" for folder, held in found.items())
    raise ValueError(f"{path}: LoRA base changed: the adapters were trained on base checkpoint {recorded['checkpoint_id']} "
                     f"at {recorded['path']}, but {now}. Retrain the adapters on the new base, or restore the old one.")


def load_trainable_policy(path: str | Path, lora: LoraParams, base_path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
                          freeze_vision: bool = False):
    """(model, tokenizer) to train from checkpoint `path`: all weights, or LoRA adapters through PEFT.

    `freeze_vision` (train.freeze_vision): a vision-language policy's vision encoder and projector do not train (no adapters there).

    With LoRA, a parent saved as adapters (lora.merge off) keeps training the same adapters on the
    base they were trained on (r00 at `base_path`, checked by checkpoint id: `adapter_base`); a
    parent with full weights (r00, or merged) gets fresh adapters. `dtype`: fp32 master weights unless pure bf16.
    """
    if not lora.enabled:
        model, tokenizer = load_policy(path, device, dtype, chain=True)
        if freeze_vision:
            from rl_assets.core.vision import freeze_vision as freeze

            freeze(model)
        return model, tokenizer
    from peft import LoraConfig, PeftModel, get_peft_model

    from rl_assets.core.verify import checkpoint_intact

    checkpoint_intact(path)

    tokenizer = AutoTokenizer.from_pretrained(path)
    load = {}
    if lora.load_in_4bit:  # QLoRA: frozen NF4 base, adapters and their optimizer in full precision
        if not device.startswith("cuda"):
            raise ValueError("train.lora.load_in_4bit needs a CUDA device (bitsandbytes 4-bit kernels); set it to false on CPU")
        from transformers import BitsAndBytesConfig

        load = {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16),
                "device_map": {"": device}}
    adapters = (Path(path) / "adapter_config.json").is_file()
    base_folder = adapter_base(path, base_path) if adapters else str(Path(path).resolve())  # absolute, id checked
    base = model_class(base_folder).from_pretrained(base_folder, **{"dtype": dtype, **load})
    if not adapters and not lora.load_in_4bit:  # a compact parent: the float32 weights (4-bit quantizes them anyway)
        from rl_assets.core.checkpoints import load_master_weights

        load_master_weights(base, path)
    if lora.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        base = prepare_model_for_kbit_training(base)
    if adapters:
        model = PeftModel.from_pretrained(base, path, is_trainable=True)
    else:
        from rl_assets.core.vision import VISION_MODULES_PATTERN

        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules, task_type="CAUSAL_LM",
                            exclude_modules=VISION_MODULES_PATTERN if freeze_vision else None)
        model = get_peft_model(base, config)
    model.peft_config[model.active_adapter].base_model_name_or_path = base_folder  # what save_checkpoint records as the base
    if not lora.load_in_4bit:  # a quantized model is already placed; .to() is not allowed on it
        model.to(device)
    model.eval()
    return model, tokenizer


def pick_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested
