"""HCLG decoding graphs for GMM (and hybrid) models, and GMM decoding with kaldi-decoder.

``make_graph`` follows Kaldi's ``utils/mkgraph.sh`` with kaldifst: LG = min(det(L_disambig o G));
CLG = C o LG with the triphone context (``compose_context``, which also returns what each CLG input
label means: a phone window ``[left, phone, right]`` or a disambiguation symbol); H maps each
window to the HMM of its phone, every arc labelled with the *transition state* it enters
(``(phone, hmm_state, pdf)``, numbered from 1), weighted with the trained transition
probabilities under Kaldi's scales (transition 1.0, self-loop 0.1).  HCLG = min(det(H o CLG))
with the disambiguation symbols removed after determinization.  Unlike Kaldi, H already contains
the self-loops (no separate add-self-loops step): labels that identify (phone, state) keep the
determinization well defined because equal label cycles carry equal weights; the cost is a larger
determinization, fine for the tiny and 300 h vocabularies, to revisit for very large graphs.

``decode_gmm`` scores frames with the GMMs (pdf log-likelihoods gathered to transition states),
decodes with kaldi-decoder's FasterDecoder once per acoustic scale, and times the words by
aligning each decoded transcript with the training-graph aligner (exact word boundaries, like
Kaldi's lattice word alignment).  Each scale's words are scored with ``score_decode`` (Hub5 with
the data dir's ``stm``, plain WER on its ``text`` otherwise) and, as Kaldi's scoring picks the
best LM weight, the scale with the lowest WER on the set itself is kept.  It writes the one
decode-dir layout (asrtrain/decode/__init__.py): ``ctm``, ``text``, ``score/`` and
``decode.json`` (chosen scale, every scale's WER, real-time factor, settings).  The features are
the model's own (Δ+ΔΔ, or spliced through an LDA+MLLT pass's matrix: ``load_data`` with the
model).  The pieces (``open_decoding``, ``search_utts``, which can also return the best paths'
transition states, and ``write_decode``) serve the SAT passes' two-pass decode too
(:mod:`asrtrain.decode.fmllr`).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import kaldi_decoder
import kaldifst
import numpy as np
import torch

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.align.graph import phone_arcs, scale_transitions
from asrtrain.align.model import AcousticModel, Utterance, align, load_data
from asrtrain.data.datadir import DataDir
from asrtrain.decode import (
    AUDIO_PER_JOB_S,
    GmmDecodeConfig,
    job_shares,
    score_candidates,
    write_decode_dir,
)
from asrtrain.decode.ctc import TimedWord
from asrtrain.fileio import atomic_dir, write_text
from asrtrain.jobs import JobConfig, as_job_config, run_jobs
from asrtrain.lang.lexicon import Lang
from asrtrain.lang.phones import SymbolTable
from asrtrain.logs import plural
from asrtrain.progress import Bar
from asrtrain.report import selection
from asrtrain.score import counts_json

log = logging.getLogger(__name__)


def _relabel_copy(fst: kaldifst.StdVectorFst, imap: dict[int, int]) -> kaldifst.StdVectorFst:
    """A copy of ``fst`` with input labels mapped by ``imap`` (others unchanged)."""
    out = kaldifst.StdVectorFst()
    for _ in range(fst.num_states):
        out.add_state()
    out.start = fst.start
    for s in kaldifst.StateIterator(fst):
        out.set_final(s, fst.final(s))
        for a in kaldifst.ArcIterator(fst, s):
            out.add_arc(s, kaldifst.StdArc(imap.get(a.ilabel, a.ilabel), a.olabel, a.weight,
                                           a.nextstate))
    return out


def make_h(model: AcousticModel, ilabels: list[list[int]], self_loop_scale: float,
           transition_scale: float) -> tuple[kaldifst.StdVectorFst, list[tuple[int, int, int]],
                                             set[int]]:
    """H for the CLG input labels: returns H, the transition states (phone, hmm_state, pdf) in
    label order (label = index + 1), and H's disambiguation input labels.

    H is written as OpenFst's text form and compiled in one call (an arc at a time through the
    bindings was most of a graph's time: ~200k arcs for the tiny corpus's 32k contexts); the
    weights as the float32 values the arcs hold, printed so that they read back exactly."""
    scaled = scale_transitions(model.log_trans, self_loop_scale, transition_scale)
    tstates: dict[tuple[int, int, int], int] = {}
    # each phone's arcs: (s, d, cost as text), d == n leaving the phone, in the order they are
    # added
    pattern = {phone: [(s, d, repr(float(-np.float32(m[s, d])))) for s, d in phone_arcs(m)]
               for phone, m in scaled.items()}
    windows, disambig_out = [], []
    for olabel, window in enumerate(ilabels):
        if olabel == 0:
            continue
        if len(window) != 3 or window[1] <= 0:             # #-1 ([0]) or #k ([-k])
            disambig_out.append(olabel)
        else:
            windows.append((olabel, *window))
    # every context's pdfs in one look-up (Tree.pdfs, as Tree.pdf gives them one by one)
    ctx = [(left, phone, right, s) for _, left, phone, right in windows
           for s in range(scaled[phone].shape[0])]
    pdf_of = model.tree.pdfs(np.asarray(ctx, dtype=np.int64).reshape(-1, 4)).tolist()

    lines: list[str] = []
    num_states, k = 1, 0                                    # state 0: start and final
    for olabel, _, phone, _ in windows:
        n = scaled[phone].shape[0]
        pdfs, first = pdf_of[k:k + n], num_states
        k += n
        num_states += n
        lines.append(f"0 {first} {tstates.setdefault((phone, 0, pdfs[0]), len(tstates) + 1)} "
                     f"{olabel} 0\n")
        for s, d, cost in pattern[phone]:
            if d == n:
                lines.append(f"{first + s} 0 0 0 {cost}\n")
            else:
                label = tstates.setdefault((phone, d, pdfs[d]), len(tstates) + 1)
                lines.append(f"{first + s} {first + d} {label} 0 {cost}\n")
    disambig_in = set()
    for j, olabel in enumerate(disambig_out):
        il = len(tstates) + 1 + j
        disambig_in.add(il)
        lines.append(f"0 0 {il} {olabel} 0\n")
    lines.append("0 0\n")
    h = kaldifst.compile("".join(lines), keep_state_numbering=True)
    if h.num_states != num_states:   # a state no arc names (none: every state has its arcs)
        raise AsrtrainError(f"make_h: {h.num_states} states compiled, {num_states} made")
    kaldifst.arcsort(h, sort_type="olabel")
    order = sorted(tstates, key=tstates.__getitem__)
    return h, order, disambig_in


def make_graph(lang_dir: Path, lm_dir: Path, model_dir: Path, graph_dir: Path,
               self_loop_scale: float = 0.1, transition_scale: float = 1.0) -> dict:
    """Build ``graph_dir/HCLG.fst`` (with ``tstates.txt``, ``words.txt``, ``info.json``)."""
    lang_dir, lm_dir, graph_dir = Path(lang_dir), Path(lm_dir), Path(graph_dir)
    for f in (lang_dir / "L_disambig.fst", lm_dir / "G.fst"):
        if not f.is_file():
            raise AsrtrainError(f"{f}: missing; run the lang and lm stages first")
    t0 = time.time()
    lang = Lang.read(lang_dir)
    model = AcousticModel.load(model_dir)
    # each step is one opaque call into OpenFst: the bar names the one running
    bar = Bar(total=3, desc=f"HCLG {Path(model_dir).name}", unit="step", file=sys.stderr,
               disable=None, leave=False, postfix="LG = min(det(L o G))")
    L = kaldifst.StdVectorFst.read(str(lang_dir / "L_disambig.fst"))
    G = kaldifst.StdVectorFst.read(str(lm_dir / "G.fst"))
    kaldifst.arcsort(L, sort_type="olabel")
    LG = kaldifst.compose(L, G)
    kaldifst.determinize_star(LG)
    kaldifst.minimize_encoded(LG)
    bar.set_postfix_str("CLG = C o LG", refresh=False)
    bar.update()
    CLG, ilabels = kaldifst.compose_context(lang.phones.disambig_ids, 3, 1, LG)
    kaldifst.arcsort(CLG, sort_type="ilabel")
    H, tstates, disambig_in = make_h(model, ilabels, self_loop_scale, transition_scale)
    bar.set_postfix_str("HCLG = min(det(H o CLG))", refresh=False)
    bar.update()
    HCLG = kaldifst.compose(H, CLG)
    kaldifst.determinize_star(HCLG)
    HCLG = _relabel_copy(HCLG, dict.fromkeys(disambig_in, 0))
    kaldifst.rmepsilon(HCLG)
    kaldifst.minimize_encoded(HCLG)
    kaldifst.arcsort(HCLG, sort_type="ilabel")
    bar.update()
    bar.close()
    info = {"lang_dir": str(lang_dir.resolve()), "model_dir": str(Path(model_dir).resolve()),
            "num_tstates": len(tstates), "num_pdfs": model.num_pdfs,
            "LG_states": LG.num_states, "CLG_states": CLG.num_states,
            "HCLG_states": HCLG.num_states, "HCLG_arcs": sum(
                HCLG.num_arcs(s) for s in range(HCLG.num_states)),
            "seconds": round(time.time() - t0, 2)}
    with atomic_dir(graph_dir) as tmp:
        HCLG.write(str(tmp / "HCLG.fst"))
        write_text(tmp / "tstates.txt", "".join(f"{i + 1} {p} {s} {pdf}\n"
                                                for i, (p, s, pdf) in enumerate(tstates)))
        shutil.copy(lang_dir / "words.txt", tmp / "words.txt")
        write_text(tmp / "info.json", json.dumps(info, indent=1) + "\n")
    log.info("graph %s: %s", graph_dir, info, extra=STAGE_LOG_ONLY)
    return info


def _read_tstates(graph_dir: Path) -> np.ndarray:
    """``[num_tstates, 3]``: (phone, hmm_state, pdf) of transition state ``label - 1``."""
    rows = [ln.split() for ln in (graph_dir / "tstates.txt").read_text().splitlines()]
    return np.array([[int(r[1]), int(r[2]), int(r[3])] for r in rows], dtype=np.int64)


@dataclass
class Graph:
    """A graph dir read back for decoding (``hclg`` must stay referenced while a decoder that
    was given it is in use: kaldi-decoder keeps only a C++ pointer)."""

    info: dict
    hclg: kaldifst.StdVectorFst
    words: SymbolTable
    tstates: np.ndarray       # [num_tstates, 3] (phone, hmm_state, pdf) of label - 1
    dir: Path | None = None   # where it was read from (spawned jobs read it again)

    @property
    def tstate_pdf(self) -> torch.Tensor:
        return torch.from_numpy(self.tstates[:, 2].copy())


def load_graph(graph_dir: Path) -> Graph:
    """Read ``make_graph``'s output, naming the first missing file."""
    graph_dir = Path(graph_dir)
    for name in ("info.json", "HCLG.fst", "tstates.txt", "words.txt"):
        if not (graph_dir / name).is_file():
            raise AsrtrainError(f"{graph_dir / name}: missing; run make_graph for this model")
    info = json.loads((graph_dir / "info.json").read_text())
    return Graph(info, kaldifst.StdVectorFst.read(str(graph_dir / "HCLG.fst")),
                 SymbolTable.read(graph_dir / "words.txt"), _read_tstates(graph_dir), graph_dir)


