"""The option types the commands share: numbers in ASCII digits, finite floats, paths whose error is one line,
choices read on first use."""

from __future__ import annotations

import math
import os
import re
from typing import IO, Any, Callable

import click

from ..bounds import escape_name

# int() and float() take any Unicode digit ('١٢٨' is 128) and '1_000': a number on our command lines is ASCII
_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
ASCII_ONLY = "written with the digits 0-9"


def ascii_int(text: str) -> int:
    """``int(text)`` for ASCII digits only (ValueError otherwise, its message to follow the text)."""
    if not _ASCII_INT.fullmatch(text.strip()):
        raise ValueError(f"is not a whole number {ASCII_ONLY}")
    return int(text)


def ascii_float(text: str) -> float:
    """``float(text)`` for an ASCII decimal number only (ValueError otherwise)."""
    if not _ASCII_FLOAT.fullmatch(text.strip()):
        raise ValueError(f"is not a number {ASCII_ONLY}")
    return float(text)


class AsciiIntRange(click.IntRange):
    """click.IntRange, whose int() takes '١٢٨' and '1_000', refusing anything but ASCII digits."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not _ASCII_INT.fullmatch(value.strip()):
            self.fail(f"{value!r} is not a whole number {ASCII_ONLY}.", param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloat(click.FloatRange):
    """A float option that refuses ``nan`` and ``inf`` (click's FloatRange compares, and NaN passes any comparison)
    and digits other than ASCII ones."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        if isinstance(value, str) and not _ASCII_FLOAT.fullmatch(value.strip()):
            self.fail(f"{value!r} is not a number {ASCII_ONLY}.", param, ctx)
        return number


class PathUsageError(click.UsageError):
    """A bad path on the command line as one line (``error: …``, exit 2), as our own usage errors are, not click's
    four-line usage block."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {escape_name(self.format_message(), limit=2000)}", err=True)


class PathParam(click.Path):
    """click.Path (``dir_okay=False``: a file; ``file_okay=False``: a folder) whose refusal is one line naming the
    option, the path and what to give. ``expect``: what the option wants, e.g. ``"a UTF-8 text file"``."""

    def __init__(self, *, expect: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.expect = expect or ("a folder" if not self.file_okay else "a file")

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not (self.allow_dash and value == "-"):
            where = _named(param, value)
            if not self.dir_okay and os.path.isdir(value):
                raise PathUsageError(f"{where}: is a directory; give {self.expect}", ctx)
            if not self.file_okay and os.path.exists(value) and not os.path.isdir(value):
                raise PathUsageError(f"{where}: is not a folder; give {self.expect}", ctx)
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            raise PathUsageError(f"{_named(param, str(value))}: {exc.format_message()}", ctx) from None


def _named(param: Any, value: str) -> str:
    """``--context-file book/`` for an option (its first name: ``-o`` of ``-o/--output``), the path alone for an
    argument (OUT)."""
    shown = escape_name(value, limit=160)
    return f"{param.opts[0]} {shown}" if isinstance(param, click.Option) else shown


class LazyChoice(click.Choice):
    """A click.Choice whose choices are read from a table on first use. The report formats and the
    provenance verdicts live in modules (the report model, the inspect checks) that the quantize and
    convert commands never load; importing them at start-up would cost every command ~40 ms."""

    def __init__(self, load: Callable[[], Any], case_sensitive: bool = True) -> None:  # noqa: D107
        self._load = load
        self._choices: tuple[str, ...] | None = None
        self.case_sensitive = case_sensitive

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices
