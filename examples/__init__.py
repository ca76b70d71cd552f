"""Example RL jobs that run under RollMux (or solo, unchanged, without a scheduler)."""
