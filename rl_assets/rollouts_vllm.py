"""rollouts on GPUs through vLLM, when it is installed (extra `[vllm]`); `rollouts.generate` is the fallback.

vLLM only proposes the completion tokens. Their log-probs are recomputed by the transformers policy
in `sample_rollouts`, so training's first importance ratio is exactly 1 whichever engine sampled.
"""

from __future__ import annotations

import importlib.util

from rl_assets.rollouts import Completions


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(requested: str, device: str) -> str:
    """auto: vLLM on a GPU when installed, else transformers; an explicit vllm without vLLM is an error.

    >>> resolve_engine("auto", "cpu")
    'transformers'
    """
    if requested == "vllm" and not vllm_available():
        raise ValueError("rollouts.engine: vllm is not installed (pip install 'rl-assets[vllm]'), or use engine: transformers")
    if requested == "auto":
        return "vllm" if device.startswith("cuda") and vllm_available() else "transformers"
    return requested


def generate_vllm(model_path: str, tokenizer, prompts: list[str], samples_per_prompt: int, *, temperature: float, top_p: float,
                  max_new_tokens: int, seed: int, gpu_memory_utilization: float = 0.5) -> Completions:
    """Sample `samples_per_prompt` completions per prompt with vLLM, in the same prompt-major order as `generate`."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_path), seed=seed, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True)
    sampling = SamplingParams(n=samples_per_prompt, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed)
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in encoded], sampling, use_tqdm=True)
    out = Completions([], [], [], [])
    for ids, output in zip(encoded, outputs):
        for sample in output.outputs:
            completion = list(sample.token_ids)
            ended = tokenizer.eos_token_id in completion
            completion = completion[: completion.index(tokenizer.eos_token_id) + 1] if ended else completion
            out.prompt_ids.append(list(ids))
            out.completion_ids.append(completion)
            out.texts.append(tokenizer.decode(completion, skip_special_tokens=True))
            out.truncated.append(not ended)
    del llm  # frees the GPU memory before the transformers policy recomputes log-probs
    return out
