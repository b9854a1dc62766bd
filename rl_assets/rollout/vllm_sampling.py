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

from rl_assets.data.prompts import encode_prompts
from rl_assets.rollout.generation import Completions, cut_at_eos


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(requested: str, device: str, vision: bool = False) -> str:
    """auto: vLLM on a GPU when installed, else transformers, which also samples a vision-language policy (`vision`: its
    images do not go through vLLM yet); an explicit vllm without vLLM, or with a vision-language policy, is an error.

    >>> resolve_engine("auto", "cpu"), resolve_engine("auto", "cuda:0", vision=True)
    ('transformers', 'transformers')
    """
    if requested == "vllm" and vision:
        raise ValueError("rollouts.engine: vllm does not sample a vision-language policy yet (its images); use engine: auto or transformers")
    if requested == "vllm" and not vllm_available():
        raise ValueError("rollouts.engine: vllm is not installed (pip install 'rl-assets[vllm]'), or use engine: transformers")
    if requested == "auto":
        return "vllm" if device.startswith("cuda") and vllm_available() and not vision else "transformers"
    return requested


class VllmEngine:
    """A vLLM engine that samples for round after round, as TRL's colocate mode keeps one in the training process.

    It is created once from the first policy's folder, with sleep mode on. Before each sampling it wakes, takes the current
    policy's weights in place (`load_weights`, the call TRL's colocate mode makes) and drops its prefix cache; after it, it
    sleeps at level 2, giving the GPU memory of its weights and KV cache back to training. Each request carries its seed, so
    what it samples does not depend on what the engine sampled before.
    """

    def __init__(self, model_path: str, seed: int, gpu_memory_utilization: float = 0.5, sleep: bool = True):
        from vllm import LLM

        self.sleep = sleep
        self.llm = LLM(model=str(model_path), seed=seed, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True,
                       generation_config="vllm", logprobs_mode="processed_logprobs", enable_sleep_mode=sleep)
        self.policy_id: str | None = None  # whose weights the engine holds; None once asleep at level 2 (weights discarded)
        self.weight_pushes = 0
        if sleep:
            self.llm.sleep(level=2)

    def _take_weights(self, model, policy_id: str) -> None:
        if self.sleep:
            import torch

            torch.cuda.empty_cache()  # as TRL does before waking: blocks the training step's allocator still caches would crowd the weights out
            self.llm.wake_up(tags=["weights"])
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.model.load_weights((name, parameter.detach()) for name, parameter in model.state_dict().items())
        self.llm.reset_prefix_cache()
        self.policy_id = policy_id
        self.weight_pushes += 1

    def generate(self, model, policy_id: str, tokenizer, prompts: list[str], samples_per_prompt: int, *, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int, eos_ids: list[int]) -> Completions:
        """`samples_per_prompt` completions per prompt from `model`'s current weights, in the same prompt-major order as `generate`."""
        from vllm import SamplingParams

        if self.policy_id != policy_id:
            self._take_weights(model, policy_id)
        if self.sleep:
            self.llm.wake_up(tags=["kv_cache"])
        sampling = SamplingParams(n=samples_per_prompt, temperature=temperature, top_p=top_p, top_k=-1, max_tokens=max_new_tokens, seed=seed,
                                  stop_token_ids=eos_ids, logprobs=0)
        encoded = encode_prompts(tokenizer, prompts)
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in encoded], sampling, use_tqdm=True)
        if self.sleep:  # level 2 drops the weights too: the next round pushes its own
            self.llm.sleep(level=2)
            self.policy_id = None
        return _completions(encoded, outputs, tokenizer, eos_ids)


def _completions(encoded: list[list[int]], outputs, tokenizer, eos_ids: list[int]) -> Completions:
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
    return out
