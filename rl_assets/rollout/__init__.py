"""Rollouts: completions sampled from a policy (transformers or vLLM), single-turn or as episodes with tools and environments."""
