"""One exception type for every problem a user can fix, so stages can print it cleanly and exit non-zero."""


class MinigptError(Exception):
    """A user-facing error: what is wrong, where, and how to fix it (in the message)."""


class ConfigError(MinigptError):
    """A params.yaml value is missing, mistyped or out of range."""


class DataError(MinigptError):
    """Input data is missing, corrupt or does not match what was expected."""
