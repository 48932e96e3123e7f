"""What the LDC telephone corpora share: two-channel SPHERE conversations, one side per channel."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.audio import check_audio_file, sphere_side_command
from asrtrain.data.textfile import utf8_lines


def require_dir(path: Path, what: str, layout: str) -> Path:
    """``path`` as an existing directory, or an error saying which corpus layout was expected."""
    path = Path(path)
    if not path.is_dir():
        raise AsrtrainError(f"{path}: {what} directory not found; expected {layout}")
    return path


def find_sphere(root: Path, what: str, layout: str, allow_none: bool = False) -> dict[str, Path]:
    """Every ``*.sph`` under ``root`` (any case, any depth, as Kaldi's ``find -iname``), by name.

    The key is the file name without ``.sph`` (``sw02001``, ``en_4156``, ``fe_03_00001``).
    Finding none is an error unless ``allow_none``. Each file's header is checked here, so a
    garbled or truncated copy is named by the prepare stage, before any feature is computed.
    """
    found: dict[str, Path] = {}
    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() == ".sph" and p.is_file()):
        name = path.name[: -len(".sph")]
        if name in found:
            raise AsrtrainError(f"{path}: conversation {name} is also at {found[name]}; "
                                f"keep one copy under {root}")
        check_audio_file(path)
        found[name] = path.resolve()
    if not found and not allow_none:
        raise AsrtrainError(f"{root}: no .sph files found for the {what}; expected {layout}")
    return found


def side_tables(sph: dict[str, Path]) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """wav.scp and reco2file_and_channel for both sides of every conversation.

    Side A is channel 1, side B channel 2 (Kaldi: ``sph2pipe -f wav -p -c 1``).
    """
    wav: dict[str, str] = {}
    r2fc: dict[str, tuple[str, str]] = {}
    for name, path in sph.items():
        for channel, side in ((1, "A"), (2, "B")):
            wav[f"{name}-{side}"] = sphere_side_command(path, channel)
            r2fc[f"{name}-{side}"] = (name, side)
    return wav, r2fc


def keep_recordings_in_use(wav: dict[str, str], r2fc: dict[str, tuple[str, str]],
                           recordings: set[str]) -> tuple[dict[str, str],
                                                          dict[str, tuple[str, str]]]:
    """Drop recordings no utterance uses (Kaldi's fix_data_dir.sh)."""
    return ({r: v for r, v in wav.items() if r in recordings},
            {r: v for r, v in r2fc.items() if r in recordings})


def check_times(start: float, end: float, where: str) -> None:
    """Times of a transcript line must be finite: Python reads 'nan' and 'inf' as numbers, and
    neither makes an utterance id or a segment."""
    if not (math.isfinite(start) and math.isfinite(end)):
        raise AsrtrainError(f"{where}: times {start} {end} are not finite")


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line without newline)`` of a UTF-8 (or ASCII) corpus text file."""
    return utf8_lines(path)
