"""Serving a runtime under the checkers: the verification run (`session`), the one serve loop,
the traffic it serves (seeded workloads, coverage traffic, crowds, edge scenarios), the tape a
finding replays from, and the tensor-free engine the walks step."""
