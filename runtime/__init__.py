"""A small, real attention-bucketing runtime: the system spyre-verify verifies."""

from runtime.bucketer import BATCHED, DECODE, KERNELS, PREFILL, Bucket, SpyreAttnBucketer
from runtime.config import ModelDims, RuntimeConfig
from runtime.errors import ConfigError, NoRungError, OwnershipError, PoolExhausted, RequestError

__all__ = [
    "BATCHED",
    "DECODE",
    "KERNELS",
    "PREFILL",
    "Bucket",
    "ConfigError",
    "ModelDims",
    "NoRungError",
    "OwnershipError",
    "PoolExhausted",
    "RequestError",
    "RuntimeConfig",
    "SpyreAttnBucketer",
]
