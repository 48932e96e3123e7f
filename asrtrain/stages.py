"""The stages recipes are made of: each reads the outputs of the ones before it and validates
them before doing any work, writes through temporary names, and logs what it did."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, read_table, write_table
from asrtrain.fileio import atomic_open
from asrtrain.recipe import Paths, Stage

log = logging.getLogger("asrtrain")


def _sets(cfg: DictConfig) -> list[str]:
    """Every data set the recipe uses: train, dev, then the test sets."""
    names = [cfg.sets.train, cfg.sets.dev, *cfg.sets.test]
    return list(dict.fromkeys(names))


def stage_prepare(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.data.corpora import prepare_corpus

    written = prepare_corpus(cfg.corpus, paths.data)
    missing = [s for s in _sets(cfg) if s not in written]
    if missing:
        raise AsrtrainError(f"corpus {cfg.corpus.kind} gave the sets {written}, but the recipe "
                            f"needs {missing} (see sets: in the recipe)")
    for name in written:
        d = DataDir.read(paths.data / name)
        log.info("%s: %d utterances, %d speakers, %d recordings", paths.data / name,
                 len(d.utt2spk), len(d.spk2utt), len(d.wav))


def stage_lang(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.lang.bpe import train_units

    train = DataDir.read(paths.data / cfg.sets.train)
    texts = [train.text[u] for u in train.utts]
    if (paths.dict_dir / "lexicon.txt").is_file():
        from asrtrain.lang.lexicon import prepare_lang

        # prepare_lang builds the whole directory anew, so it comes first.
        prepare_lang(paths.dict_dir, paths.lang, sil_prob=float(cfg.lang.get("sil_prob", 0.5)))
    else:
        words = sorted({w for t in texts for w in t.split()})
        with atomic_open(paths.lang / "words.txt", "w", encoding="utf-8") as f:
            f.write("".join(f"{w} {i}\n" for i, w in enumerate(["<eps>", *words])))
        log.info("lang: no dict dir, so no lexicon: %d words in %s", len(words), paths.lang)
    train_units(texts, paths.lang / "units.model", vocab_size=int(cfg.lang.vocab_size),
                model_type=str(cfg.lang.unit_type))


def stage_lm(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.lang.ngram import train_lm

    train = DataDir.read(paths.data / cfg.sets.train)
    train_lm([train.text[u] for u in train.utts], paths.lang, paths.lm, order=int(cfg.lm.order),
             prune_threshold=float(cfg.lm.prune_threshold))


def mfcc_dir(paths: Paths, name: str) -> Path:
    """The copy of data set ``name`` that carries MFCCs for the GMMs (Kaldi: a second data dir)."""
    return paths.data / f"{name}_mfcc"


def stage_mfcc(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.features import FeatureOptions, compute_features

    dirs = []
    for name in _sets(cfg):
        data = DataDir.read(paths.data / name)
        copy = data.subset(data.utts)
        copy.feats, copy.cmvn, copy.utt2num_frames = {}, {}, {}
        for table in ("feats.scp", "cmvn.scp", "utt2num_frames"):
            (mfcc_dir(paths, name) / table).unlink(missing_ok=True)
        copy.write(mfcc_dir(paths, name))
        for extra in ("stm", "glm"):
            if (paths.data / name / extra).is_file():
                shutil.copyfile(paths.data / name / extra, mfcc_dir(paths, name) / extra)
        dirs.append(mfcc_dir(paths, name))
    opts = FeatureOptions.from_config(
        {**cfg.mfcc, "resample": bool(cfg.corpus.get("resample", False))})
    compute_features(dirs, paths.exp / "feats", opts, nj=int(cfg.nj))


def stage_align(cfg: DictConfig, paths: Paths) -> None:
    """GMM passes (mono, tri1, tri2 ...) in order, each skipped if done with the same options;
    each pass is decoded on the test sets when align.decode is set (its WER checks it); the last
    pass's model also aligns the dev set for the hybrid model's held-out figures."""
    import json

    from asrtrain.align import align_data, import_kaldi_alignment, train_mono, train_tri
    from asrtrain.recipe import config_hash

    train_dir = mfcc_dir(paths, cfg.sets.train)
    if cfg.align.source == "kaldi":
        if not cfg.align.kaldi_dir:
            raise AsrtrainError("align.source=kaldi needs align.kaldi_dir (an ali-to-pdf dir)")
        import_kaldi_alignment(Path(cfg.align.kaldi_dir), paths.align / "kaldi",
                               cfg.align.num_pdfs)
        return
    previous = ""
    for name, opts in cfg.align.passes.items():
        out = paths.align / name
        digest = config_hash(cfg.align.passes, [name], previous)
        previous = digest
        marker = out / ".done"
        if marker.is_file() and marker.read_text().strip() == digest:
            log.info("align %s: done already (%s), skipped", name, digest)
            continue
        gmm = {k: v for k, v in OmegaConf.to_container(opts).items() if k != "from"}
        if opts["from"] is None:
            train_mono(train_dir, paths.lang, out, gmm)
        else:
            train_tri(train_dir, paths.lang, paths.align / opts["from"], out, gmm)
        if cfg.align.decode:
            from asrtrain.decode.graph import decode_gmm, make_graph

            make_graph(paths.lang, paths.lm, out, out / "graph")
            for test in cfg.sets.test:
                result = decode_gmm(out, out / "graph", mfcc_dir(paths, test),
                                    out / f"decode_{test}", {})
                log.info("align %s: %s: %s", name, test, json.dumps(result, default=str)[:400])
        (out / ".done").write_text(digest + "\n")
    last = list(cfg.align.passes)[-1]
    align_data(mfcc_dir(paths, cfg.sets.dev), paths.lang, paths.align / last,
               paths.align / f"{last}_ali_{cfg.sets.dev}", {})


def final_alignments(cfg: DictConfig, paths: Paths) -> dict[str, str]:
    if cfg.align.source == "kaldi":
        return {"train": str(paths.align / "kaldi"), "dev": str(paths.align / "kaldi")}
    last = list(cfg.align.passes)[-1]
    return {"train": str((paths.align / last).resolve()),
            "dev": str((paths.align / f"{last}_ali_{cfg.sets.dev}").resolve())}


def stage_features(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.features import FeatureOptions, compute_features

    opts = FeatureOptions.from_config(
        {**cfg.features, "resample": bool(cfg.corpus.get("resample", False))})
    compute_features([paths.data / name for name in _sets(cfg)], paths.exp / "feats", opts,
                     nj=int(cfg.nj))


#: Trainer settings a run may change and still resume from its checkpoints.
RESUMABLE_CHANGES = {"epochs", "log_every", "threads", "timeout_s", "learners", "nnodes",
                     "node_rank", "rdzv_endpoint", "gossip_idle_s"}


def train_dir(cfg: DictConfig, paths: Paths) -> Path:
    return paths.train / str(cfg.model.name)


def run_training(cfg: DictConfig, paths: Paths) -> Path:
    """Train ``cfg.model`` with ``cfg.trainer``: in this process for one learner, else under
    torchrun; return the final model's path."""
    import hashlib
    import json
    import time

    out = train_dir(cfg, paths)
    # Checkpoints are resumed only by a run of the same model, data and trainer settings (more
    # epochs or another launch is fine); any other change starts afresh, keeping the old run.
    trainer = {k: v for k, v in OmegaConf.to_container(cfg.trainer, resolve=True).items()
               if k not in RESUMABLE_CHANGES}
    key = json.dumps({"model": OmegaConf.to_container(cfg.model, resolve=True),
                      "features": OmegaConf.to_container(cfg.features, resolve=True),
                      "sets": OmegaConf.to_container(cfg.sets, resolve=True),
                      "trainer": trainer}, sort_keys=True, default=str)
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    stamp = out / "resume_key"
    if out.is_dir() and any(out.glob("epoch-*.pt")) and (
            not stamp.is_file() or stamp.read_text().strip() != fingerprint):
        old = out.with_name(f"{out.name}.before-{time.strftime('%Y%m%d-%H%M%S')}")
        out.rename(old)
        log.warning("%s holds checkpoints of other settings: moved to %s, training afresh",
                    out, old)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(stamp, "w", encoding="utf-8") as f:
        f.write(fingerprint + "\n")
    run_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    run_cfg.train_dir = str(out.resolve())
    run_cfg.exp_dir = str(paths.exp.resolve())
    config_path = out / "config.yaml"
    with atomic_open(config_path, "w", encoding="utf-8") as f:
        f.write(OmegaConf.to_yaml(run_cfg))
    t = cfg.trainer
    if int(t.learners) == 1 and int(t.nnodes) == 1:
        from asrtrain.train.worker import run_learner

        run_learner(config_path)
    else:
        from asrtrain.distributed.launch import launch

        launch([str(config_path)], learners=int(t.learners), nnodes=int(t.nnodes),
               node_rank=int(t.node_rank), rdzv_endpoint=t.get("rdzv_endpoint"),
               threads=int(t.get("threads") or 0))
    if not (out / "final.pt").is_file():
        raise AsrtrainError(f"{out}/final.pt: training ended without a final model "
                            f"(see {paths.logs / 'train.log'})")
    return out / "final.pt"


