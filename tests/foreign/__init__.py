"""A second runtime, written from scratch in the style of nano-vllm, that proves the protocol.

It shares no code with `runtime/`: its own config, Gaudi-style exponential bucketing (a
batch-size ladder and a sequence-length ladder, right padding, no strip), block pool,
scheduler, tiny model, compiled paged kernels and fault catalog. The harness loads it as
`tests.foreign.engine:make` and sees it only through `spyre_verify.runtimes.protocol`.

One concept a file: config, buckets, block_pool, sequence, scheduler, layout, model,
kernels, runner, attention, events, faults, engine.
"""
