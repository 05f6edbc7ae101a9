"""Exceptions raised by the package. Each carries the Rust error's message and, where the error names
one, the ``field`` it is about (a scenario field's path such as ``vms[0].containers[1].memory_limit_mib``,
a miss-ratio-curve parameter such as ``policy``, a sweep's ``grid`` entry)."""

from typing import Optional

__all__ = ["DoubleDeckerError", "LabError", "MrcError", "TraceError", "SweepError"]


class DoubleDeckerError(Exception):
    """Base class of the package's errors.

    Attributes:
        message: the error's text, as the command line prints it.
        field: the field or parameter the error names, or ``None``.
    """

    def __init__(self, message: str, field: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return self.message


class LabError(DoubleDeckerError):
    """A scenario or sweep that does not parse or validate, or a run that fails."""


class MrcError(DoubleDeckerError):
    """A miss-ratio-curve configuration that makes no sense (``field`` names the parameter)."""


class TraceError(DoubleDeckerError):
    """A trace file that cannot be read (missing, truncated, a bad CSV line, bad zstd)."""


class SweepError(DoubleDeckerError):
    """Some points of a sweep failed (``failed`` maps each point to its error's text); the points that
    finished are done, so calling the sweep again runs only the others."""

    def __init__(self, message: str, failed: dict):
        super().__init__(message, None)
        self.failed = failed
