"""Errors a user can fix. The CLI and the workflow print their message alone, without a traceback."""


class MemoptError(Exception):
    """A problem with the user's input or environment, explained in the message."""


class ConfigError(MemoptError):
    """A config value is not allowed: the message names the key, the value and what is allowed."""


class CorpusError(MemoptError):
    """The corpus cannot be fetched or is unusable."""


class KernelUnavailable(MemoptError):
    """A requested attention kernel or library cannot run here; never silently replaced."""


class exit_on_user_error:
    """Print a MemoptError's message alone and exit 1: no traceback for user mistakes."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and isinstance(exc, MemoptError):
            import sys

            from memopt.redact import redact

            print(f"memopt: error: {redact(str(exc))}", file=sys.stderr)
            sys.exit(1)
        return False