def stage_train(cfg: DictConfig, paths: Paths) -> None:
    run_training(cfg, paths)


def hybrid_config(cfg: DictConfig, paths: Paths) -> DictConfig:
    """The recipe's config with the hybrid model and its trainer settings in place."""
    hcfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    hcfg.model = OmegaConf.merge(hcfg.hybrid.model, {"alignments": final_alignments(cfg, paths)})
    hcfg.trainer = OmegaConf.merge(hcfg.trainer, hcfg.hybrid.get("trainer") or {})
    return hcfg


def stage_train_hybrid(cfg: DictConfig, paths: Paths) -> None:
    run_training(hybrid_config(cfg, paths), paths)


def stage_decode_hybrid(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.decode.graph import make_graph
    from asrtrain.decode.hybrid import decode_hybrid

    hcfg = hybrid_config(cfg, paths)
    last = Path(hcfg.model.alignments.train)
    graph = last / "graph"
    if not (graph / "HCLG.fst").is_file():
        make_graph(paths.lang, paths.lm, last, graph)
    for name in cfg.sets.test:
        out = paths.decode / str(hcfg.model.name) / name
        summary = decode_hybrid(train_dir(hcfg, paths) / "final.pt", graph, paths.data / name,
                                out, OmegaConf.to_container(hcfg.hybrid.decode)
                                if "decode" in hcfg.hybrid else {})
        if "wer" in summary:
            report_wer(name, str(hcfg.model.name), {
                subset: (w["err"], w["ref_words"], w["ins"], w["del"], w["sub"])
                for subset, w in summary["wer"].items()}, out / "score")


def stage_decode(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.decode.ctc import decode_data_dir

    model = train_dir(cfg, paths) / "final.pt"
    for name in cfg.sets.test:
        decode_data_dir(model, paths.lang / "units.model", paths.data / name,
                        paths.decode / str(cfg.model.name) / name,
                        batch_frames=int(cfg.decode.batch_frames))


def stage_score(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.score import score_hub5, wer_counts

    for name in cfg.sets.test:
        data_dir = paths.data / name
        dec = paths.decode / str(cfg.model.name) / name
        if not (dec / "ctm").is_file():
            raise AsrtrainError(f"{dec}/ctm: missing (run the decode stage)")
        if (data_dir / "stm").is_file():
            glm = data_dir / "glm" if (data_dir / "glm").is_file() else None
            counts = score_hub5(data_dir / "stm", dec / "ctm", dec / "score", glm=glm,
                                kaldi_filter=bool(cfg.score.kaldi_filter),
                                backend=str(cfg.score.backend))
            rows = dict(counts)
        else:
            log.info("%s: no stm; scoring plain WER of each utterance", data_dir)
            data = DataDir.read(data_dir)
            hyps = read_table(dec / "text", allow_empty_value=True)
            rows = {"all": wer_counts({u: data.text[u].split() for u in data.utts},
                                      {u: hyps.get(u, "").split() for u in data.utts})}
        report_wer(name, str(cfg.model.name), {
            subset: (c.err, c.ref_words, c.ins, c.dels, c.sub) for subset, c in rows.items()},
            dec / "score")


def report_wer(set_name: str, system: str, rows: dict[str, tuple[int, int, int, int, int]],
               score_dir: Path) -> None:
    """Print, log and write to ``score_dir/wer`` one line per subset (all, swbd, callhm):
    ``eval2000 all: WER 7.19% [ 41 / 570, 9 ins, 5 del, 27 sub ] hybrid_tiny``; ``rows`` holds
    (errors, reference words, insertions, deletions, substitutions) per subset."""
    table, lines = {}, []
    for subset, (err, ref, ins, dels, subs) in rows.items():
        value = (f"WER {100.0 * err / max(ref, 1):.2f}% [ {err} / {ref}, {ins} ins, {dels} del, "
                 f"{subs} sub ] {system}")
        table[f"{set_name}_{subset}"] = value
        lines.append(f"{set_name} {subset}: {value}")
        log.info("%s", lines[-1])
    write_table(score_dir / "wer", table)
    print("\n".join(lines), flush=True)


STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("prepare", stage_prepare, ("corpus", "sets"),
          "corpus -> Kaldi data dirs (wav.scp segments text utt2spk spk2utt; stm glm)"),
    Stage("lang", stage_lang, ("lang",),
          "phones, words.txt, L.fst from the dict dir; sentencepiece units"),
    Stage("lm", stage_lm, ("lm",), "Kneser-Ney n-gram (ARPA) and G.fst"),
    Stage("features", stage_features, ("features",), "fbank features, per-speaker CMVN stats"),
    Stage("train", stage_train, ("model", "trainer"), "acoustic model training"),
    Stage("decode", stage_decode, ("decode",), "decoding of the test sets to CTM"),
    Stage("score", stage_score, ("score",), "WER for SWB, CallHome and all (Hub5 rules)"),
    Stage("mfcc", stage_mfcc, ("mfcc",), "MFCC copies of the data sets for the GMMs"),
    Stage("align", stage_align, ("align",),
          "GMM-HMM passes (mono, tri1, tri2), pdf alignments, HCLG decoding of each"),
    Stage("train_hybrid", stage_train_hybrid, ("hybrid",),
          "hybrid BLSTM, frame CE on chunks of the alignments' pdf ids"),
    Stage("decode_hybrid", stage_decode_hybrid, ("hybrid",),
          "hybrid decoding through HCLG, LM-weight sweep, Hub5 scoring"),
]}