def decode_gmm(model_dir: Path, graph_dir: Path, data_dir: Path, out_dir: Path,
               cfg: Mapping | GmmDecodeConfig | None = None, nj: int | JobConfig = 1,
               audio_per_job: float = AUDIO_PER_JOB_S) -> dict:
    """Decode ``data_dir`` with the GMM model and HCLG graph into ``out_dir``; see the module
    docstring.  ``cfg``: ``GmmDecodeConfig``'s keys.  ``nj``: parallel search jobs over
    contiguous shares of the utterances (the words are those of one job), at most one per
    ``audio_per_job`` seconds of audio; a stage's ``JobConfig`` also says where they run. The
    features are the model's own (Δ+ΔΔ, or spliced through its LDA+MLLT matrix). Returns what
    ``decode.json`` holds (the chosen ``acoustic_scale``, ``wer`` and ``per_scale`` WER as
    numbers, ``real_time_factor`` of the wall time and ``real_time_factor_per_core`` of the
    jobs' CPU time, ``jobs``) and ``counts``: the chosen scale's ``Counts`` per subset ({} with
    nothing to score)."""
    c = GmmDecodeConfig.from_config(cfg)
    model_dir, data_dir = Path(model_dir), Path(data_dir)
    model, graph, lang = open_decoding(ModelRef(model_dir), graph_dir)
    utts, skipped = load_data(data_dir, lang, model)
    found = search_utts(ModelRef(model_dir), model, graph, utts, c, nj, audio_per_job,
                        desc=f"decode {model_dir.name} {Path(out_dir).name}")
    return write_decode(model, lang, utts, skipped, found, data_dir, out_dir, c)


