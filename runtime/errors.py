"""Typed errors of the runtime: every refusal names what was wrong and how to fix it."""


class RuntimeErrorBase(Exception):
    """Base class of every error the runtime raises on purpose."""


class ConfigError(RuntimeErrorBase, ValueError):
    """A configuration value (argument or env variable) breaks a rule."""


class RequestError(RuntimeErrorBase, ValueError):
    """A request can never be served; the engine is left unchanged."""


class PoolExhausted(RuntimeErrorBase):
    """The block pool cannot satisfy an allocation; the pool is left unchanged."""


class OwnershipError(RuntimeErrorBase):
    """A block was freed twice, or by a request that does not own it."""


class NoRungError(RuntimeErrorBase, ValueError):
    """A real size is larger than the top rung of its ladder."""
