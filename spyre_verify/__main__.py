"""`python -m spyre_verify` is the `spyre-verify` command."""

import sys

from spyre_verify.cli.main import main

# Guarded: the fault catalog's worker processes (spawned) import this module as __mp_main__.
if __name__ == "__main__":
    sys.exit(main())