@dataclass(frozen=True)
class ModelRef:
    """Which model a decoding job loads: ``final.mdl`` of ``model_dir``, or with
    ``speaker_independent`` the alignment model of a SAT pass (Kaldi's ``final.alimdl``,
    decode_fmllr.sh's first pass)."""

    model_dir: Path
    speaker_independent: bool = False

    def load(self) -> AcousticModel:
        return AcousticModel.load(self.model_dir, alignment_model=self.speaker_independent)


def open_decoding(ref: ModelRef, graph_dir: Path) -> tuple[AcousticModel, Graph, Lang]:
    """The model, its graph and the graph's lang dir; a graph built for another tree is an
    error."""
    graph_dir = Path(graph_dir)
    graph = load_graph(graph_dir)
    model = ref.load()
    if graph.info["num_pdfs"] != model.num_pdfs:
        raise AsrtrainError(f"{graph_dir}: built for {graph.info['num_pdfs']} pdfs, the model in "
                            f"{ref.model_dir} has {model.num_pdfs}; rebuild the graph")
    graph.dir = graph_dir
    return model, graph, Lang.read(Path(graph.info["lang_dir"]))


@dataclass
class Search:
    """What the search gives: the words of every utterance per acoustic scale, the best path's
    transition states (rows of ``graph.tstates``: phone, HMM state, pdf; one per frame) at
    ``path_scale`` when asked for, and its cost."""

    words: dict[float, dict[str, list[str]]]
    paths: dict[str, np.ndarray]
    seconds: float
    cpu_seconds: float
    jobs: int


