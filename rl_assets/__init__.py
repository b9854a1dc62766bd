"""rl-assets: RL post-training of language models as versioned, rerunnable assets."""

__version__ = "0.1.0"
