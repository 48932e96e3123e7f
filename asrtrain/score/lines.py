"""Reading the NIST text files the scorer takes (STM, CTM, GLM) as SCTK's tools read them.

The files are read as latin-1 (any byte is a character, as in the C tools), split on ``\\n`` only
(a ``\\r`` stays part of the line), and a file's final newline does not make an empty last line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from asrtrain import AsrtrainError

_T = TypeVar("_T")


def read_lines(path: Path, what: str) -> list[tuple[int, str]]:
    """``(line number from 1, line)`` of the ``what`` file (``"STM"``, ``"CTM"``, ``"GLM"``)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("latin-1")
    except OSError as e:
        raise AsrtrainError(f"cannot read {what} file {path}: {e}") from e
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return list(enumerate(lines, start=1))


def data_fields(line: str) -> list[str] | None:
    """The whitespace-separated fields of an STM/CTM line; ``None`` for blank and ``;;`` lines."""
    stripped = line.strip()
    if not stripped or stripped.startswith(";;"):
        return None
    return stripped.split()


def parse_file(path: Path, what: str, parse: Callable[[str, Path, int], _T | None]) -> list[_T]:
    """``parse(line, path, line number)`` of every line of the file, in file order, leaving out
    what it returns ``None`` for (comments, blank lines)."""
    parsed = (parse(line, path, lineno) for lineno, line in read_lines(path, what))
    return [entry for entry in parsed if entry is not None]
