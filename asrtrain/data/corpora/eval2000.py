"""Hub5 2000 English evaluation set, "eval2000" (LDC2002S09 audio + LDC2002T43 transcripts).

40 Switchboard-2 conversations (``sw_*``, the "SWB" subset) and 40 CallHome English
conversations (``en_*``, the "CH" subset), 8 kHz 2-channel SPHERE: 80 conversation sides, about
3.7 h of scored speech. Segments come from the partitioned evaluation map (``hub5e_00.pem``),
the reference words from the stm, and scoring uses the stm and the GLM of LDC2002T43.

This module follows Kaldi ``egs/swbd/s5c/local/eval2000_data_prep.sh``: utterance ids
``en_4156-A_030185-030248`` (times in 10 ms, truncated), segments padded by 0.1 s without
overlapping their neighbours (``local/extend_segments.pl 0.1``), text from the stm with
``IGNORE_TIME_SEGMENT_IN_SCORING`` utterances left out, the stm copied with Kaldi's fixes
(first ``((`` of a line -> ``(``, asides removed) as ``stm`` and the GLM as ``glm``.

Layout expected on disk::

    <audio_dir>/                       LDC2002S09 (or its hub5e_00/ directory)
        english/hub5e_00.pem
        english/en_4156.sph  english/sw_4390.sph ...
    <transcripts_dir>/                 LDC2002T43 (or its 2000_hub5_eng_eval_tr/ directory)
        reference/hub5e00.english.000405.stm
        reference/en20000405_hub5.glm
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.corpora import ldc
from asrtrain.data.datadir import DataDir, Segment

log = logging.getLogger(__name__)

AUDIO_LAYOUT = ("LDC2002S09 (Hub5 2000 English speech): <dir>/english/hub5e_00.pem and "
                "<dir>/english/en_4156.sph ... (or <dir>/hub5e_00/english/...)")
TRANSCRIPTS_LAYOUT = ("LDC2002T43 (Hub5 2000 English transcripts): "
                      "<dir>/reference/hub5e00.english.000405.stm and "
                      "<dir>/reference/en20000405_hub5.glm (or <dir>/2000_hub5_eng_eval_tr/...)")
STM_NAME = "hub5e00.english.000405.stm"
GLM_NAME = "en20000405_hub5.glm"

#: Seconds each segment is extended on both sides (extend_segments.pl 0.1).
PAD = 0.1


@dataclass
class Eval2000:
    """The eval2000 data dir and the scoring files to copy beside it."""

    data: DataDir
    stm: bytes
    glm: bytes


def _utt_id(side: str, start: str, end: str) -> str:
    # awk sprintf("%s_%06d-%06d", spk, $4*100, $5*100): %d truncates.
    return f"{side}_{int(float(start) * 100):06d}-{int(float(end) * 100):06d}"


def extend_segments(segments: list[tuple[str, str, float, float]],
                    pad: float) -> list[tuple[str, str, float, float]]:
    """Kaldi's local/extend_segments.pl: pad each segment by ``pad`` seconds on both sides.

    Neighbours on the same recording meet halfway instead of overlapping; a segment never starts
    before 0; segments that already overlap keep their times. Input order is kept.
    """
    lines = [list(s) for s in segments]
    by_reco: dict[str, list[int]] = {}
    for i, (_, reco, _, _) in enumerate(lines):
        by_reco.setdefault(reco, []).append(i)
    for numbers in by_reco.values():
        order = sorted(numbers, key=lambda i: lines[i][2])
        lines[order[0]][2] = max(lines[order[0]][2] - pad, 0.0)
        lines[order[-1]][3] = lines[order[-1]][3] + pad
        for a, b in zip(order[:-1], order[1:], strict=True):
            end, start = lines[a][3], lines[b][2]
            if end > start:
                log.warning("utterances %s and %s already overlap; times left unchanged",
                            lines[a][0], lines[b][0])
                continue
            extend = min(pad, 0.5 * (start - end))
            lines[a][3] = end + extend
            lines[b][2] = start - extend
    return [tuple(x) for x in lines]


def _read_pem(pem: Path) -> list[tuple[str, str, float, float]]:
    # hub5e_00.pem: ";;" comment lines, then "<conversation> <A|B> <speaker> <start> <end>", e.g.
    #   en_4156 A unknown_speaker 301.85 302.48
    rows = set()
    for lineno, line in ldc.read_lines(pem):
        if ";;" in line or not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 5 or fields[1] not in ("A", "B"):
                raise ValueError
            start, end = float(fields[3]), float(fields[4])
        except ValueError:
            raise AsrtrainError(f"{pem}:{lineno}: expected '<conversation> <A|B> <speaker> "
                                f"<start> <end>', got {line.strip()!r}") from None
        ldc.check_times(start, end, f"{pem}:{lineno}")
        if not 0 <= start < end:
            raise AsrtrainError(f"{pem}:{lineno}: segment {fields[3]}-{fields[4]} is empty "
                                "or negative")
        side = f"{fields[0]}-{fields[1]}"
        # Kaldi: "<utt> <side> <start> <end>" | sort -u (the times as written in the pem).
        rows.add(f"{_utt_id(side, fields[3], fields[4])} {side} {fields[3]} {fields[4]}")
    if not rows:
        raise AsrtrainError(f"{pem}: no segments")
    segments = [(u, s, float(a), float(b)) for u, s, a, b in (r.split() for r in sorted(rows))]
    return extend_segments(segments, PAD)


def _read_stm(stm: Path) -> list[tuple[str, str, Path, int]]:
    # hub5e00.english.000405.stm: ";;" label lines, then
    #   <conversation> <A|B> <speaker> <start> <end> <labels> <words...>, e.g.
    #   en_4156 A en_4156_A 357.64 359.64 <O,en,F,en-F>  HE IS A POLICE OFFICER
    out = []
    for lineno, line in ldc.read_lines(stm):
        if ";;" in line or not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) < 6 or fields[1] not in ("A", "B"):
                raise ValueError
            start, end = float(fields[3]), float(fields[4])
        except ValueError:
            raise AsrtrainError(f"{stm}:{lineno}: expected '<conversation> <A|B> <speaker> "
                                f"<start> <end> <labels> <words...>', "
                                f"got {line.strip()!r}") from None
        ldc.check_times(start, end, f"{stm}:{lineno}")
        if end < start:
            raise AsrtrainError(f"{stm}:{lineno}: segment ends at {fields[4]}, before it starts "
                                f"at {fields[3]}")
        utt = _utt_id(f"{fields[0]}-{fields[1]}", fields[3], fields[4])
        out.append((utt, " ".join(fields[6:]), stm, lineno))
    if not out:
        raise AsrtrainError(f"{stm}: no segments")
    return sorted(out)


def _fix_stm(text: bytes) -> bytes:
    """Kaldi's sed fixes for hubscr.pl: the first '((' of a line -> '(', asides removed."""
    lines = []
    for line in text.splitlines(keepends=True):
        line = line.replace(b"((", b"(", 1).replace(b"<B_ASIDE>", b"").replace(b"<E_ASIDE>", b"")
        lines.append(line)
    return b"".join(lines)


def prepare_eval2000(audio_dir: Path, transcripts_dir: Path,
                     expected_sides: int | None = 80) -> Eval2000:
    """Prepare Hub5'00 as Kaldi s5c's eval2000_data_prep.sh does.

    ``expected_sides``: conversation sides the data dir must hold (80 for LDC2002S09; ``None``
    skips the check).
    """
    audio_dir = ldc.require_dir(Path(audio_dir), "Hub5'00 audio", AUDIO_LAYOUT)
    transcripts_dir = ldc.require_dir(Path(transcripts_dir), "Hub5'00 transcripts",
                                      TRANSCRIPTS_LAYOUT)
    sdir = audio_dir / "hub5e_00" if (audio_dir / "hub5e_00" / "english").is_dir() else audio_dir
    if not (sdir / "english").is_dir():
        hint = (" (this looks like the transcripts, LDC2002T43, given for the audio)"
                if (sdir / "reference").is_dir() or (sdir / "2000_hub5_eng_eval_tr").is_dir()
                else "")
        raise AsrtrainError(f"{sdir}/english: not found{hint}; expected {AUDIO_LAYOUT}")
    tdir = transcripts_dir
    if (tdir / "2000_hub5_eng_eval_tr").is_dir():
        tdir = tdir / "2000_hub5_eng_eval_tr"
    if not (tdir / "reference").is_dir():
        hint = (" (this looks like the audio, LDC2002S09, given for the transcripts)"
                if (tdir / "english").is_dir() or (tdir / "hub5e_00").is_dir() else "")
        raise AsrtrainError(f"{tdir}/reference: not found{hint}; expected {TRANSCRIPTS_LAYOUT}")
    pem = sdir / "english" / "hub5e_00.pem"
    stm = tdir / "reference" / STM_NAME
    glm = tdir / "reference" / GLM_NAME
    for path in (pem, stm, glm):
        if not path.is_file():
            layout = AUDIO_LAYOUT if path == pem else TRANSCRIPTS_LAYOUT
            raise AsrtrainError(f"{path}: not found; expected {layout}")
    sph = ldc.find_sphere(sdir / "english", "Hub5'00 audio", AUDIO_LAYOUT)

    segments = _read_pem(pem)
    text_all = _read_stm(stm)
    # Kaldi: cmp of the utterance ids from the stm and from the pem.
    seg_ids = [s[0] for s in segments]
    stm_ids = [t[0] for t in text_all]
    if sorted(seg_ids) != stm_ids:
        extra = sorted(set(stm_ids) - set(seg_ids))
        if extra:
            _, _, path, lineno = next(t for t in text_all if t[0] == extra[0])
            raise AsrtrainError(f"{path}:{lineno}: utterance {extra[0]} has no segment in {pem} "
                                "(segments from the pem and the stm do not match)")
        lacking = sorted(set(seg_ids) - set(stm_ids))
        if lacking:
            raise AsrtrainError(f"{pem}: segment {lacking[0]} has no line in {stm} "
                                "(segments from the pem and the stm do not match)")
        repeated = next(u for u in stm_ids if stm_ids.count(u) > 1)
        raise AsrtrainError(f"{stm}: utterance {repeated} appears more than once")

    data = DataDir()
    for utt, words, _, _ in text_all:
        if "IGNORE_TIME_SEGMENT_" in words:
            continue
        if not words:
            log.warning("%s: utterance %s has no words; left out", stm, utt)
            continue
        data.text[utt] = words
    wav, r2fc = ldc.side_tables(sph)
    for utt, side, start, end in segments:
        if utt not in data.text:
            continue   # fix_data_dir.sh: utterances without text go
        if side not in wav:
            conv = side[:-2]
            raise AsrtrainError(f"{pem}: conversation {conv} has segments but no audio "
                                f"{conv}.sph under {sdir / 'english'}")
        data.segments[utt] = Segment(side, start, end)
        data.utt2spk[utt] = side
    data.wav, data.reco2file_and_channel = ldc.keep_recordings_in_use(
        wav, r2fc, {s.recording for s in data.segments.values()})
    data.validate("eval2000")
    if expected_sides is not None and len(data.wav) != expected_sides:
        raise AsrtrainError(f"{sdir / 'english'}: {len(data.wav)} conversation sides with "
                            f"scored segments, expected {expected_sides}")
    return Eval2000(data=data, stm=_fix_stm(stm.read_bytes()), glm=glm.read_bytes())