def search_utts(ref: ModelRef, model: AcousticModel, graph: Graph, utts: list[Utterance],
                c: GmmDecodeConfig, nj: int | JobConfig = 1,
                audio_per_job: float = AUDIO_PER_JOB_S, path_scale: float | None = None,
                desc: str = "search") -> Search:
    """``search_gmm`` over ``utts`` (features already as the model reads them) in up to ``nj``
    jobs (a number, or a stage's ``JobConfig``: where they run too; ``desc`` names them, as in
    their logs' folder); with ``path_scale``, the best paths at that scale too (for fMLLR
    estimation)."""
    t0 = time.time()
    jobs = as_job_config(nj)
    shares = job_shares(utts, jobs.nj, sum(len(u.feats) for u in utts) * 0.01, audio_per_job)
    words, paths, cpu = _search_in_jobs(model, ref, graph, shares, c, path_scale, jobs, desc)
    return Search(words, paths, time.time() - t0, cpu, len(shares))


def write_decode(model: AcousticModel, lang: Lang, utts: list[Utterance],
                 skipped: Mapping[str, str], found: Search, data_dir: Path, out_dir: Path,
                 c: GmmDecodeConfig, extra: Mapping | None = None) -> dict:
    """Time the words of every scale (forced alignment with ``model`` on ``utts``' features),
    score them, keep the best scale (or the one given) and write the decode dir, with ``extra``
    in ``decode.json``; returns ``decode_gmm``'s summary."""
    data_dir = Path(data_dir)
    hyps = found.words
    align_cfg = {"self_loop_scale": c.self_loop_scale, "transition_scale": c.transition_scale,
                 "device": c.device}
    timed = time_candidates(model, lang, utts, hyps, align_cfg)
    data = DataDir.read(data_dir)
    scored = score_candidates({s: (hyps[s], timed[s]) for s in hyps}, data, data_dir)
    if scored:
        best = min(scored, key=lambda s: scored[s]["all"].wer)
        how = selection(Path(out_dir).name, len(hyps))
    else:
        best, how = c.acoustic_scales[0], "no stm or text to score: the first scale"
    frames = sum(len(u.feats) for u in utts)
    summary = {"acoustic_scale": best, "selection": how,
               "per_scale": {f"{s:.4f}": counts_json(v) for s, v in scored.items()},
               "utterances": len(utts), "skipped": sorted(skipped), "frames": frames,
               "decode_seconds": round(found.seconds, 2), "jobs": found.jobs,
               "cpu_seconds": round(found.cpu_seconds, 2),
               "real_time_factor": round(found.seconds / max(frames * 0.01, 1e-9), 4),
               "real_time_factor_per_core": round(found.cpu_seconds / max(frames * 0.01, 1e-9),
                                                  4),
               "settings": asdict(c), **(extra or {})}
    counts = write_decode_dir(out_dir, hyps[best], timed[best], data, data_dir, summary)
    # one setting: where it came from is the stage's to say (the config, or a dev set)
    log.info("decode %s: acoustic scale %.4f%s; WER %s; real-time factor %.4f per core, "
             "%.4f of the wall time in %s", out_dir, best,
             f", {how}" if len(hyps) > 1 else "",
             ", ".join(f"{k} {v.wer:.2f}%" for k, v in counts.items()) or "not scored",
             summary["real_time_factor_per_core"], summary["real_time_factor"],
             plural(found.jobs, "job"))
    return {**summary, "counts": counts}


