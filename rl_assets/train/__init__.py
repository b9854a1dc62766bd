"""Training: SFT warm start, policy-gradient rounds (advantages, losses, resumable state), preference rounds, reward models."""
