"""`python -m spyre_verify` is the `spyre-verify` command."""

import sys

from spyre_verify.cli.main import main

sys.exit(main())