def _search_in_jobs(model: AcousticModel, ref: ModelRef, graph: Graph,
                    shares: list[list[Utterance]], c: GmmDecodeConfig, path_scale: float | None,
                    jobs: JobConfig, desc: str,
                    ) -> tuple[dict[float, dict[str, list[str]]], dict[str, np.ndarray], float]:
    """``search_gmm`` over each share (here when there is one and ``cmd`` is local, else one
    job per share, which loads the model and the graph itself); the words, the paths and the
    CPU seconds."""
    if len(shares) == 1 and jobs.cmd == "local":
        cpu0 = time.process_time()
        words, paths = search_gmm(model, graph, shares[0], c, path_scale)
        return words, paths, time.process_time() - cpu0
    results = run_jobs(_search_job, [(ref, graph.dir, share, c, path_scale) for share in shares],
                       jobs, f"{desc} ({plural(len(shares), 'job')})")
    words = {s: {u: w for (h, _), _ in results for u, w in h[s].items()}
             for s in c.acoustic_scales}
    paths = {u: p for (_, ps), _ in results for u, p in ps.items()}
    return words, paths, sum(cpu for _, cpu in results)


def _search_job(args: tuple) -> tuple[tuple[dict, dict], float]:
    ref, graph_dir, utts, c, path_scale = args   # threads: the job runner's (one by default)
    model, graph = ref.load(), load_graph(graph_dir)
    cpu0 = time.process_time()
    return search_gmm(model, graph, utts, c, path_scale), time.process_time() - cpu0


def faster_decoder(hclg: kaldifst.StdVectorFst, beam: float, max_active: int,
                   ) -> kaldi_decoder.FasterDecoder:
    """kaldi-decoder's FasterDecoder: ``beam``, and at most ``max_active`` states alive per
    frame (Kaldi's ``--max-active``). Its ``min_active`` (no pruning below it, 20 by default)
    must stay under ``max_active``, or the library refuses a small cap. Keep a reference to
    ``hclg`` as long as the decoder: it holds a raw pointer."""
    opts = kaldi_decoder.FasterDecoderOptions()
    opts.beam = beam
    opts.max_active = max_active
    opts.min_active = min(opts.min_active, max_active - 1)
    return kaldi_decoder.FasterDecoder(hclg, opts)


