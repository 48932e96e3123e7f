"""Greedy CTC decoding: best unit per frame, repeats merged, blanks removed, words timed.

Word times come from the frames on which the word's units were emitted (CTC spikes), widened to
the frame rate of the model's output; they are good enough for time-mediated scoring of the
segment a word belongs to, not for forced alignment.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from asrtrain.data.datadir import read_utt2dur, write_table
from asrtrain.features.reader import FeatureReader, length_batches
from asrtrain.fileio import atomic_open
from asrtrain.lang.bpe import Units
from asrtrain.models.checkpoint import load_model
from asrtrain.models.ctc import greedy_units
from asrtrain.progress import Bar

__all__ = ["TimedWord", "decode_data_dir", "greedy_units", "units_to_words", "write_ctm"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimedWord:
    word: str
    start: float      # seconds from the start of the utterance
    duration: float


def units_to_words(seq: list[tuple[int, int]], units: Units,
                   frame_seconds: float) -> list[TimedWord]:
    """Group emitted units into words (a unit starting with '▁' opens a word) and time them."""
    words: list[tuple[list[int], int, int]] = []
    for u, t in seq:
        if units.starts_word(u) or not words:
            words.append(([u], t, t))
        else:
            ids, t0, _ = words[-1]
            ids.append(u)
            words[-1] = (ids, t0, t)
    out = []
    for ids, t0, t1 in words:
        text = units.decode(ids).strip()
        for w in text.split():
            out.append(TimedWord(w, t0 * frame_seconds, (t1 - t0 + 1) * frame_seconds))
    return out


def write_ctm(path, words_by_utt: dict[str, list[TimedWord]], data) -> int:
    """Write a CTM in recording time: ``<file> <channel> <start> <dur> <word>`` per word.

    Utterance times are shifted by the segment start and the recording is mapped to sclite's
    file and channel through reco2file_and_channel (as Kaldi's convert_ctm.pl does).
    """
    lines = []
    for utt, words in words_by_utt.items():
        if data.segments:
            seg = data.segments[utt]
            reco, offset = seg.recording, seg.start
        else:
            reco, offset = utt, 0.0
        file, channel = data.reco2file_and_channel.get(reco, (reco, "1"))
        for w in words:
            lines.append((file, channel, round(offset + w.start, 2), round(w.duration, 2), w.word))
    lines.sort()
    with atomic_open(path, "w", encoding="utf-8") as f:
        for file, channel, start, dur, word in lines:
            f.write(f"{file} {channel} {start:.2f} {dur:.2f} {word}\n")
    return len(lines)


@torch.no_grad()
def decode_data_dir(model_path, units_path, data_dir, out_dir, batch_frames: int = 20000,
                    threads: int = 0, checkpoint: dict | None = None) -> dict:
    """Greedy-decode every utterance of ``data_dir``; write ``text`` hyps, ``ctm`` and
    ``decode.json`` (the figures returned, the model's path, and ``checkpoint``: which of the
    training run's models it is, :func:`asrtrain.models.average.choose_model`'s description)."""
    if threads:
        torch.set_num_threads(threads)
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    model, ckpt = load_model(model_path, head="ctc")
    units = Units(units_path)
    reader = FeatureReader(data_dir, ckpt.delta_order, ckpt.norm_vars, need_num_frames=True,
                           input_dim=ckpt.input_dim)
    frame_seconds = ckpt.frame_shift * model.stack_frames
    hyps: dict[str, list[TimedWord]] = {}
    t0 = time.time()
    frames = 0
    utts = reader.utts
    bar = Bar(total=len(utts), desc=f"decode {data_dir.name}", unit="utt", file=sys.stderr,
               disable=None, leave=False)
    for idx in length_batches([reader.num_frames[u] for u in utts], batch_frames):
        batch = [utts[i] for i in idx]
        feats, lengths = reader.batch(batch)
        logits, out_lengths = model(feats, lengths)
        frames += int(lengths.sum())
        for utt, seq in zip(batch, greedy_units(logits, out_lengths, units.blank), strict=True):
            hyps[utt] = units_to_words(seq, units, frame_seconds)
        bar.update(len(batch))
    bar.close()
    elapsed = time.time() - t0
    data = reader.data
    out_dir.mkdir(parents=True, exist_ok=True)
    write_table(out_dir / "text", {u: " ".join(w.word for w in ws) for u, ws in hyps.items()})
    n = write_ctm(out_dir / "ctm", hyps, data)
    # the seconds measured from the samples (the features stage's utt2dur), else the frames'
    durations = read_utt2dur(data_dir)
    audio_seconds = (sum(durations[u] for u in hyps) if hyps.keys() <= durations.keys()
                     else frames * ckpt.frame_shift)
    rtf = elapsed / max(audio_seconds, 1e-9)
    log.info("%s: decoded %d utterances (%.1f s of audio) in %.1f s, real-time factor %.3f; "
             "%d words in %s", data_dir, len(hyps), audio_seconds, elapsed, rtf, n,
             out_dir / "ctm")
    summary = {"utterances": len(hyps), "seconds": elapsed, "rtf": rtf, "words": n,
               "model": str(model_path)}
    if checkpoint is not None:
        summary["checkpoint"] = dict(checkpoint)
    with atomic_open(out_dir / "decode.json", "w", encoding="utf-8") as f:
        f.write(json.dumps(summary, indent=1) + "\n")
    return summary
