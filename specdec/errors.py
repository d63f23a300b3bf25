"""User-facing errors.

Every error a user can cause (bad input, a missing file, an impossible setting) is raised as a
`SpecdecError` whose message says what was wrong and what to do. The command line prints the
message and exits non-zero; it never shows a traceback for these.
"""


class SpecdecError(Exception):
    """An error caused by input or environment, with a message meant for the user."""


class ModelLoadError(SpecdecError):
    """A model could not be found, read or understood."""


class ConfigError(SpecdecError):
    """A generation or drafting setting is out of range or inconsistent."""


class ContextLengthError(SpecdecError):
    """A prompt (with the tokens asked for) does not fit the model's context."""


class BaselineFailed(SpecdecError):
    """A benchmark baseline failed (its process ended, or its code raised): the bench goes on without it
    (specdec/bench/child.py)."""
