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
    paths.lang.mkdir(parents=True, exist_ok=True)
    train_units(texts, paths.lang / "units.model", vocab_size=int(cfg.lang.vocab_size),
                model_type=str(cfg.lang.unit_type))
    words = sorted({w for t in texts for w in t.split()})
    table = ["<eps> 0"] + [f"{w} {i}" for i, w in enumerate(words, 1)]
    with atomic_open(paths.lang / "words.txt", "w", encoding="utf-8") as f:
        f.write("\n".join(table) + "\n")
    lexicon = paths.dict_dir / "lexicon.txt"
    if lexicon.is_file():
        shutil.copyfile(lexicon, paths.lang / "lexicon.txt")
    log.info("lang: %d words in %s", len(words), paths.lang)


def stage_features(cfg: DictConfig, paths: Paths) -> None:
    from asrtrain.features import FeatureOptions, compute_features

    opts = FeatureOptions.from_config(
        {**cfg.features, "resample": bool(cfg.corpus.get("resample", False))})
    compute_features([paths.data / name for name in _sets(cfg)], paths.exp / "feats", opts,
                     nj=int(cfg.nj))


def train_dir(cfg: DictConfig, paths: Paths) -> Path:
    return paths.train / str(cfg.model.name)


def stage_train(cfg: DictConfig, paths: Paths) -> None:
    out = train_dir(cfg, paths)
    out.mkdir(parents=True, exist_ok=True)
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
               node_rank=int(t.node_rank), rdzv_endpoint=t.get("rdzv_endpoint"))
    if not (out / "final.pt").is_file():
        raise AsrtrainError(f"{out}/final.pt: training ended without a final model "
                            f"(see {paths.logs / 'train.log'})")


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
        lines = []
        for subset, c in rows.items():
            wer = 100.0 * c.err / max(c.ref_words, 1)
            line = (f"{name} {subset}: WER {wer:.2f}% [ {c.err} / {c.ref_words}, "
                    f"{c.ins} ins, {c.dels} del, {c.sub} sub ]")
            log.info("%s", line)
            lines.append(line)
        write_table(dec / "score" / "wer", {ln.split(":")[0].replace(" ", "_"): ln.split(": ")[1]
                                            for ln in lines})
        print("\n".join(lines), flush=True)


STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("prepare", stage_prepare, ("corpus", "sets"),
          "corpus -> Kaldi data dirs (wav.scp segments text utt2spk spk2utt; stm glm)"),
    Stage("lang", stage_lang, ("lang",), "sentencepiece units, words.txt, lexicon"),
    Stage("features", stage_features, ("features",), "fbank features, per-speaker CMVN stats"),
    Stage("train", stage_train, ("model", "trainer"), "acoustic model training"),
    Stage("decode", stage_decode, ("decode",), "decoding of the test sets to CTM"),
    Stage("score", stage_score, ("score",), "WER for SWB, CallHome and all (Hub5 rules)"),
]}
