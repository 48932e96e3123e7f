"""Crash-safe writing: temporary names, what a failure leaves, the mode of what is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asrtrain.fileio import atomic_ark, atomic_dir, atomic_open, remove_temporaries, write_text


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    write_text(path, "old\n")
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_two_writers_of_one_name_get_their_own_temporaries(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    with atomic_open(path) as a, atomic_open(path) as b:
        a.write("a")
        b.write("b")
        assert len(list(tmp_path.glob(".out.txt.*.tmp"))) == 2
    assert path.read_text() == "a"  # the last to finish wins, whole; neither is mixed


def test_written_files_and_dirs_get_the_umask_mode(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        write_text(tmp_path / "f", "x")
        with atomic_dir(tmp_path / "d") as d:
            (d / "inside").write_text("y")
    finally:
        os.umask(mask)
    # as open() and mkdir() make them (mkstemp alone would give 0600/0700)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


def test_remove_temporaries_finds_files_and_dirs_at_any_depth(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / ".x.ark.k3j.tmp").write_text("half")
    (tmp_path / ".d.tmp").mkdir()
    (tmp_path / ".d.tmp" / "y.tmp").write_text("half")
    (tmp_path / "keep.txt").write_text("whole")
    assert remove_temporaries(tmp_path) == 3
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "a", "a/b", "keep.txt"]


def test_an_ark_and_its_scp_appear_together_and_name_the_final_ark(tmp_path: Path) -> None:
    import kaldiio
    import numpy as np

    ark, scp = tmp_path / "feats.ark", tmp_path / "feats.scp"
    with atomic_ark(ark, scp) as w:
        w("utt1", np.ones((3, 2), dtype=np.float32))
        assert not ark.exists() and not scp.exists()
    assert str(ark) in scp.read_text() and ".tmp" not in scp.read_text()
    assert kaldiio.load_scp(str(scp))["utt1"].shape == (3, 2)
    with pytest.raises(RuntimeError), atomic_ark(ark, scp) as w:
        w("utt2", np.zeros((1, 2), dtype=np.float32))
        raise RuntimeError("killed")
    assert list(kaldiio.load_scp(str(scp))) == ["utt1"]  # the earlier pair, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["feats.ark", "feats.scp"]


def test_the_ark_writer_writes_kaldiios_bytes(tmp_path: Path) -> None:
    """ArkWriter (atomic_ark's writer) against kaldiio's WriteHelper on the same entries: int32
    vectors (alignments: written in one piece, not packed element by element), an empty one,
    float matrices and vectors (kaldiio's own write_array); both files byte for byte, and
    kaldiio reads the alignments back."""
    import kaldiio
    import numpy as np

    from asrtrain.fileio import ArkWriter

    rng = np.random.default_rng(0)
    entries = [("ali1", rng.integers(-5, 2**31 - 1, 700).astype(np.int32)),
               ("empty", np.zeros(0, dtype=np.int32)),
               ("feats", rng.standard_normal((7, 3)).astype(np.float32)),
               ("ivec", rng.standard_normal(5)), ("ali2", np.arange(3, dtype=np.int32))]
    theirs, ours = tmp_path / "kaldiio", tmp_path / "ours"
    for d in (theirs, ours):
        d.mkdir()
    with kaldiio.WriteHelper(f"ark,scp:{theirs / 'a.ark'},{theirs / 'a.scp'}") as w:
        for key, array in entries:
            w(key, array)
    with ArkWriter(ours / "a.ark", ours / "a.scp") as w:
        for key, array in entries:
            w(key, array)
    assert (ours / "a.ark").read_bytes() == (theirs / "a.ark").read_bytes()
    assert (ours / "a.scp").read_text().replace(str(ours), str(theirs)) == \
        (theirs / "a.scp").read_text()
    back = kaldiio.load_scp(str(ours / "a.scp"))
    for key, array in entries:
        np.testing.assert_array_equal(back[key], array)


def test_an_ark_writer_whose_scp_cannot_open_leaves_no_open_file(tmp_path: Path) -> None:
    """The scp's folder missing: the error names it, and the ark opened first is closed (the
    caller got no writer to close it with; a caller that keeps the error, as a log of it does,
    keeps the half-made writer's frame, and its file would stay open until that goes)."""
    from asrtrain.fileio import ArkWriter

    def open_fds() -> set[str]:
        return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")}

    ark, scp = tmp_path / "a.ark", tmp_path / "missing" / "a.scp"
    with pytest.raises(FileNotFoundError, match="missing") as kept:
        ArkWriter(ark, scp)
    assert kept.tb is not None and str(ark) not in open_fds()
    with ArkWriter(ark, tmp_path / "a.scp"):      # and a writer that opens closes both
        assert str(ark) in open_fds()
    assert str(ark) not in open_fds() and str(tmp_path / "a.scp") not in open_fds()
