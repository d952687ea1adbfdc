"""TOML files read with errors that name the file, the line and the field.

``tomllib`` parses but forgets where each value came from; a user who mistyped a field
needs the line. ``TomlFile`` keeps the source text and points every error at the line
of the offending key (or the header of its table), so scenario and pipeline files
report problems the same way: ``FILE, line N: FIELD MESSAGE``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from containers.errors import ScenarioError

_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$")


class TomlFile:
    """The source lines of one TOML file, for checking its parsed values and locating errors.

    Args:
        path: the file, named in every error.
        lines: its text, line by line.
        choices: fields whose value must be one of a fixed set, checked by ``value``.
    """

    def __init__(self, path: Path, lines: Sequence[str], choices: Mapping[str, Sequence[str]] | None = None) -> None:
        self.path, self.lines, self.choices = path, list(lines), dict(choices or {})

    @classmethod
    def read(cls, path: str | Path, what: str, choices: Mapping[str, Sequence[str]] | None = None
             ) -> tuple[dict[str, Any], TomlFile]:
        """Parse ``path`` (a ``what`` file, e.g. "scenario") and return its values with a reader for its lines."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise ScenarioError(f"cannot read {what} {path}: {err.strerror}") from None
        except UnicodeDecodeError as err:
            line = err.object[:err.start].count(b"\n") + 1
            raise ScenarioError(f"{path}, line {line}: not UTF-8 text (byte {err.object[err.start]:#04x}); "
                                f"a {what} file must be UTF-8 TOML") from None
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ScenarioError(f"{path}: not valid TOML: {err}") from None
        return raw, cls(path, text.splitlines(), choices)

    def fail(self, where: str, message: str, table: str | None = None, index: int = 0,
             key: str | None = None) -> NoReturn:
        """Raise ``ScenarioError`` for field ``where`` at the line of ``key`` in ``table[index]``."""
        raise ScenarioError(f"{self.path}, line {self.line(table, index, key)}: {where} {message}")

    def line(self, table: str | None, index: int, key: str | None) -> int:
        """The line of ``key`` in the ``index``-th instance of ``table`` (None: top level), else its header."""
        current, seen, header = None, -1, 1
        for number, line in enumerate(self.lines, 1):
            m = _HEADER.match(line)
            if m:
                current = m.group(1)
                if current == table:
                    seen += 1
                    if seen == index:
                        header = number
                continue
            in_place = current is None if table is None else (current == table and seen == index)
            if in_place and key and re.match(rf"^\s*\"?{re.escape(key)}\"?\s*=", line):
                return number
        return header

    def value(self, raw: Mapping[str, Any], key: str, kind: type, default: Any, where: str,
              table: str | None = None, index: int = 0, positive: bool = False, line_key: str | None = None) -> Any:
        """``raw[key]`` checked for type, sign and choices; ``default`` when absent (``...`` = required).

        ``line_key``: the key whose line an error points at, when ``raw`` is an inline table on it.
        """
        line_key = line_key or key
        if key not in raw:
            if default is ...:
                self.fail(f"{where}{key}", "is missing", table, index, line_key)
            return default
        value = raw[key]
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = {str: isinstance(value, str), int: numeric and isinstance(value, int), float: numeric}[kind]
        if not ok or (positive and not value > 0):
            kinds = {str: "a string", int: "an integer", float: "a number"}
            expected = f"a positive {'integer' if kind is int else 'number'}" if positive else kinds[kind]
            self.fail(f"{where}{key}", f"must be {expected}; got {value!r}", table, index, line_key)
        if key in self.choices and value not in self.choices[key]:
            self.fail(f"{where}{key}", f"must be one of {', '.join(self.choices[key])}; got {value!r}", table, index,
                      line_key)
        return float(value) if kind is float else value

    def unknown(self, raw: Mapping[str, Any], allowed: set[str], where: str, table: str | None, index: int = 0,
                line_key: str | None = None) -> None:
        """Refuse fields we do not know (``line_key``: the key whose line holds an inline table)."""
        for key in raw:
            if key not in allowed:
                self.fail(f"{where}{key}", f"is not a known field; expected one of {', '.join(sorted(allowed))}",
                          table, index, line_key or key)

    def entry(self, raw: Any, table: str, index: int, allowed: set[str]) -> tuple[str, Any, str]:
        """Check the ``index``-th ``[[table]]`` entry's shape, fields and name.

        Returns its error prefix (``table[i].``), a ``val(key, kind, default, positive=False)``
        reader bound to it, and its validated ``name``.
        """
        where = f"{table}[{index}]."
        if not isinstance(raw, dict):
            self.fail(where[:-1], "must be a table", table, index)
        self.unknown(raw, allowed, where, table, index)

        def val(key: str, kind: type, default: Any, positive: bool = False) -> Any:
            return self.value(raw, key, kind, default, where, table, index, positive)

        name = val("name", str, ...)
        if not NAME.match(name):
            self.fail(f"{where}name", f"must be letters, digits, '-' or '_' (up to 41); got {name!r}", table, index,
                      "name")
        return where, val, name
