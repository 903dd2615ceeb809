"""A ragged-layout runtime of its own, written against spyre-verify's documented protocol only.

It plays "a user's own ragged runtime": its types, ladders, scheduler, kernels and reachable set
are its own, and it declares its contract as plain data (`contract`) so that the harness can hold
it to the ragged layout's rules. `engine.make` is the factory: `--runtime tests.own_ragged.engine:make`.
Nothing here imports `runtime/` or `spyre_verify/` except `spyre_verify.runtimes.protocol.Settings`.
"""
