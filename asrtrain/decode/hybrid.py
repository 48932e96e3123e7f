"""Hybrid decoding: a frame cross-entropy BLSTM's pdf posteriors through HCLG, Kaldi style.

Pseudo log-likelihoods (Kaldi's nnet decoding): ``acoustic_scale * (log p(pdf | x) - prior_scale *
log p(pdf))``, the posteriors from the BLSTM run over each utterance cut into the ``chunk``-frame
chunks it was trained on (``reader.chunk_starts``; the overlapping last chunk contributes only
the frames the chunk before it did not cover), the priors from the training alignments (stored in
the checkpoint).  They are decoded through ``make_graph``'s HCLG with kaldi-decoder's
``LatticeSimpleDecoder``, which gives a state-level lattice per utterance (graph and acoustic
costs kept apart) — so the network and the search run once, and the scoring sweep of Kaldi's
``local/score_sclite.sh`` (``lattice-scale --inv-acoustic-scale=LMWT | lattice-add-penalty
--word-ins-penalty=WIP | lattice-best-path``) is done on the lattices: for every LM weight
``lmwt`` and word insertion penalty ``wip`` the best path minimises
``graph_cost + wip * words + acoustic_cost / lmwt`` (acoustic cost unscaled, i.e. divided back
by ``acoustic_scale``).  The lattice decoder of kaldi-decoder prunes with ``beam`` only: it has
no ``max_active``.  ``decoder: faster`` instead runs kaldi-decoder's ``FasterDecoder`` (which
caps the active states at ``max_active`` but gives no lattice) once per LM weight, with the
acoustic scale ``1/lmwt`` and no insertion penalty.

Words are timed from the best path's transition states: word-position phones (``_B _I _E _S``)
give the word boundaries, as Kaldi's ``lattice-align-words`` does with ``word_boundary.int``.
Each setting's CTM is scored (Hub5 rules with the data dir's ``stm``, plain WER on ``text``
otherwise) and, as Kaldi does, the setting with the lowest WER on the scored set itself is kept,
unless ``lmwt``/``wip`` fix it.  Outputs, the one decode-dir layout (asrtrain/decode/__init__.py):
``out_dir/ctm``, ``out_dir/text``, ``out_dir/score/`` (``score_decode``'s reports of the chosen
setting), ``out_dir/decode.json`` (every setting's WER, RTF, settings).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import kaldi_decoder
import kaldifst
import numpy as np
import torch
from kaldifst.lib._kaldifst import _ArcIteratorLattice

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, read_utt2dur
from asrtrain.decode import (
    AUDIO_PER_JOB_S,
    HybridDecodeConfig,
    job_shares,
    score_candidates,
    write_decode_dir,
)
from asrtrain.decode.ctc import TimedWord
from asrtrain.decode.graph import Graph, faster_decoder, load_graph
from asrtrain.features.reader import FeatureReader, appended_streams, chunk_starts
from asrtrain.jobs import JobConfig, as_job_config, run_jobs
from asrtrain.lang.phones import PhoneSet
from asrtrain.logs import plural
from asrtrain.models.checkpoint import ModelCheckpoint
from asrtrain.progress import Bar

log = logging.getLogger(__name__)



def model_for_graph(ckpt: ModelCheckpoint, model_path: Path, graph, graph_dir: Path,
                    c: HybridDecodeConfig) -> tuple[torch.nn.Module, torch.device]:
    """The hybrid model of ``ckpt``, built on ``c.device`` with ``c.threads``, once its outputs
    are checked against the graph's pdfs (before the model is built, so that a model of another
    tree is named as such)."""
    if ckpt.output_dim != int(graph.info["num_pdfs"]):
        raise AsrtrainError(f"{model_path}: the model has {ckpt.output_dim} outputs but "
                            f"{graph_dir / 'HCLG.fst'} was built for {graph.info['num_pdfs']} "
                            "pdfs; train on this graph's alignments or rebuild the graph")
    if c.threads > 0:
        torch.set_num_threads(c.threads)
    device = torch.device(c.device)
    return ckpt.build(device, model_path), device


def decode_hybrid(model_path: Path, graph_dir: Path, data_dir: Path, out_dir: Path,
                  cfg: Mapping | HybridDecodeConfig | None = None, nj: int | JobConfig = 1,
                  audio_per_job: float = AUDIO_PER_JOB_S,
                  streams: Mapping[str, Path] | None = None,
                  checkpoint: Mapping | None = None) -> dict:
    """Decode ``data_dir`` with the hybrid checkpoint ``model_path`` and ``graph_dir``'s HCLG.

    ``cfg``: ``HybridDecodeConfig``'s keys, with their defaults (asrtrain/decode/__init__.py):
    ``decoder`` (lattice | faster), ``acoustic_scale``, ``prior_scale``, ``beam``,
    ``lattice_beam`` (lattice decoder), ``max_active`` (faster decoder), ``min_lmwt``..``max_lmwt``
    and ``wips`` for the sweep, ``lmwt``/``wip`` to fix the setting instead of choosing it on
    this set, ``batch_chunks`` (chunks per forward pass), ``threads`` (torch CPU threads, 0:
    leave as is: the job runner's ``threads`` in each job when ``nj`` > 1), ``device``.
    ``nj``: parallel jobs, each a process decoding a contiguous share of the utterances (the
    results are those of one job; the number of jobs only says how the work is spread, so it
    is no decoding setting), and no more jobs than one per ``audio_per_job`` seconds of audio
    (a job takes seconds to start); a stage's ``JobConfig`` also says where they run (``cmd``)
    and their ``threads``.
    ``streams``: {stream: directory} of the per-frame streams the model's input appends
    (its checkpoint's ``features.append``; ``features.reader.stream_dirs`` of the set).
    ``checkpoint``: which of the run's models ``model_path`` is
    (:func:`asrtrain.models.average.choose_model`'s description), kept in ``decode.json``.
    Returns the summary written to ``decode.json``: the chosen ``lmwt``/``wip``, ``wer`` per
    subset, every setting's WER under ``sweep``, and the real-time factors (network, search,
    both, per core: CPU seconds per second of audio; and of the wall time; feature reading and
    the sweep's rescoring not included); plus ``counts``, the chosen setting's ``Counts`` per
    subset ({} with nothing to score)."""
    c = HybridDecodeConfig.from_config(cfg)
    model_path, graph_dir, data_dir, out_dir = map(Path, (model_path, graph_dir, data_dir, out_dir))
    graph = load_graph(graph_dir)
    ckpt = ModelCheckpoint.load(model_path, head="ce")
    model, device = model_for_graph(ckpt, model_path, graph, graph_dir, c)
    streams = model_streams(ckpt, model_path, streams)
    reader = feature_reader(data_dir, ckpt, streams)
    audio = sum(reader.num_frames.values()) * ckpt.frame_shift if reader.data.utt2num_frames \
        else float("inf")
    jobs = as_job_config(nj)
    shares = job_shares(reader.utts, jobs.nj, audio, audio_per_job)
    t0 = time.time()
    if len(shares) == 1 and jobs.cmd == "local":
        hyps, stats = _decode_share((model_path, graph, graph_dir, data_dir, c, shares[0],
                                     (ckpt, model, device), streams))
    else:
        results = run_jobs(_decode_share,
                           [(model_path, graph_dir, graph_dir, data_dir, c, share, None, streams)
                            for share in shares],
                           jobs, f"decode {data_dir.name} ({plural(len(shares), 'job')})")
        hyps = {s: {u: w for h, _ in results for u, w in h[s].items()} for s in results[0][0]}
        stats = merge_stats([st for _, st in results])
    stats["wall_seconds"] = round(time.time() - t0, 2)
    stats["wall_real_time_factor"] = round(stats["wall_seconds"] / stats["audio_seconds"], 4)
    stats["model"] = str(model_path)
    if checkpoint is not None:
        stats["checkpoint"] = dict(checkpoint)
    return score_sweep(hyps, c.settings(), c, DataDir.read(data_dir), data_dir, out_dir, stats)


def _decode_share(args: tuple) -> tuple[dict, dict]:
    """One job: the network and the search over a share of the utterances (in this process with
    the model ``loaded``, or in a job that loads the model and the graph itself, with the job
    runner's threads); (timed words per setting, stats) with the CPU seconds of its decoding."""
    model_path, graph, graph_dir, data_dir, c, utts, loaded, streams = args
    here = loaded is not None
    if not isinstance(graph, Graph):
        graph = load_graph(Path(graph))
    if loaded is None:
        ckpt = ModelCheckpoint.load(model_path, head="ce")
        loaded = (ckpt, *model_for_graph(ckpt, model_path, graph, graph_dir, c))
    ckpt, model, device = loaded
    reader = feature_reader(data_dir, ckpt, streams)
    cpu0 = time.process_time()
    loglikes = pseudo_loglikes(model, ((u, reader[u]) for u in utts), ckpt.log_priors,
                               ckpt.chunk or 21, c.prior_scale, c.acoustic_scale,
                               c.batch_chunks, device)
    # one step of the bar: an utterance through the network and the search (lattice and sweep)
    searched = Bar(loglikes, total=len(utts), desc=f"decode {Path(data_dir).name}",
                    unit="utt", file=sys.stderr, disable=None if here else True, leave=False)
    hyps, stats = decode_sweep(searched, graph, c.settings(), c, ckpt.frame_shift)
    stats["cpu_seconds"] = round(time.process_time() - cpu0, 2)
    return hyps, with_rates(stats)


_SUMMED = ("utterances", "frames", "audio_seconds", "nn_seconds", "search_seconds",
           "sweep_seconds", "cpu_seconds", "failed_utterances", "untimed_paths")


def merge_stats(parts: list[dict]) -> dict:
    """The stats of jobs that decoded disjoint shares, as if one had decoded them all."""
    out = {k: round(sum(p.get(k, 0) for p in parts), 2) for k in _SUMMED}
    for k in ("utterances", "frames", "failed_utterances", "untimed_paths"):
        out[k] = int(out[k])
    out["jobs"] = len(parts)
    return with_rates(out)


def with_rates(stats: dict) -> dict:
    """``stats`` with its real-time factors (seconds per second of audio): network, search,
    both (each job's time summed), and ``real_time_factor_per_core``, the CPU seconds of the
    jobs (network threads, feature reading, search and the sweep's best paths; not the scoring)
    per second of audio."""
    audio = max(stats["audio_seconds"], 1e-9)
    stats.setdefault("jobs", 1)
    stats["real_time_factor"] = round((stats["nn_seconds"] + stats["search_seconds"]) / audio, 4)
    stats["nn_real_time_factor"] = round(stats["nn_seconds"] / audio, 4)
    stats["search_real_time_factor"] = round(stats["search_seconds"] / audio, 4)
    if "cpu_seconds" in stats:
        stats["real_time_factor_per_core"] = round(stats["cpu_seconds"] / audio, 4)
    return stats


def decode_loglikes(loglikes: Iterator[tuple[str, np.ndarray, float]], graph: Graph | Path,
                    data_dir: Path, out_dir: Path,
                    cfg: Mapping | HybridDecodeConfig | None = None,
                    frame_shift: float = 0.01) -> dict:
    """Steps 2 and 3 of ``decode_hybrid`` for any source of scaled pdf log-likelihoods:
    (utterance, [frames, num_pdfs] float32, seconds spent computing them) per utterance."""
    c = HybridDecodeConfig.from_config(cfg)
    if not isinstance(graph, Graph):
        graph = load_graph(Path(graph))
    settings = c.settings()
    hyps, stats = decode_sweep(loglikes, graph, settings, c, frame_shift)
    return score_sweep(hyps, settings, c, DataDir.read(data_dir), Path(data_dir), Path(out_dir),
                       stats)


# ---------------------------------------------------------------------------- acoustic model
def model_streams(ckpt: ModelCheckpoint, model_path: Path,
                  streams: Mapping[str, Path] | None) -> dict[str, Path]:
    """``streams`` checked against the streams the model's input appends (its checkpoint's
    ``features.append``): the same input in decoding as in training."""
    append = appended_streams(ckpt.features, f"{model_path}: features")
    streams = {str(k): Path(v) for k, v in (streams or {}).items()}
    if sorted(streams) != sorted(append):
        raise AsrtrainError(f"{model_path}: the model's input appends {append or 'nothing'} "
                            f"(its features: delta_order={ckpt.delta_order} append={append}), "
                            f"but the streams given are {sorted(streams) or 'none'}; give the "
                            "set's directories of those streams (features.reader.stream_dirs)")
    return streams


def feature_reader(data_dir: Path, ckpt: ModelCheckpoint,
                   streams: Mapping[str, Path] | None = None) -> FeatureReader:
    """The data dir's input composed as the model was trained (its checkpoint's features
    config, ``streams``: :func:`model_streams`): (utterance, features) in the data dir's order;
    errors name feats.scp, cmvn.scp or the stream's table."""
    return FeatureReader(data_dir, ckpt.delta_order, ckpt.norm_vars, input_dim=ckpt.input_dim,
                         hint="run the features stage (fbank as the model was trained on)",
                         streams=streams)


@torch.no_grad()
def pseudo_loglikes(model: torch.nn.Module, utts: Iterator[tuple[str, np.ndarray]],
                    log_priors: torch.Tensor, chunk: int, prior_scale: float,
                    acoustic_scale: float, batch_chunks: int,
                    device: torch.device | None = None,
                    ) -> Iterator[tuple[str, np.ndarray, float]]:
    """Yield (utterance, scaled pdf log-likelihoods [frames, pdfs] float32, network seconds).

    Utterances are grouped until their chunks fill ``batch_chunks`` (one long utterance may be
    several forward passes); an utterance is yielded as soon as its group is done, so only one
    group's outputs are ever in memory (32k pdfs x frames is large)."""
    device = device or torch.device("cpu")
    priors = (prior_scale * log_priors).to(device)
    group: list[tuple[str, np.ndarray]] = []
    size = 0

    def run(group: list[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray, float]]:
        t0 = time.time()
        pieces, where = [], []
        for i, (_, feats) in enumerate(group):
            for s in chunk_starts(len(feats), chunk):
                piece = feats[s: s + chunk]
                pieces.append((piece, len(piece)))
                where.append((i, s))
        dim = group[0][1].shape[1]
        outs = []
        for b in range(0, len(pieces), batch_chunks):
            part = pieces[b: b + batch_chunks]
            x = torch.zeros(len(part), chunk, dim)
            for k, (p, n) in enumerate(part):
                x[k, :n] = torch.from_numpy(p)
            lengths = torch.tensor([n for _, n in part])
            logits, _ = model(x.to(device), lengths)
            outs.append(torch.log_softmax(logits.float(), dim=-1))
        post = torch.cat(outs)
        results = [torch.empty(len(f), post.shape[-1], device=device) for _, f in group]
        done = [0] * len(group)
        for k, (i, s) in enumerate(where):
            n = min(chunk, len(group[i][1]) - s)
            # The last chunk overlaps the one before it: keep that one's frames, take only the
            # new ones from here, so every frame comes from exactly one chunk.
            first = done[i] - s
            results[i][s + first: s + n] = post[k, first:n]
            done[i] = s + n
        seconds = (time.time() - t0) / len(group)
        for (utt, _), r in zip(group, results, strict=True):
            ll = ((r - priors) * acoustic_scale).cpu().numpy().astype(np.float32)
            yield utt, ll, seconds

    for utt, feats in utts:
        n = len(chunk_starts(len(feats), chunk))
        if group and size + n > batch_chunks:
            yield from run(group)
            group, size = [], 0
        group.append((utt, feats))
        size += n
    if group:
        yield from run(group)


# ---------------------------------------------------------------------------- search
def _with_penalty(lat: kaldifst.Lattice, wip: float) -> kaldifst.Lattice:
    """``lattice-add-penalty``: ``wip`` added to the graph cost of every word arc."""
    out = kaldifst.Lattice()
    for _ in range(lat.num_states):
        out.add_state()
    out.start = lat.start
    for s in range(lat.num_states):
        out.set_final(s, lat.final(s))
        # kaldifst.ArcIterator only wraps StdFst; the Lattice iterator is not re-exported
        arcs = _ArcIteratorLattice(lat, s)
        while not arcs.done:
            a = arcs.value
            arcs.next()
            w = a.weight
            if a.olabel:
                w = kaldifst.LatticeWeight(w.value1 + wip, w.value2)
            out.add_arc(s, kaldifst.LatticeArc(a.ilabel, a.olabel, w, a.nextstate))
    return out


def best_paths(lat: kaldifst.Lattice, settings: list[tuple[int, float]],
               acoustic_scale: float) -> dict[tuple[int, float], tuple[list[int], list[int]]]:
    """(transition states per frame, word ids) of the best path for every (lmwt, wip)."""
    out = {}
    for wip in sorted({w for _, w in settings}):
        pen = _with_penalty(lat, wip) if wip else lat
        for lmwt in sorted({m for m, w in settings if w == wip}):
            scaled = pen.copy()
            # the decoder's acoustic costs carry acoustic_scale: undo it, then 1/lmwt
            kaldifst.scale_lattice([[1.0, 0.0], [0.0, 1.0 / (acoustic_scale * lmwt)]], scaled)
            ok, isyms, osyms, _ = kaldifst.get_linear_symbol_sequence(
                kaldifst.shortest_path(scaled))
            out[(lmwt, wip)] = (list(isyms), list(osyms)) if ok else ([], [])
    return out


def _faster_paths(decoder: kaldi_decoder.FasterDecoder, ll: np.ndarray,
                  settings: list[tuple[int, float]], acoustic_scale: float,
                  ) -> dict[tuple[int, float], tuple[list[int], list[int]]] | None:
    """``decoder: faster``: one FasterDecoder search per LM weight, the acoustic scale 1/lmwt
    (the decoder has no lattice, so no insertion penalty either: the settings have wip 0)."""
    out = {}
    for lmwt, wip in settings:
        decoder.decode(kaldi_decoder.DecodableCtc(ll / (acoustic_scale * lmwt)))
        ok, path = decoder.get_best_path(use_final_probs=True)
        if not ok:
            ok, path = decoder.get_best_path(use_final_probs=False)
        if not ok:
            return None
        _, isyms, osyms, _ = kaldifst.get_linear_symbol_sequence(path)
        out[(lmwt, wip)] = (list(isyms), list(osyms))
    return out


def word_times(tstates: list[int], word_ids: list[int], graph: Graph, positions: np.ndarray,
               frame_shift: float) -> list[TimedWord] | None:
    """Words timed by the word-position phones of the best path (None if they disagree).

    ``positions[phone]`` is B, I, E, S or '' (between-word silence).  A phone instance starts
    where the phone changes or its HMM enters state 0 anew (no topology returns to state 0 from
    another state)."""
    words = [graph.words.id2sym[w] for w in word_ids]
    if not tstates:
        return [] if not words else None
    labels = np.asarray(tstates, dtype=np.int64)
    phone = graph.tstates[labels - 1, 0]
    state = graph.tstates[labels - 1, 1]
    starts = np.flatnonzero(np.r_[True, (phone[1:] != phone[:-1])
                                  | ((state[1:] == 0) & (labels[1:] != labels[:-1]))])
    ends = np.r_[starts[1:], len(labels)]
    spans: list[tuple[int, int]] = []
    open_at = None
    for b, e in zip(starts, ends, strict=True):
        pos = positions[phone[b]]
        if pos in ("B", "S"):
            open_at = b
        if pos in ("E", "S") and open_at is not None:
            spans.append((open_at, e))
            open_at = None
    if len(spans) != len(words):
        return None
    return [TimedWord(w, b * frame_shift, (e - b) * frame_shift)
            for w, (b, e) in zip(words, spans, strict=True)]


def decode_sweep(loglikes: Iterator[tuple[str, np.ndarray, float]], graph: Graph,
                 settings: list[tuple[int, float]], c: HybridDecodeConfig, frame_shift: float,
                 ) -> tuple[dict[tuple[int, float], dict[str, list[TimedWord]]], dict]:
    """Lattice-decode each utterance's scaled pdf log-likelihoods; timed 1-best per setting.

    Used by ``decode_hybrid`` and by anything else that has pdf log-likelihoods (the tests
    decode posteriors made from a forced alignment)."""
    lang_dir = Path(graph.info["lang_dir"])
    phones = PhoneSet.read(lang_dir)
    positions = np.array([phones.position_of(s) for s in phones.phones.id2sym], dtype=object)
    hclg = graph.hclg   # the decoder holds a raw pointer to it
    if c.decoder == "lattice":
        config = kaldi_decoder.LatticeSimpleDecoderConfig(beam=c.beam, lattice_beam=c.lattice_beam)
        decoder = kaldi_decoder.LatticeSimpleDecoder(hclg, config)
    else:
        decoder = faster_decoder(hclg, c.beam, c.max_active)
    tstate_pdf = graph.tstates[:, 2]
    num_pdfs = int(graph.info["num_pdfs"])
    acoustic_scale = c.acoustic_scale
    hyps: dict[tuple[int, float], dict[str, list[TimedWord]]] = {s: {} for s in settings}
    nn_seconds = search_seconds = sweep_seconds = 0.0
    frames = utts = untimed = failed = 0
    for utt, ll, seconds in loglikes:
        if ll.ndim != 2 or ll.shape[1] != num_pdfs:
            raise AsrtrainError(f"utterance {utt}: log-likelihoods of shape {ll.shape}, the "
                                f"graph has {num_pdfs} pdfs")
        nn_seconds += seconds
        frames += len(ll)
        utts += 1
        t0 = time.time()
        ll = np.ascontiguousarray(ll[:, tstate_pdf])
        if c.decoder == "lattice":
            decoder.decode(kaldi_decoder.DecodableCtc(ll))
            ok, lat = decoder.get_raw_lattice(use_final_probs=True)
            if not ok or lat.num_states == 0:
                ok, lat = decoder.get_raw_lattice(use_final_probs=False)
            paths = None if not ok or lat.num_states == 0 else lat
        else:
            paths = _faster_paths(decoder, ll, settings, acoustic_scale)
        t1 = time.time()
        search_seconds += t1 - t0
        if paths is None:
            log.warning("utterance %s: no path survived the beam (%d frames); empty hypothesis",
                        utt, len(ll))
            failed += 1
            for s in settings:
                hyps[s][utt] = []
            continue
        if not isinstance(paths, dict):
            paths = best_paths(paths, settings, acoustic_scale)
        timed: dict[tuple[tuple[int, ...], tuple[int, ...]], list[TimedWord] | None] = {}
        for s, (isyms, osyms) in paths.items():
            key = (tuple(isyms), tuple(osyms))
            if key not in timed:
                timed[key] = word_times(isyms, osyms, graph, positions, frame_shift)
            words = timed[key]
            if words is None:
                untimed += 1
                log.warning("utterance %s: word positions of the best path do not match its "
                            "%d words (lmwt %s wip %s); no CTM lines", utt, len(osyms), *s)
                words = []
            hyps[s][utt] = words
        sweep_seconds += time.time() - t1
    if not utts:
        raise AsrtrainError("decode: no utterance to decode")
    stats = {"utterances": utts, "frames": frames, "audio_seconds": round(frames * frame_shift, 2),
             "nn_seconds": round(nn_seconds, 2), "search_seconds": round(search_seconds, 2),
             "sweep_seconds": round(sweep_seconds, 2), "failed_utterances": failed,
             "untimed_paths": untimed}
    return hyps, with_rates(stats)


# ---------------------------------------------------------------------------- scoring
def score_sweep(hyps: dict[tuple[int, float], dict[str, list[TimedWord]]],
                settings: list[tuple[int, float]], c: HybridDecodeConfig, data: DataDir,
                data_dir: Path, out_dir: Path, stats: dict) -> dict:
    """Score every setting's words with ``score_decode`` (each in a temporary decode dir), keep
    the best (or the only, fixed one); write the decode-dir layout into ``out_dir``; return the
    summary (``decode.json``) with the chosen setting's ``counts``."""
    from asrtrain.report import selection
    from asrtrain.score import counts_json

    data_dir, out_dir = Path(data_dir), Path(out_dir)
    scored = {}
    for s in Bar(settings, desc="score sweep", unit="setting", file=sys.stderr, disable=None,
                  leave=False):
        scored.update(score_candidates({s: (_words(hyps[s]), hyps[s])}, data, data_dir))
    rows = [{"lmwt": lmwt, "wip": wip, "wer": counts_json(scored[(lmwt, wip)])}
            for lmwt, wip in settings if (lmwt, wip) in scored]
    if rows:
        best = min(rows, key=lambda r: (r["wer"]["all"]["wer"], r["lmwt"], r["wip"]))
        lmwt, wip = best["lmwt"], best["wip"]
        how = selection(out_dir.name, len(settings))
    else:
        lmwt, wip = settings[len(settings) // 2]
        how = "no stm or text to score: the middle setting of the sweep"
    chosen = hyps[(lmwt, wip)]
    summary = {"lmwt": lmwt, "wip": wip, "selection": how, **stats, "settings": c.as_dict(),
               "sweep": rows}
    counts = write_decode_dir(out_dir, _words(chosen), chosen, data, data_dir, summary)
    if counts:
        # one setting: where it came from is the stage's to say (the config, or a dev set)
        log.info("decode %s: LM weight %d, insertion penalty %.1f%s; WER %s", out_dir, lmwt,
                 wip, f", {how}" if len(settings) > 1 else "",
                 ", ".join(f"{k} {v.wer:.2f}%" for k, v in counts.items()))
    else:
        log.info("decode %s: %s (lmwt %d, wip %.1f)", out_dir, how, lmwt, wip)
    # the seconds measured from the samples (utt2dur, the features stage's), else the frames'
    durations = read_utt2dur(data_dir)
    seconds = (sum(durations[u] for u in data.utts) if set(data.utts) <= durations.keys()
               else stats["audio_seconds"])
    log.info("decode %s: %.1f s of audio; real-time factor %.3f (network %.3f, search %.3f), "
             "per core %s, wall %s with %d jobs", out_dir, seconds,
             stats["real_time_factor"], stats["nn_real_time_factor"],
             stats["search_real_time_factor"], stats.get("real_time_factor_per_core", "-"),
             stats.get("wall_real_time_factor", "-"), stats.get("jobs", 1))
    return {**summary, "counts": counts}


def _words(timed: dict[str, list[TimedWord]]) -> dict[str, list[str]]:
    return {utt: [w.word for w in words] for utt, words in timed.items()}
