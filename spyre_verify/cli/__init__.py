"""The `spyre-verify` command line: one module per command, and the shared config flags."""
