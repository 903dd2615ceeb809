"""spyre-verify: invariant checkers, controls, hunts and audits for attention bucketing."""

__version__ = "0.1.0"
