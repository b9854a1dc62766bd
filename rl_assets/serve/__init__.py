"""Serving: `rl-assets serve` (health, metrics, OpenAI-compatible completions), `rl-assets generate`, the Kubernetes example."""
