"""Errors the harness raises on purpose. Its own module so that any module can raise
them without importing the CLI."""


class UsageError(ValueError):
    """Bad input from the user (a flag, a name, a profile): the CLI exits 2 with one line.

    A ValueError, so callers of the library functions that raise it (`faults.get`,
    `profiles.get_settings`) can keep catching what they caught before.
    """


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a long run, carrying the run so far (`partial`) for a partial report.

    A KeyboardInterrupt, so a caller that does not look for it still stops as on any Ctrl-C.
    """

    def __init__(self, partial: object) -> None:
        super().__init__()
        self.partial = partial
