"""``asrtrain transcribe``: decode audio a user brings with a finished experiment's model.

The point is that a new file goes through exactly what the experiment's own test sets went
through, so its words are the ones the decode stage would have given it.  Nothing is
re-implemented here; the audio is laid out as a Kaldi data dir in a temporary directory and the
experiment's own code paths run on it:

- audio: every input is read with ``data.audio.read_recording`` (WAV, FLAC, SPHERE incl. shorten,
  ``cmd |`` pipes), the ``--channel`` picked, and written as a mono float WAV (exact: the samples
  keep their int16 scale), so a stereo file or a wav.scp pipe is read only once;
- features: ``features.compute_features`` with the ``features`` config the model was trained on
  (its checkpoint holds it), audio at another rate resampled to its ``sample_rate`` as the
  datadir recipe does, the dither seeded by the utterance id as in the features stage, and
  per-speaker CMVN statistics computed over the audio given (Kaldi's ``compute-cmvn-stats
  --spk2utt``; the speakers are the ``utt2spk`` beside a wav.scp, else each utterance is its own
  speaker, Kaldi's convention without speaker information);
- ctc: ``decode.ctc.decode_data_dir``, the decode stage's greedy search, with its ``batch_frames``
  from ``exp/.done/decode``;
- hybrid: ``decode.hybrid.pseudo_loglikes`` and ``decode_sweep`` through the HCLG of the pass the
  model was trained on, with the settings the decode_hybrid stage recorded in
  ``decode/<model>/<test set>/decode.json``, the LM weight and insertion penalty fixed to the
  ones it chose there (``--lmwt``/``--wip`` override them).  The sweep is not run again: there
  is no reference to choose by.

Which system an experiment has comes from its stage records (``exp/.done/train``,
``exp/.done/train_hybrid``), so paths are taken relative to the ``--exp`` given (an experiment
that was copied elsewhere still works).
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import click
import numpy as np

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, Segment, read_table, read_utt2dur, write_table
from asrtrain.recipe import Paths
from asrtrain.relocate import in_exp

log = logging.getLogger(__name__)

SYSTEMS = ("hybrid", "ctc")
_STAGE = {"ctc": "train", "hybrid": "train_hybrid"}
#: The transcript of every utterance in the temporary data dir (see ``untranscribed``).
UNTRANSCRIBED = "<untranscribed>"


# ---------------------------------------------------------------------------- the experiment
@dataclass(frozen=True)
class System:
    """A trained system of an experiment and how its decode stage decoded."""

    kind: str                  # ctc | hybrid
    name: str                  # the model's name: train/<name>, decode/<name>/<set>
    paths: Paths
    decode: dict               # ctc: {"batch_frames"}; hybrid: HybridDecodeConfig's keys

    @property
    def model(self) -> Path:
        """The model the decode stage decoded (``decode.checkpoint``: the ``model`` of its
        latest ``decode.json``), else the last epoch's, ``final.pt``."""
        summaries = sorted(self.paths.exp.glob(f"decode/{self.name}/*/decode.json"),
                           key=lambda p: p.stat().st_mtime)
        for path in reversed(summaries):
            try:
                chosen = json.loads(path.read_text()).get("model")
            except (ValueError, AttributeError):
                continue
            if chosen and in_exp(self.paths.exp, chosen).is_file():   # the exp may be moved
                return in_exp(self.paths.exp, chosen)
        return self.paths.model_dir(self.name) / "final.pt"


def _record(paths: Paths, stage: str) -> dict | None:
    from asrtrain.pipeline import read_marker

    return read_marker(paths.markers / stage)


