"""The trace-driven simulator: replay of the same policy code, its policies and baselines in the
replay, realised phase times, learning of measured profiles, the ``simulate`` command and plots."""
