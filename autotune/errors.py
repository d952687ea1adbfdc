"""One root exception for autotune; the CLI maps each kind to an exit code."""


class AutotuneError(Exception):
    """A failure the user should see as one clear line (exit code 1)."""

    exit_code = 1


class UsageError(AutotuneError):
    """Bad input: a model, target, budget or path that cannot be used (exit code 2)."""

    exit_code = 2


class VerificationError(AutotuneError):
    """The compiled model's output differs from PyTorch's beyond tolerance (exit code 1)."""