def find_system(exp: Path, kind: str | None, lmwt: int | None = None,
                wip: float | None = None) -> System:
    """The ``kind`` system of experiment ``exp`` (None: hybrid if it has one, else ctc), or an
    error saying what is missing: the experiment, the trained model, its decode settings."""
    paths = Paths(Path(exp))
    if not paths.markers.is_dir():
        raise AsrtrainError(f"{exp}: no such experiment (no {paths.markers}); give the exp_dir "
                            "of a recipe run, e.g. --exp exp/tiny")
    if kind is None:
        kind = "hybrid" if _record(paths, "train_hybrid") else "ctc"
    record = _record(paths, _STAGE[kind])
    model = record and record.get("config", {}).get("model", {}).get("name")
    if not model:
        raise AsrtrainError(f"{exp}: the {kind} system is not trained (no "
                            f"{paths.markers / _STAGE[kind]}); run the recipe's {_STAGE[kind]} "
                            "stage first")
    system = System(kind, str(model), paths, {})
    if not system.model.is_file():
        raise AsrtrainError(f"{system.model}: missing, though {paths.markers / _STAGE[kind]} "
                            f"says the {kind} system was trained; rerun --force {_STAGE[kind]}")
    log.info("decoding with the %s system %s of %s", kind, system.name, exp)
    if kind == "ctc":
        decode = (_record(paths, "decode") or {}).get("config", {}).get("decode", {})
        return replace(system, decode={"batch_frames": int(decode.get("batch_frames", 20000))})
    check_hybrid_input(system.model)
    return replace(system, decode=_hybrid_settings(system, lmwt, wip))


def check_hybrid_input(model: Path) -> None:
    """Refuse a hybrid model whose input appends fMLLR features or i-vectors (IBM's 260-dim
    input), before any audio is read: transcribe makes the fbank features of new audio, and
    those streams need the SAT system's two-pass decode and the i-vector extractor run on it,
    which it does not do."""
    from asrtrain.features.reader import appended_streams
    from asrtrain.models.checkpoint import ModelCheckpoint

    ckpt = ModelCheckpoint.load(model, head="ce")
    append = appended_streams(ckpt.features, f"{model}: features")
    if append:
        raise AsrtrainError(f"{model}: the model's input appends {', '.join(append)} "
                            f"({ckpt.input_dim} dims), which transcribe cannot compute for new "
                            "audio; decode a data dir through the recipe (decode_hybrid), or "
                            "use a model trained on fbank alone (features@hybrid.features="
                            "fbank40_deltas) or --kind ctc")


def _hybrid_settings(system: System, lmwt: int | None, wip: float | None) -> dict:
    """The decode_hybrid stage's settings, LM weight and insertion penalty fixed to its choice
    on the first test set it decoded (or to ``lmwt``/``wip``)."""
    prepare = _record(system.paths, "prepare") or {}
    sets = prepare.get("config", {}).get("sets", {}).get("test", [])
    for name in sets:
        path = system.paths.decode_dir(system.name, name) / "decode.json"
        if path.is_file():
            break
    else:
        raise AsrtrainError(f"{system.paths.exp}: the hybrid system {system.name} is not decoded "
                            f"(no {system.paths.decode_dir(system.name, '<test set>')}/decode.json "
                            "with the settings and LM weight); run the decode_hybrid stage")
    try:
        summary = json.loads(path.read_text())
        settings = dict(summary["settings"])
        chosen = {"lmwt": int(summary["lmwt"]), "wip": float(summary["wip"])}
    except (ValueError, KeyError, TypeError) as e:
        raise AsrtrainError(f"{path}: not a decode_hybrid summary ({e!r}); rerun "
                            "--force decode_hybrid") from None
    settings.update(chosen)
    if lmwt is not None:
        settings["lmwt"] = lmwt
    if wip is not None:
        settings["wip"] = wip
    log.info("%s: %s decoder, LM weight %d, insertion penalty %.1f (from %s%s)", system.name,
             settings.get("decoder"), settings["lmwt"], settings["wip"], path,
             ", overridden" if lmwt is not None or wip is not None else "")
    return settings


# ---------------------------------------------------------------------------- the audio
@dataclass
class Inputs:
    """What to decode, as data dir tables: recording -> wav.scp value, utterances, speakers.

    ``where`` names each recording's source for messages (a file, or ``wav.scp: recording``);
    ``names``: CTM file and channel of a recording (a wav.scp's ``reco2file_and_channel``)."""

    wav: dict[str, str]
    where: dict[str, str]
    names: dict[str, tuple[str, str]]
    segments: dict[str, Segment]
    utt2spk: dict[str, str]


