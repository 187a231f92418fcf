"""The tools' argument parser: plain-text help with every default shown, said once per job."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

from ringmpi._program import launcher_rank

from ._units import format_size, parse_size

__all__ = ["ArgumentParser", "parse_count", "plain"]

# reST in the module docstrings that become descriptions: a role (:func:`~a.b`),
# literal text (``x``), a literal block's "::" and emphasis (*word*).
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_BLOCK = re.compile(r"(\S)::$", re.MULTILINE)
_EMPHASIS = re.compile(r"(?<![\w*`])\*(\w+)\*(?![\w*])")


def plain(text: str) -> str:
    """``text`` with its reST markup as argparse prints it: code as `code`, a role's
    target as `target` (its last part where reST shows that), no "::"."""
    text = _ROLE.sub(lambda m: f"`{m[2].rpartition('.')[2] if m[1] else m[2]}`", text)
    text = _LITERAL.sub(r"`\1`", text)
    text = _BLOCK.sub(r"\1:", text)
    return _EMPHASIS.sub(r"\1", text)


def parse_count(text: str) -> int:
    """Elements from ``1000``, ``1K``, ``4M`` (binary: 1K is 1024); an argparse type."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 1000, 1K, 4M)")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2].upper()]


def _shown(action: argparse.Action) -> str:
    """The default as a user would type it: a size as 64K."""
    values = action.default if isinstance(action.default, list) else [action.default]
    return " ".join(format_size(v) if action.type is parse_size else str(v) for v in values)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Description and epilog as written (line breaks kept); every help text plain and
    ending with its default, unless it names the default itself."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = plain(action.help or "")
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in text:
            return text
        shown = _shown(action).replace("%", "%%")
        if "(default " in text or text.endswith(f"({shown})"):
            return text
        return f"{text} (default {shown})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose description, epilog and help texts are plain text, and
    which under a launcher prints help, usage and errors on rank 0 only (the other
    ranks exit the same way, silently)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        for key in ("description", "epilog"):
            if kwargs.get(key):
                kwargs[key] = plain(kwargs[key])
        super().__init__(*args, **kwargs)

    def print_usage(self, file: Any = None) -> None:
        if launcher_rank() == 0:
            super().print_usage(file)

    def print_help(self, file: Any = None) -> None:
        if launcher_rank() == 0:
            super().print_help(file)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        super().exit(status, message if launcher_rank() == 0 else None)
