"""Serving: `rl-assets serve` (health, metrics, OpenAI-compatible completions), `rl-assets generate`, the Kubernetes example."""


def __getattr__(name: str):  # this package was a module before 0.2: its functions name where they are now
    from rl_assets import moved_name

    moved_name(__name__, name)
