"""Training: SFT warm start, policy-gradient rounds (advantages, losses, resumable state), preference rounds, reward models."""


def __getattr__(name: str):  # this package was a module before 0.2: its functions name where they are now
    from rl_assets import moved_name

    moved_name(__name__, name)