def parse_channel(value: str | None) -> int | None:
    """``--channel``: 0, 1, ... or A, B (Kaldi's conversation sides), as an index from 0."""
    if value is None:
        return None
    v = value.strip().upper()
    if v in ("A", "B"):
        return ord(v) - ord("A")
    if v.isdigit():
        return int(v)
    raise AsrtrainError(f"--channel {value!r}: expected 0, 1, A or B")


def read_inputs(args: Sequence[str]) -> Inputs:
    """The recordings and utterances of the command's arguments: audio files (one utterance
    each, named by the file's stem) and wav.scp files (``*.scp``; with the ``segments``,
    ``utt2spk`` and ``reco2file_and_channel`` beside them when they are there)."""
    if not args:
        raise AsrtrainError("no audio given: name audio files (WAV, FLAC, SPHERE) or wav.scp "
                            "files")
    out = Inputs({}, {}, {}, {}, {})
    for arg in args:
        part = _read_scp(Path(arg)) if arg.endswith(".scp") else _read_file(Path(arg))
        for reco in part.wav:
            if reco in out.wav:
                raise AsrtrainError(f"{part.where[reco]}: recording id {reco} is also given by "
                                    f"{out.where[reco]}; rename one")
        for utt in part.utt2spk:
            if utt in out.utt2spk:
                raise AsrtrainError(f"{arg}: utterance id {utt} is also given by another "
                                    "input; rename one")
        for table in ("wav", "where", "names", "segments", "utt2spk"):
            getattr(out, table).update(getattr(part, table))
    return out


def _read_file(path: Path) -> Inputs:
    if path.is_dir():
        scp = " or {}".format(path / "wav.scp") if (path / "wav.scp").is_file() else ""
        raise AsrtrainError(f"{path}: is a directory, not an audio file; give the audio files in "
                            f"it (e.g. {path}/*.wav){scp}")
    if not path.exists():
        raise AsrtrainError(f"{path}: audio file not found")
    reco = re.sub(r"\s+", "_", path.stem)   # a Kaldi id has no blanks
    return Inputs({reco: str(path)}, {reco: str(path)}, {}, {}, {reco: reco})


def _read_scp(scp: Path) -> Inputs:
    if scp.is_dir():
        raise AsrtrainError(f"{scp}: is a directory, not a wav.scp file")
    if not scp.is_file():
        raise AsrtrainError(f"{scp}: no such wav.scp")
    wav = read_table(scp)
    if not wav:
        raise AsrtrainError(f"{scp}: no recordings")
    where = {r: f"{scp}: recording {r}" for r in wav}
    names = {}
    if (scp.parent / "reco2file_and_channel").is_file():
        for reco, value in read_table(scp.parent / "reco2file_and_channel").items():
            fields = value.split()
            if len(fields) != 2:
                raise AsrtrainError(f"{scp.parent / 'reco2file_and_channel'}: recording {reco}: "
                                    "expected '<recording> <file> <channel>'")
            names[reco] = (fields[0], fields[1])
    segments = _read_segments(scp.parent / "segments")
    utts = list(segments) if segments else list(wav)
    utt2spk = {u: u for u in utts}
    if (scp.parent / "utt2spk").is_file():
        given = read_table(scp.parent / "utt2spk")
        missing = [u for u in utts if u not in given]
        if missing:
            raise AsrtrainError(f"{scp.parent / 'utt2spk'}: utterance {missing[0]} (of "
                                f"{'segments' if segments else 'wav.scp'}) has no speaker")
        utt2spk = {u: given[u] for u in utts}
    # Kaldi's rules (speaker prefixes, segments inside wav.scp), with the user's files named.
    DataDir(wav=wav, text=untranscribed(utts), utt2spk=utt2spk,
            segments=segments).validate(scp.parent)
    return Inputs(wav, where, names, segments, utt2spk)


def _read_segments(path: Path) -> dict[str, Segment]:
    """The ``segments`` beside a wav.scp ({} without one): utterance -> (recording, start, end)."""
    if not path.is_file():
        return {}
    out = {}
    for utt, value in read_table(path).items():
        fields = value.split()
        try:
            if len(fields) != 3:
                raise ValueError
            out[utt] = Segment(fields[0], float(fields[1]), float(fields[2]))
        except ValueError:
            raise AsrtrainError(f"{path}: utterance {utt}: expected '<utt> <recording> <start> "
                                f"<end>', got {value!r}") from None
    return out


