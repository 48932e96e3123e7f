"""Reading the UTF-8 text files of a corpus, a data dir or a dict dir, one numbered line at a time.

Kaldi tables, LDC transcripts and lexicons are UTF-8 (or its ASCII subset). A byte that is not
UTF-8 is reported with the file, the line and the column where it sits, instead of Python's
``UnicodeDecodeError``, which names neither.

Kaldi tables are UTF-8 without a byte order mark; a file saved with one (Windows editors do) has
it removed when read, with a warning naming the file, as Python's ``utf-8-sig`` codec would: kept,
it would become part of the first key, invisible in every message that quotes it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from asrtrain import AsrtrainError

log = logging.getLogger(__name__)

BOM = b"\xef\xbb\xbf"
_warned_bom: set[str] = set()


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
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
                if str(path) not in _warned_bom:
                    _warned_bom.add(str(path))
                    log.warning("%s: starts with a UTF-8 byte order mark (BOM, bytes EF BB BF), "
                                "which Kaldi tables do not have; it is ignored", path)
            yield lineno, decode_line(raw, path, lineno).rstrip("\r\n")
