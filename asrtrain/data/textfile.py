"""Reading the UTF-8 text files of a corpus, a data dir or a dict dir, one numbered line at a time.

Kaldi tables, LDC transcripts and lexicons are UTF-8 (or its ASCII subset). A byte that is not
UTF-8 is reported with the file, the line and the column where it sits, instead of Python's
``UnicodeDecodeError``, which names neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from asrtrain import AsrtrainError


def decode_line(raw: bytes, path: Path | str, lineno: int) -> str:
    """``raw`` decoded as UTF-8, or an error naming the file, line, column and byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AsrtrainError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                            f"column {e.start + 1}); convert the file to UTF-8") from None


def utf8_lines(path: Path | str) -> Iterator[tuple[int, str]]:
    """``(line number from 1, line without its line break)`` of the UTF-8 text file ``path``."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise AsrtrainError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            yield lineno, decode_line(raw, path, lineno).rstrip("\r\n")
