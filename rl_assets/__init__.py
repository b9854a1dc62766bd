"""rl-assets: RL post-training of language models as versioned, rerunnable assets.

The library is grouped by the flow (core, data, rollout, rewards, train, eval, serve, run); it never imports
Dagster, which lives in `pipelines`.
"""

__version__ = "0.2.0"