def untranscribed(utts: Iterable[str]) -> dict[str, str]:
    """A ``text`` table for audio without transcripts: a data dir must give every utterance
    one (``DataDir.validate``); nothing here reads it, as nothing is scored."""
    return dict.fromkeys(utts, UNTRANSCRIBED)


def pick_channel(samples: np.ndarray, channel: int | None, where: str) -> np.ndarray:
    """One channel of ``samples`` [channels, samples]; a stereo file needs ``--channel``."""
    n = samples.shape[0]
    if channel is None:
        if n == 1:
            return samples[0]
        raise AsrtrainError(f"{where}: has {n} channels; pick one with --channel 0|1 (A|B)")
    if channel >= n:
        raise AsrtrainError(f"{where}: has {n} channel{'s' if n > 1 else ''}, --channel asks "
                            f"for channel {channel} (counting from 0, A = 0, B = 1)")
    return samples[channel]


def write_data_dir(inputs: Inputs, channel: int | None, tmp: Path,
                   min_seconds: float = 0.0) -> Path:
    """Read every recording once, keep ``channel``, and lay the audio out as a Kaldi data dir
    under ``tmp`` (mono float WAVs at the audio's own rate; the features resample them).
    Audio (a file, or a segment of one) shorter than ``min_seconds``, the model's analysis
    window, is an error naming it: it has no frame to decode."""
    import soundfile

    from asrtrain.data.audio import read_recording
    from asrtrain.progress import Bar

    audio = tmp / "audio"
    audio.mkdir(parents=True)
    wav, names, lengths, rates = {}, {}, {}, set()
    for i, reco in enumerate(Bar(sorted(inputs.wav), desc="reading audio", unit="file",
                                  disable=len(inputs.wav) < 5)):
        samples, rate = read_recording(inputs.wav[reco])
        mono = pick_channel(samples, channel, inputs.where[reco])
        segmented = [u for u, seg in inputs.segments.items() if seg.recording == reco]
        if not segmented and mono.shape[0] < min_seconds * rate:
            raise AsrtrainError(f"{inputs.where[reco]}: {mono.shape[0]} samples at {rate} Hz "
                                f"({mono.shape[0] / rate:.3f} s), shorter than one "
                                f"{min_seconds * 1000:g} ms frame: nothing to transcribe")
        path = audio / f"{i:06d}.wav"
        # int16 scale back to soundfile's float scale; powers of two, so read back exactly
        soundfile.write(path, mono / 32768.0, rate, subtype="FLOAT")
        wav[reco], lengths[reco] = str(path), mono.shape[0] / rate
        names[reco] = inputs.names.get(reco, (reco, _channel_name(samples.shape[0], channel)))
        rates.add(rate)
        log.debug("%s: %.2f s at %d Hz, %d channel(s)%s", inputs.where[reco], lengths[reco],
                  rate, samples.shape[0], f", channel {channel}" if channel is not None else "")
    log.info("%d recordings, %.1f s of audio at %s Hz", len(wav), sum(lengths.values()),
             ", ".join(map(str, sorted(rates))))
    segments = dict(inputs.segments)
    for utt, seg in sorted(segments.items()):
        length = min(seg.end, lengths.get(seg.recording, seg.end)) - seg.start
        if length < min_seconds:
            raise AsrtrainError(f"{inputs.where[seg.recording]}: segment {utt} ({seg.start:g}-"
                                f"{seg.end:g} s) is {max(length, 0):.3f} s, shorter than one "
                                f"{min_seconds * 1000:g} ms frame: nothing to transcribe")
    if segments:
        # A data dir has segments for all utterances or for none: a whole file is one segment.
        segmented = {s.recording for s in segments.values()}
        segments.update({r: Segment(r, 0.0, lengths[r]) for r in wav
                         if r not in segmented and r in inputs.utt2spk})
    data = DataDir(wav=wav, text=untranscribed(inputs.utt2spk), utt2spk=dict(inputs.utt2spk),
                   segments=segments, reco2file_and_channel=names)
    data.write(tmp / "data")
    if segments:
        # DataDir.write keeps 2 decimals (Kaldi's usual); the times given are kept as they are.
        write_table(tmp / "data" / "segments",
                    {u: f"{s.recording} {s.start!r} {s.end!r}" for u, s in segments.items()})
    return tmp / "data"


