"""The oracle: what DESIGN.md says the runtime must do, derived with code of our own.

This package is the one deliberate re-implementation of the runtime's contract in
the harness. It never imports `runtime.ladders`, `runtime.reachability` or asks a
bucketer for an expected answer: a bug in shared code would move the expected and
the actual answer together. It may import the runtime's plain types (`Bucket`,
`RuntimeConfig`) and its config parser, to build a config.

- `derive`: ladders from a config, the bucket key of any batch shape.
- `walk`: the reachable set, by walking every add/step/finish/abort sequence under the pool and the volumetric limit.
- `model`: the scheduling rules as a lockstep model, compared with the engine after every step
  (`compare`).
- `reference`: the unpadded, unpaged, eager run of the same model that outputs are compared with.
"""
