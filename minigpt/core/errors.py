"""One exception type for every problem a user can fix, so stages can print it cleanly and exit non-zero."""


class MinigptError(Exception):
    """A user-facing error: what is wrong, where, and how to fix it (in the message)."""


class ConfigError(MinigptError):
    """A params.yaml value is missing, mistyped or out of range."""


class DataError(MinigptError):
    """Input data is missing, corrupt or does not match what was expected."""


class WriteFailed(MinigptError):
    """An output could not be written (disk full, quota, read-only folder); the previous file is left as it was."""

    def __init__(self, target, cause: str):
        self.target, self.cause = target, cause
        super().__init__(f"{target}: could not write it ({cause}); the previous one is left as it was and nothing "
                         "half-written remains. Free disk space or fix the folder's permissions, then rerun.")
