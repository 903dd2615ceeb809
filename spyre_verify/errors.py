"""Errors the harness raises on purpose. Its own module so that any module can raise
them without importing the CLI."""


class UsageError(ValueError):
    """Bad input from the user (a flag, a name, a profile): the CLI exits 2 with one line.

    A ValueError, so callers of the library functions that raise it (`faults.get`,
    `profiles.get_settings`) can keep catching what they caught before.
    """
