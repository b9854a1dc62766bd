"""What a compute process keeps loaded between the steps it runs: the policy, the KL reference and PPO's value model.

A step asks for a checkpoint by path. It gets the model already in memory when that memory holds
exactly that checkpoint (same id, dtype and device), else a fresh load. A process that runs one
step starts empty and loads everything; the resident process (`rl_assets.run.resident`) runs a run's
rounds with one `Loaded`, so round N+1 samples with the model round N has just trained and saved,
and the reference stays put while training uses it (train.beta > 0), or on a GPU with room for it (`reference_fits`). The carried AdamW moments (twice
the weights) are not kept: each round reads them from <data>/run_state, so sampling never holds them.
Both must give the same outputs (tested: bit-identical checkpoint ids), so only what equals a fresh load is kept: a full-weights policy after a round of
the policy-gradient family, saved in the dtype it is kept in, and a value model (fp32, as saved). LoRA adapters (saving
merges them) and models from TRL's DPO/RFT trainers are loaded again from disk.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from rl_assets.core.checkpoints import checkpoint_id, read_lineage
from rl_assets.core.policy import load_policy


class Loaded:
    def __init__(self) -> None:
        self._policy: tuple | None = None  # (checkpoint id, dtype, device, the float32 weights of a compact one, model, tokenizer)
        self._reference: tuple | None = None  # (checkpoint id, device, model)
        self._critic: tuple | None = None  # ((checkpoint id, how it started, device), model): ppo's value model
        self.engine = None  # the colocated vLLM engine (rl_assets.rollout.vllm_sampling.VllmEngine), created by the first vLLM rollouts
        self.loads: Counter = Counter()  # what came from disk, e.g. {"policy": 1, "reference": 1}

    def policy(self, path: str | Path, device: str, dtype: torch.dtype, chain: bool = False):
        """(model, tokenizer) of checkpoint `path`, in eval mode: the one in memory when it is that checkpoint.

        `chain`: the weights the next round continues from (load_policy's): a compact checkpoint's float32 weights.
        """
        card = read_lineage(path)
        wanted = (card["checkpoint_id"], dtype, device, chain and bool(card.get("master_weights")))
        if self._policy is not None and self._policy[:4] == wanted:
            return self._policy[4], self._policy[5]
        self._policy = None  # free it before loading the next
        model, tokenizer = load_policy(path, device, dtype, chain=chain)
        self.loads["policy"] += 1
        self._policy = (*wanted, model, tokenizer)
        return model, tokenizer

    def take_policy(self, path: str | Path, device: str, dtype: torch.dtype):
        """The policy to train in place; out of memory until `keep_policy` puts the trained one back, so a failed round leaves nothing stale."""
        model, tokenizer = self.policy(path, device, dtype, chain=True)
        self._policy = None
        return model, tokenizer

    def keep_policy(self, model, tokenizer, saved_id: str, device: str, dtype: torch.dtype, compact: bool = False) -> None:
        """Keep the model just saved as checkpoint `saved_id` (its weights equal that folder's; `compact`: equal to the float32
        weights the folder was rounded from, so only the next round's sampling and training use it)."""
        self._policy = (saved_id, dtype, device, compact, model.to(device), tokenizer)

    def reference(self, path: str | Path, device: str):
        """The KL reference (r00) in fp32, loaded once."""
        wanted = checkpoint_id(path)
        if self._reference is None or self._reference[:2] != (wanted, device):
            self._reference = (wanted, device, load_policy(path, device)[0])
            self.loads["reference"] += 1
        return self._reference[2]

    def drop_reference(self) -> None:
        self._reference = None

    def reference_fits(self, device: str, share: float = 0.05) -> bool:
        """Whether the reference held now may stay loaded when only a metric needs it (train.beta 0): on a GPU where it
        takes at most `share` of the memory (loading it again each round costs seconds there); never on a CPU, where
        it would add to every later round's peak."""
        if self._reference is None or not device.startswith("cuda"):
            return False
        size = sum(p.numel() * p.element_size() for p in self._reference[2].parameters())
        return size <= share * torch.cuda.get_device_properties(torch.device(device)).total_memory

    def critic(self, path: str | Path, device: str, start: str | None = None, lora=None):
        """PPO's value model from `path` (rl_assets.train.critic.load_critic, `start` and `lora` as there): the one in memory when it
        is that."""
        from rl_assets.train.critic import load_critic

        wanted = (checkpoint_id(path), start, device)
        if self._critic is not None and self._critic[0] == wanted:
            return self._critic[1]
        self._critic = None
        model = load_critic(path, device, start=start, lora=lora)
        self.loads["critic"] += 1
        self._critic = (wanted, model)
        return model

    def take_critic(self, path: str | Path, device: str, start: str | None = None, lora=None):
        """The value model to train in place; out of memory until `keep_critic` puts the trained one back."""
        model = self.critic(path, device, start, lora)
        self._critic = None
        return model

    def keep_critic(self, model, saved_id: str, device: str) -> None:
        """Keep the value model just saved as `saved_id` (fp32, as loading that folder gives it)."""
        self._critic = ((saved_id, None, device), model.to(device))