def search_gmm(model: AcousticModel, graph: Graph, utts: list[Utterance], c: GmmDecodeConfig,
               path_scale: float | None = None,
               ) -> tuple[dict[float, dict[str, list[str]]], dict[str, np.ndarray]]:
    """The 1-best words of every utterance for each acoustic scale (FasterDecoder on the GMM
    pdf log-likelihoods gathered to ``graph``'s transition states), and at ``path_scale`` the
    best path's ``[T, 3]`` transition states (phone, HMM state, pdf per frame), which
    decode_fmllr.sh's transforms are estimated from. One utterance's likelihoods at a time
    (frames x pdfs: a whole test set's would not fit at Switchboard size)."""
    hclg = graph.hclg   # the decoder holds a raw pointer to it
    decoder = faster_decoder(hclg, c.beam, c.max_active)
    device = torch.device(c.device)
    gmm = model.gmm.to(device)
    tstate_pdf = graph.tstate_pdf
    out: dict[float, dict[str, list[str]]] = {scale: {} for scale in c.acoustic_scales}
    paths: dict[str, np.ndarray] = {}
    bar = Bar(total=len(c.acoustic_scales) * len(utts), desc="decode", unit="utt",
               file=sys.stderr, disable=None, leave=False)
    for u in utts:
        tstate_ll = gmm.loglikes(torch.from_numpy(u.feats).to(device)).cpu()[:, tstate_pdf]
        for scale in c.acoustic_scales:
            ll = (tstate_ll * scale).numpy().astype(np.float32)
            decoder.decode(kaldi_decoder.DecodableCtc(ll))
            ok, lat = decoder.get_best_path(use_final_probs=True)
            if not ok:
                ok, lat = decoder.get_best_path(use_final_probs=False)
            out[scale][u.utt] = []
            if ok:
                _, ilabels, olabels, _ = kaldifst.get_linear_symbol_sequence(lat)
                out[scale][u.utt] = [graph.words.id2sym[o] for o in olabels]
                if scale == path_scale and len(ilabels) == len(u.feats):
                    paths[u.utt] = graph.tstates[np.asarray(ilabels, dtype=np.int64) - 1]
            bar.update()
    bar.close()
    return out, paths


def time_candidates(model: AcousticModel, lang: Lang, utts: list[Utterance],
                    candidates: dict[float, dict[str, list[str]]], cfg: Mapping,
                    ) -> dict[float, dict[str, list[TimedWord]]]:
    """``time_words`` for every candidate, each distinct (utterance, words) aligned once."""
    cache: dict[tuple[str, tuple[str, ...]], list[TimedWord]] = {}
    out = {}
    for key, hyps in candidates.items():
        todo = {u: h for u, h in hyps.items() if (u, tuple(h)) not in cache}
        for utt, words in time_words(model, lang, utts, todo, cfg).items():
            cache[(utt, tuple(todo[utt]))] = words
        out[key] = {u: cache[(u, tuple(h))] for u, h in hyps.items() if (u, tuple(h)) in cache}
    return out


def time_words(model: AcousticModel, lang: Lang, utts: list[Utterance],
               hyps: dict[str, list[str]], cfg: Mapping) -> dict[str, list[TimedWord]]:
    """Word start and duration from a forced alignment of each hypothesis."""
    todo = [Utterance(u.utt, hyps[u.utt], u.feats) for u in utts if hyps.get(u.utt)]
    res = align(model, lang, todo, cfg, desc="timing words") if todo else None
    out: dict[str, list[TimedWord]] = {}
    for u in todo:
        wi = res.words.get(u.utt)
        if wi is None:
            log.warning("could not time the hypothesis of %s; no CTM lines", u.utt)
            continue
        words = []
        for k, w in enumerate(u.words):
            frames = np.nonzero(wi == k)[0]
            if len(frames):
                words.append(TimedWord(w, frames[0] * 0.01, len(frames) * 0.01))
        out[u.utt] = words
    return out
