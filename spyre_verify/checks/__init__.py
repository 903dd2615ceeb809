"""The invariant checkers. Each flags its negative control and stays quiet on a correct run."""