def _channel_name(channels: int, channel: int | None) -> str:
    """The CTM channel of a recording: 1 for mono audio, else the side picked (A, B, 3, ...)."""
    if channels == 1 or channel is None:
        return "1"
    return "AB"[channel] if channel < 2 else str(channel + 1)


def feature_options(model: Path):
    """The ``FeatureOptions`` the model at ``model`` was trained on (audio at another rate
    resampled to its rate)."""
    from asrtrain.features import FeatureOptions
    from asrtrain.models.checkpoint import ModelCheckpoint

    return FeatureOptions.from_config({**ModelCheckpoint.load(model).features,
                                       "resample": True})


def compute_feats(data_dir: Path, model: Path, tmp: Path) -> None:
    """The features stage's extraction and CMVN on ``data_dir``, with the options the model at
    ``model`` was trained on; audio at another rate is resampled to its rate."""
    import torch

    from asrtrain.features import compute_features

    opts = feature_options(model)
    threads = torch.get_num_threads()
    try:
        compute_features(data_dir, tmp / "feats", opts, nj=1)
    finally:
        torch.set_num_threads(threads)   # one extraction job sets one thread


# ---------------------------------------------------------------------------- decoding
def decode(system: System, data_dir: Path, out_dir: Path) -> None:
    """Decode ``data_dir`` as the system's decode stage does: ``out_dir/text`` and ``ctm``."""
    if system.kind == "ctc":
        from asrtrain.decode.ctc import decode_data_dir

        decode_data_dir(system.model, system.paths.lang / "units.model", data_dir, out_dir,
                        batch_frames=system.decode["batch_frames"])
    else:
        _decode_hybrid(system, data_dir, out_dir)


def _decode_hybrid(system: System, data_dir: Path, out_dir: Path) -> None:
    """decode_hybrid's network and search at the one chosen setting (no sweep, no scoring)."""
    from asrtrain.decode import HybridDecodeConfig, write_words
    from asrtrain.decode.graph import load_graph
    from asrtrain.decode.hybrid import (
        decode_sweep,
        feature_reader,
        model_for_graph,
        model_streams,
        pseudo_loglikes,
    )
    from asrtrain.models.checkpoint import ModelCheckpoint
    from asrtrain.progress import Bar

    c = HybridDecodeConfig.from_config(system.decode)
    ckpt = ModelCheckpoint.load(system.model, head="ce")
    graph_dir = _graph_dir(system, ckpt.model_config)
    graph = load_graph(graph_dir)
    graph.info["lang_dir"] = str(system.paths.lang)    # this exp's, wherever it was built
    model, device = model_for_graph(ckpt, system.model, graph, graph_dir, c)
    reader = feature_reader(data_dir, ckpt, model_streams(ckpt, system.model, None))
    utts = Bar(reader, total=len(reader.utts), desc="decoding", unit="utt",
                disable=len(reader.utts) < 5)
    loglikes = pseudo_loglikes(model, iter(utts), ckpt.log_priors, ckpt.chunk or 21,
                               c.prior_scale, c.acoustic_scale, c.batch_chunks, device)
    setting = c.settings()[0]
    hyps, stats = decode_sweep(loglikes, graph, [setting], c, ckpt.frame_shift)
    # the seconds measured from the samples (the features' utt2dur), as the lines before said
    seconds = sum(read_utt2dur(data_dir).values()) or stats["audio_seconds"]
    log.info("decoded %d utterances (%.1f s of audio), real-time factor %.3f",
             stats["utterances"], seconds, stats["real_time_factor"])
    timed = hyps[setting]
    write_words(out_dir, {u: [w.word for w in ws] for u, ws in timed.items()}, timed,
                reader.data)


