"""The error ringmpi raises for what goes wrong during communication."""

from __future__ import annotations

__all__ = ["RingMPIError"]


class RingMPIError(RuntimeError):
    """An error found while communicating: ranks that disagree, a message that does not fit."""
