"""rollouts on GPUs through vLLM, when it is installed (extra `[vllm]`); `rollouts.generate` is the fallback.

vLLM proposes the completion tokens and reports its own log-prob of each (`sampler_logprobs`, after
temperature: vLLM's processed log-probs, as TRL asks for). The stored `logprobs` are recomputed by
the transformers policy in `sample_rollouts`, in the trainer's precision, so training's first ratio
is 1; the gap between the two is what train.sampler_correction_cap corrects (truncated importance
sampling, as TRL's vllm_importance_sampling_correction). vLLM is told to ignore the checkpoint's
generation_config (`generation_config="vllm"`), so sampling is exactly what params say.
"""

from __future__ import annotations

import importlib.util

from rl_assets.prompts import encode_prompts
from rl_assets.rollouts import Completions, cut_at_eos


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
                  max_new_tokens: int, seed: int, eos_ids: list[int], gpu_memory_utilization: float = 0.5) -> Completions:
    """Sample `samples_per_prompt` completions per prompt with vLLM, in the same prompt-major order as `generate`."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_path), seed=seed, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True,
              generation_config="vllm", logprobs_mode="processed_logprobs")
    sampling = SamplingParams(n=samples_per_prompt, temperature=temperature, top_p=top_p, top_k=-1, max_tokens=max_new_tokens, seed=seed,
                              stop_token_ids=eos_ids, logprobs=0)
    encoded = encode_prompts(tokenizer, prompts)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in encoded], sampling, use_tqdm=True)
    out = Completions([], [], [], [], sampler_logprobs=[])
    for ids, output in zip(encoded, outputs):
        for sample in output.outputs:
            completion, truncated = cut_at_eos(list(sample.token_ids), set(eos_ids))
            # logprobs=0: each position's dict holds the sampled token (vLLM adds it whatever the top-k)
            reported = [position[token].logprob for position, token in zip(sample.logprobs or [], completion)]
            out.prompt_ids.append(list(ids))
            out.completion_ids.append(completion)
            out.texts.append(tokenizer.decode(completion, skip_special_tokens=True))
            out.truncated.append(truncated)
            out.sampler_logprobs.append(reported if len(reported) == len(completion) else None)
    del llm  # frees the GPU memory before the transformers policy recomputes log-probs
    return out
