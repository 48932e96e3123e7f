"""What the LDC telephone corpora share: two-channel SPHERE conversations, one side per channel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.audio import sphere_side_command


def require_dir(path: Path, what: str, layout: str) -> Path:
    """``path`` as an existing directory, or an error saying which corpus layout was expected."""
    path = Path(path)
    if not path.is_dir():
        raise AsrtrainError(f"{path}: {what} directory not found; expected {layout}")
    return path


def find_sphere(root: Path, what: str, layout: str, allow_none: bool = False) -> dict[str, Path]:
    """Every ``*.sph`` under ``root`` (any case, any depth, as Kaldi's ``find -iname``), by name.

    The key is the file name without ``.sph`` (``sw02001``, ``en_4156``, ``fe_03_00001``).
    Finding none is an error unless ``allow_none``.
    """
    found: dict[str, Path] = {}
    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() == ".sph" and p.is_file()):
        name = path.name[: -len(".sph")]
        if name in found:
            raise AsrtrainError(f"{path}: conversation {name} is also at {found[name]}; "
                                f"keep one copy under {root}")
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


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line without newline)`` of a UTF-8 (or ASCII) corpus text file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise AsrtrainError(f"{path}:{lineno}: not UTF-8 text") from None
            yield lineno, line.rstrip("\r\n")
