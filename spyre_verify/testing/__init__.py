"""For a runtime team's own tests, like `zarr.testing`: the Hypothesis state machine over the
pool and scheduler, the Hypothesis profiles, and Dynamo's compiles outside a coverage tracer."""
