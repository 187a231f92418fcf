"""ringmpi's tools, one command each: ``python -m ringmpi <command> [args]``.

The tools use the library; no library module imports a tool. The commands and
their dispatcher: :mod:`ringmpi.tools._registry`.
"""

from ._registry import command_parser, main, prog

__all__ = ["command_parser", "main", "prog"]
