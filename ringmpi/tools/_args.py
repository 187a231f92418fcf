"""The tools' argument parser: plain-text help with every default shown, said once per job."""

from __future__ import annotations

import argparse
import re
import warnings
from typing import Any, NoReturn

from ringmpi._program import launcher_rank

from ._units import format_size, parse_size, sweep, whole

__all__ = ["ArgumentParser", "plain", "quiet_compiles"]

# reST in the module docstrings that become descriptions: a role (:func:`~a.b`),
# literal text (``x``), a literal block's "::" and emphasis (*word*).
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_BLOCK = re.compile(r"(\S)::$", re.MULTILINE)
_EMPHASIS = re.compile(r"(?<![\w*`])\*(\w+)\*(?![\w*])")


def quiet_compiles() -> None:
    """Silence ``ringmpi.CompileWarning`` (by its text: importing it would load Numba):
    a tool says itself that its kernels compile, and how long it took."""
    warnings.filterwarnings("ignore", "ringmpi is compiling", UserWarning)


def plain(text: str) -> str:
    """``text`` with its reST markup as argparse prints it: code as `code`, a role's
    target as `target` (its last part where reST shows that), no "::"."""
    text = _ROLE.sub(lambda m: f"`{m[2].rpartition('.')[2] if m[1] else m[2]}`", text)
    text = _LITERAL.sub(r"`\1`", text)
    text = _BLOCK.sub(r"\1:", text)
    return _EMPHASIS.sub(r"\1", text)


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

    def add_sweep(self, first: int, last: int, factor: int) -> None:
        """``-b``, ``-e`` and ``-f``: a sweep of sizes from ``first`` to ``last`` bytes,
        times ``factor`` (:meth:`sizes` gives them)."""
        size = parse_size
        self.add_argument("-b", "--minbytes", type=size, default=first,
                          help="smallest size, 1 or more bytes (8, 64K, 16M, ...)")  # fmt: skip
        self.add_argument("-e", "--maxbytes", type=size, default=last, help="largest size")
        self.add_argument("-f", "--stepfactor", type=whole(1), default=factor,
                          help="size multiplier, 2 or more (1: one size, -b = -e)")  # fmt: skip

    def sizes(self, args: argparse.Namespace) -> list[int]:
        """The sweep's sizes; an error naming the flags where they give none."""
        try:
            return sweep(args.minbytes, args.maxbytes, args.stepfactor)
        except ValueError as exc:
            self.error(str(exc))

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        super().exit(status, message if launcher_rank() == 0 else None)
