"""`spyre-verify bench`: figures measured side by side in one process."""
