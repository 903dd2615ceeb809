"""A small, real attention-bucketing runtime: the system spyre-verify verifies.

Data flows one way: `config` -> `bucketer` (every ladder and bucket, pruned by
`reachability`) -> the `metadata` builder and the `warmup` recorder -> `paged_attention`
(the `attention` kernels, compiled by `compiler`) -> the `engine`, which runs the
`scheduler`'s steps over the `block_pool`. Observers see it all through `events`.
"""