def _graph_dir(system: System, model_config: dict) -> Path:
    """The HCLG the hybrid model is decoded through: its alignments' pass's ``graph/``, in this
    experiment (the checkpoint names the pass by the path it was trained from)."""
    try:
        trained_on = Path(model_config["alignments"]["train"])
    except (KeyError, TypeError):
        raise AsrtrainError(f"{system.model}: the checkpoint does not say which alignments it "
                            "was trained on (model.alignments.train)") from None
    return system.paths.align_pass(trained_on.name) / "graph"


def read_output(out_dir: Path, ctm: bool) -> str:
    """The decode dir's ``ctm``, or its ``text`` (``utt word word ...``), as printed."""
    lines = (out_dir / ("ctm" if ctm else "text")).read_text(encoding="utf-8").splitlines()
    return "".join(line.rstrip() + "\n" for line in lines)


def transcribe(exp: Path, args: Sequence[str], kind: str | None = None,
               channel: str | None = None, ctm: bool = False, lmwt: int | None = None,
               wip: float | None = None) -> str:
    """Decode the audio ``args`` with experiment ``exp``'s ``kind`` system; the text (or CTM)."""
    inputs = read_inputs(args)    # the arguments first: a typo is named before any model loads
    index = parse_channel(channel)
    system = find_system(Path(exp), kind, lmwt, wip)
    with tempfile.TemporaryDirectory(prefix="asrtrain-transcribe.") as tmp:
        frame_s = feature_options(system.model).frame_length / 1000.0
        data_dir = write_data_dir(inputs, index, Path(tmp), min_seconds=frame_s)
        compute_feats(data_dir, system.model, Path(tmp))
        decode(system, data_dir, Path(tmp) / "decode")
        return read_output(Path(tmp) / "decode", ctm)


@click.command("transcribe")
@click.argument("audio", nargs=-1, required=True)
@click.option("--exp", "exp", required=True, type=click.Path(path_type=Path),
              help="A recipe's exp_dir with a trained (and decoded) system, e.g. exp/tiny.")
@click.option("--system", "kind", type=click.Choice(SYSTEMS), default=None,
              help="Which model: hybrid (BLSTM through HCLG) or ctc. Default: hybrid if the "
              "experiment trained one, else ctc.")
@click.option("--channel", default=None, metavar="0|1|A|B",
              help="The channel of multi-channel audio (A = 0, B = 1); needed for stereo.")
@click.option("--ctm", is_flag=True, help="Print a CTM (<file> <channel> <start> <dur> <word>) "
              "instead of text (<utt-id> <words>).")
@click.option("--lmwt", type=int, default=None,
              help="hybrid: LM weight (default: the one decode_hybrid chose).")
@click.option("--wip", type=float, default=None,
              help="hybrid: word insertion penalty (default: the one decode_hybrid chose).")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the output to this file (atomically) instead of standard output.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def transcribe_command(audio: tuple[str, ...], exp: Path, kind: str | None, channel: str | None,
                       ctm: bool, lmwt: int | None, wip: float | None, out: Path | None,
                       verbose: bool) -> None:
    """Decode AUDIO with the model, features and graph of an experiment.

    AUDIO: audio files (WAV, FLAC, SPHERE; any sample rate, resampled to the experiment's; an
    utterance each, named by the file name without its extension) and Kaldi wav.scp files
    (named *.scp; paths or `cmd |` pipes, one utterance per recording, or per line of a
    `segments` file beside it; an `utt2spk` beside it gives the speakers for CMVN, else each
    utterance is normalised on its own). Prints `<utt-id> <words>` lines, or a CTM.

    Long audio: each file (or recording, without segments) is decoded whole, as one utterance,
    without segmentation: the network runs over all of it and time and memory grow with its
    length. That is fine for utterances up to a few minutes; cut longer recordings into
    utterances (e.g. with a voice activity detector) and give them as a wav.scp with a
    `segments` file beside it: the CTM is then in recording time.
    """
    import sys

    from asrtrain.fileio import write_text

    # the output goes to standard output, progress and logs to standard error
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    text = transcribe(exp, audio, kind, channel, ctm, lmwt, wip)
    if out is not None:
        write_text(out, text)
    else:
        click.echo(text, nl=False)
