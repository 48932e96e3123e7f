"""A moved (or copied) exp dir keeps working: the records that name its old place are rewritten.

The stages write absolute paths into their tables and records: ``feats.scp`` and ``cmvn.scp``
point at arks under ``exp/feats``, ``ali.scp`` and ``trans.scp`` at the align passes' arks, a
graph's ``info.json`` at its lang dir, a model's ``config.yaml`` at its train dir. Absolute, so
that an scp can be read from any directory (Kaldi's do the same); but after ``mv exp/base
exp/moved`` they all point at a place that is gone (or, after a copy, at the other experiment).

``asrtrain run`` therefore keeps the exp dir's absolute path in ``exp/.done/location``. When a
run finds the exp dir somewhere else, every text file under it that holds the old path (as a
whole path component: ``/a/exp`` is not a prefix of ``/a/exp2``) has it replaced by the new one,
each file rewritten atomically, before any stage looks at them; one log line says so. The
stages' digests hold no exp path, so nothing is recomputed. Binary files (arks, checkpoints,
FSTs: a NUL byte in their first block) are left alone: nothing reads a path out of them; so are
the logs (``log/``: what ran where, then) and the hybrid trainer's chunk stores.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.fileio import atomic_open

log = logging.getLogger("asrtrain")

#: Where the exp dir's absolute path is kept (beside the stage records).
LOCATION = Path(".done") / "location"
#: Files with these suffixes are binary (or never hold a path): not opened.
BINARY_SUFFIXES = {".ark", ".pt", ".mdl", ".fst", ".npy", ".npz", ".bin", ".model", ".gz",
                   ".png", ".pdf", ".wav", ".flac", ".sph", ".alimdl", ".ubm", ".ie", ".arrays",
                   ".f16", ".i32", ".i64"}
#: Directories of the exp dir left alone: the logs say where things were when they ran, and
#: the chunk stores are flat binary arrays (keyed by the scps: a moved exp makes new ones).
SKIPPED_DIRS = {"log", "chunkstore"}
#: Text files larger than this are not read whole (none of ours holds a path and is larger).
MAX_TEXT_BYTES = 1 << 30
_SNIFF = 8192


def recorded_location(exp: str | Path) -> Path | None:
    """The absolute path the exp dir had at its last run, or None (never run, or before this
    was recorded)."""
    try:
        text = (Path(exp) / LOCATION).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return Path(text) if text.startswith("/") else None


def inferred_location(exp: str | Path) -> Path | None:
    """Where an exp dir without a location record was when its features were made: the
    directory above ``feats/`` in the first line of a data set's ``feats.scp`` (exp dirs made
    before the record was kept)."""
    for scp in sorted(Path(exp).glob("data/*/feats.scp")):
        try:
            with open(scp, encoding="utf-8") as f:
                first = f.readline().split(maxsplit=1)
        except (OSError, UnicodeDecodeError):
            continue
        if len(first) == 2 and first[1].startswith("/") and "/feats/" in first[1]:
            old, name = first[1].rsplit("/feats/", 1)
            ark = name.rsplit(":", 1)[0]
            # ours only (a Kaldi import's arks are elsewhere): the same ark is here too
            if "/" not in ark and (Path(exp) / "feats" / ark).is_file():
                return Path(old)
    return None


def in_exp(exp: str | Path, path: str | Path) -> Path:
    """``path`` as a record of the exp dir ``exp`` names it, made to point into ``exp`` where it
    is now when it names the place the exp dir was last run at (moved since, no run yet)."""
    path, exp = Path(path), Path(exp).resolve()
    old = recorded_location(exp) or inferred_location(exp)
    if old is not None and old != exp and path.is_relative_to(old):
        return exp / path.relative_to(old)
    return path


def record_location(exp: str | Path) -> None:
    """Remember where the exp dir is now (when it is not recorded already). Best effort: on a
    file system that takes no writes it is left unrecorded, which the next run sees as a move
    only if the exp dir is moved."""
    exp = Path(exp).resolve()
    if recorded_location(exp) == exp:
        return
    try:
        with atomic_open(exp / LOCATION, "w", encoding="utf-8") as f:
            f.write(f"{exp}\n")
    except OSError as e:
        log.debug("%s: cannot record the exp dir's place: %s", exp / LOCATION, e)


def _pattern(old: Path) -> re.Pattern[bytes]:
    # the old path as a whole: followed by a separator, white space, a quote or the end
    return re.compile(re.escape(os.fsencode(str(old))) + rb"(?=[/\s\"',:|\]}]|$)", re.M)


def files_naming(exp: Path, old: Path) -> list[Path]:
    """The text files under ``exp`` that hold ``old`` as a path."""
    pattern = _pattern(old)
    found = []
    for root, dirs, files in os.walk(exp):
        if Path(root) == exp:
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            if path.suffix in BINARY_SUFFIXES or path.is_symlink() or name.endswith(".tmp"):
                continue
            try:
                if path.stat().st_size > MAX_TEXT_BYTES:
                    continue
                with open(path, "rb") as f:
                    head = f.read(_SNIFF)
                    if b"\0" in head:
                        continue
                    data = head + f.read()
            except OSError:
                continue
            if pattern.search(data):
                found.append(path)
    return found


def relocate(exp: str | Path, dry_run: bool = False) -> list[Path]:
    """Make the records of an exp dir that was moved or copied point at where it is now (see
    the module's doc); return the files rewritten (with ``dry_run``: that would be, and nothing
    is written). An exp dir seen for the first time only has its place recorded."""
    exp = Path(exp)
    if not (exp / ".done").is_dir():
        return []      # nothing run here yet
    new = exp.resolve()
    old = recorded_location(exp) or inferred_location(exp)
    if old is None or old == new:
        if old is None and not dry_run:
            record_location(exp)
        return []
    files = files_naming(new, old)
    if dry_run:
        log.info("the exp dir was at %s; %d files under %s name that place and will be made to "
                 "name this one when it runs", old, len(files), new)
        return files
    pattern, replacement = _pattern(old), os.fsencode(str(new))
    try:
        for path in files:
            data = path.read_bytes()
            st = path.stat()
            with atomic_open(path, "wb") as f:
                f.write(pattern.sub(lambda _: replacement, data))
            os.chmod(path, st.st_mode & 0o7777)
            # the same records, at their new place: their times stay (what is newest, a
            # make-style "newer than", must not change with a move)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError as e:
        from asrtrain.fileio import describe_os_error

        raise AsrtrainError(f"the exp dir was moved from {old} to {new}, and its records that "
                            f"name the old place cannot be rewritten: "
                            f"{describe_os_error(e, new)}") from None
    record_location(exp)
    log.info("the exp dir was moved from %s to %s: %d files that named the old place now name "
             "this one (%s)", old, new, len(files),
             ", ".join(str(p.relative_to(new)) for p in files[:5])
             + (f" and {len(files) - 5} more" if len(files) > 5 else ""))
    return files
