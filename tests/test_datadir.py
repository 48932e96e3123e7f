from pathlib import Path

import pytest

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, Segment
from asrtrain.fileio import atomic_dir, atomic_open


def test_read_write_roundtrip(datadir: Path, tmp_path: Path) -> None:
    d = DataDir.read(datadir)
    assert len(d.utts) == 6 and list(d.spk2utt) == ["spk0", "spk1"]
    d.write(tmp_path / "copy")
    again = DataDir.read(tmp_path / "copy")
    assert again.text == d.text and again.wav == d.wav and again.utt2spk == d.utt2spk
    assert (tmp_path / "copy" / "spk2utt").read_text() == (datadir / "spk2utt").read_text()


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "text").write_text((d / "text").read_text() + "spk9-ghost hi\n"),
     "text:7: utterance spk9-ghost is not in utt2spk"),
    (lambda d: (d / "text").write_text("spk0-utt0\n" + "".join(
        (d / "text").read_text().splitlines(True)[1:])), "empty transcript"),
    (lambda d: (d / "wav.scp").write_text("".join(
        (d / "wav.scp").read_text().splitlines(True)[1:])),
     "utt2spk:1: utterance spk0-utt0 has no audio"),
    (lambda d: (d / "utt2spk").unlink(), "utt2spk: missing"),
    (lambda d: (d / "segments").write_text("spk0-utt0 spk0-utt0 0.5\n"), "segments:1"),
    (lambda d: (d / "utt2spk").write_text((d / "utt2spk").read_text() + "spk0-utt0 spk0\n"),
     "utt2spk:7: duplicate key spk0-utt0 \\(first on line 1\\)"),
    (lambda d: (d / "spk2utt").write_text("spk0 spk0-utt1 spk0-utt0 spk0-utt2\n"
                                          "spk1 spk1-utt0 spk1-utt1 spk1-utt2\n"),
     "spk2utt:1: the utterances of speaker spk0 are repeated or not in sorted order"),
    (lambda d: (d / "spk2utt").write_text((d / "spk2utt").read_text() + "spk2 spk2-utt0\n"),
     "spk2utt:3: utterance spk2-utt0 of speaker spk2 is not in utt2spk"),
])
def test_validation_names_file_and_line(datadir: Path, breakage, message: str) -> None:
    breakage(datadir)
    with pytest.raises(AsrtrainError, match=message):
        DataDir.read(datadir)


def test_subset_keeps_recordings_of_segments() -> None:
    d = DataDir(wav={"r1": "a.wav", "r2": "b.wav"}, text={"s-1": "a", "s-2": "b"},
                utt2spk={"s-1": "s", "s-2": "s"},
                segments={"s-1": Segment("r1", 0, 1), "s-2": Segment("r2", 0, 1)})
    sub = d.subset(["s-2"])
    assert sub.wav == {"r2": "b.wav"} and sub.utts == ["s-2"]
    sub.validate()


def test_atomic_open_keeps_old_file_on_error(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_open(target) as f:
        f.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_dir_replaces_only_when_complete(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()
    (target / "x").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "x").write_text("new")
        raise RuntimeError
    assert (target / "x").read_text() == "old"
    with atomic_dir(target) as tmp:
        (tmp / "y").write_text("new")
    assert [p.name for p in target.iterdir()] == ["y"]


def test_subset_keeps_where_its_lines_are(datadir: Path) -> None:
    d = DataDir.read(datadir)
    sub = d.subset(["spk1-utt1"])
    assert sub.at("wav.scp", "spk1-utt1") == f"{datadir}/wav.scp:5"
    assert sub.lines["text"] == {"spk1-utt1": 5} and sub.source == datadir
    assert DataDir().at("segments", "u") == "segments"
