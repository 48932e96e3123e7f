"""Stage ``ivectors``: Kaldi's online i-vectors (``steps/online/nnet2``) for the hybrid model's
``append: [ivector]`` input: a diagonal UBM (``train_diag_ubm.sh``) and an i-vector extractor
(``train_ivector_extractor.sh``) on the training set's fbank features, then online i-vectors
every ``ivector.online.period`` frames of the train, dev and test sets
(``extract_ivectors_online.sh``, adaptation state carried across up to ``utts_per_spk_max`` of a
speaker's utterances); or Kaldi's own ``ivector_online.scp`` imported (``ivector.source:
kaldi``, ``ivector.kaldi_dirs: {SET: DIR}``).

Writes ``paths.ivector_extractor`` (``final.ubm``, ``final.ie``, ``info.json``: seconds,
frames/s and the peak memory of extractor training) and ``paths.ivector_set(set)``
(``ivector_online.{ark,scp}``, ``ivector_period``). The UBM, the extractor and each set's
extraction are inner steps keyed by the stage's resume key and the options they depend on: a
run killed during extraction resumes at the set it was in, and a change of ``ivector.online``
re-extracts without retraining. Which features and why no CMVN: ``asrtrain.adapt.ivector_sets``.

The work runs as jobs (``asrtrain.jobs``: the recipe's ``nj``, ``cmd``, ``threads``, ``slurm``),
each on a part of a set split by speaker: the UBM's and the extractor's E-step statistics (summed
here in job order, so the models do not depend on ``nj``) and the extraction (each job writes
its own ark, this process the scp). This process runs with ``threads`` threads too.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text
from asrtrain.jobs import JobConfig, set_threads
from asrtrain.logs import plural
from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets
from asrtrain.sections import sets_settings
from asrtrain.settings import choice, integer, number, opt, read

log = logging.getLogger("asrtrain")

SOURCES = ("train", "kaldi")
#: ``ivector.online`` keys that say how the work is batched, not what it computes.
LAUNCH_ONLY = ("batch_frames",)


@dataclass(frozen=True)
class UbmSettings:
    """``ivector.ubm``: Kaldi's ``train_diag_ubm.sh`` (conf/ivector/default.yaml says each)."""

    num_gauss: int = opt(512, integer(1))
    num_utts: int = opt(30000, integer(0))
    num_frames: int = opt(200000, integer(1))
    num_iters_init: int = opt(20, integer(1))
    num_iters: int = opt(4, integer(0))
    num_gselect: int = opt(30, integer(1))
    min_gaussian_weight: float = opt(1.0e-4, number(0.0))
    seed: int = opt(0, integer(0))


@dataclass(frozen=True)
class ExtractorSettings:
    """``ivector.extractor``: Kaldi's ``train_ivector_extractor.sh``."""

    num_utts: int = opt(100000, integer(0))
    ivector_dim: int = opt(100, integer(1))
    num_iters: int = opt(10, integer(1))
    num_gselect: int = opt(5, integer(1))
    min_post: float = opt(0.025, number(0.0))
    posterior_scale: float = opt(0.1, number(0.0, low_open=True))
    gaussian_min_count: float = opt(100.0, number(0.0))
    variance_floor_factor: float = opt(0.1, number(0.0, low_open=True))
    seed: int = opt(0, integer(0))


@dataclass(frozen=True)
class OnlineSettings:
    """``ivector.online``: Kaldi's ``extract_ivectors_online.sh``."""

    period: int = opt(10, integer(1))
    posterior_scale: float = opt(0.1, number(0.0, low_open=True))
    utts_per_spk_max: int = opt(2, integer(0))
    max_remembered_frames: int = opt(1000, integer(0))
    batch_frames: int = opt(20000, integer(1))


@dataclass(frozen=True)
class IvectorConfig:
    """The ``ivector`` section, read by :func:`asrtrain.settings.read`; its defaults are
    ``conf/ivector/default.yaml``'s (Switchboard sizes)."""

    source: str = opt("train", choice(*SOURCES))
    kaldi_dirs: dict | None = None
    device: str = "cpu"
    cmvn: bool = False
    subsample: int = opt(2, integer(1))
    ubm: UbmSettings = field(default_factory=UbmSettings)
    extractor: ExtractorSettings = field(default_factory=ExtractorSettings)
    online: OnlineSettings = field(default_factory=OnlineSettings)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> IvectorConfig:
        """The recipe's ``ivector`` section (an error naming the group when there is none)."""
        if "ivector" not in cfg:
            raise AsrtrainError("stage ivectors needs the ivector config group: add '- ivector: "
                                "default' to the recipe's defaults (or ivector=tiny on the "
                                "command line: +ivector=tiny)")
        return read(cls, OmegaConf.to_container(cfg.ivector, resolve=True), "ivector")


def _opts(cfg: DictConfig) -> dict:
    """The checked ``ivector`` section as plain data (the jobs' options and the steps' keys)."""
    return asdict(IvectorConfig.from_config(cfg))


def _step(ctx: StageContext, marker: Path, key: str, what: str, work) -> bool:
    """Run ``work()`` unless ``marker`` holds ``key``; write it afterwards. Whether it ran."""
    if ctx.step_done(marker, key):
        log.info("ivectors %s: done already, skipped", what)
        return False
    marker.unlink(missing_ok=True)
    work()
    write_text(marker, key + "\n")
    return True


def run(ctx: StageContext) -> None:
    if ctx.cfg.ivector.source == "kaldi":
        _import_kaldi(ctx)
        return
    jobs = ctx.jobs()
    with _threads(jobs.threads):
        _train_and_extract(ctx, jobs)


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """This process at ``n`` threads (torch, BLAS) while the stage runs, as its jobs are; what
    it had before restored after (later stages in this process set their own)."""
    import torch
    from threadpoolctl import threadpool_limits

    env = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                          "MKL_NUM_THREADS")}
    before = torch.get_num_threads()
    with threadpool_limits(n):
        set_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)
            for var, value in env.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value


def _train_and_extract(ctx: StageContext, jobs: JobConfig) -> None:
    from asrtrain.adapt import ivector_sets as iv

    cfg, paths = ctx.cfg, ctx.paths
    opts = _opts(cfg)
    device = str(opts["device"])
    sub, cmvn = int(opts["subsample"]), bool(opts["cmvn"])
    norm_vars = bool(cfg.features.get("norm_vars", False))
    ext_dir = paths.ivector_extractor
    info_path = ext_dir / "info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    train = iv.SetFrames(paths.data_set(sets_settings(cfg).train), cmvn, norm_vars)

    ubm_key = ctx.step_key("ubm", opts["ubm"], sub, cmvn)

    def ubm_work() -> None:
        ubm, info["ubm"] = iv.train_ubm(train, opts["ubm"], sub, jobs, device)
        iv.save_ubm(ubm, ext_dir / "final.ubm")
        _report("diag UBM", info["ubm"])
    _step(ctx, ext_dir / ".ubm.done", ubm_key, "diag UBM", ubm_work)

    ie_key = ctx.step_key("extractor", ubm_key, opts["extractor"])

    def ie_work() -> None:
        ubm = iv.load_ubm(ext_dir / "final.ubm")
        ext, info["extractor"] = iv.train_extractor(train, ubm, opts["extractor"], sub, jobs,
                                                    device)
        iv.save_extractor(ext, ext_dir / "final.ie")
        _report("extractor", info["extractor"])
    if _step(ctx, ext_dir / ".ie.done", ie_key, "extractor", ie_work):
        info.pop("extraction", None)
    iv.write_info(info_path, info)

    ubm, ext = iv.load_ubm(ext_dir / "final.ubm"), iv.load_extractor(ext_dir / "final.ie")
    post = iv.PosteriorOptions(int(opts["extractor"]["num_gselect"]),
                               float(opts["extractor"]["min_post"]),
                               float(opts["online"]["posterior_scale"]))
    info.setdefault("extraction", {})
    for name in data_sets(cfg):
        out = paths.ivector_set(name)

        def work(name: str = name, out: Path = out) -> None:
            frames = iv.SetFrames(paths.data_set(name), cmvn, norm_vars)
            info["extraction"][name] = iv.extract_set(frames, ubm, ext, opts["online"], post,
                                                      out, jobs)
            _report(f"{name} extracted", info["extraction"][name])
            iv.write_info(info_path, info)
        online = {k: v for k, v in opts["online"].items() if k not in LAUNCH_ONLY}
        _step(ctx, out / ".done", ctx.step_key("extract", name, ie_key, online),
              f"{name} extraction", work)


def _report(what: str, info: dict) -> None:
    from asrtrain.adapt.ivector_sets import log_info

    log_info(what, info)
    extra = f", peak RSS {info['peak_rss_mb']:.0f} MB" if "peak_rss_mb" in info else ""
    if "frames_per_cpu_s" in info:
        extra += (f", {info['frames_per_cpu_s']} frames per CPU-second in "
                  f"{plural(info['jobs'], 'job')}")
    log.info("ivectors %s: %d frames in %.1f s (%d frames/s)%s", what, info["frames"],
             info["seconds"], info["frames_per_s"], extra)


def _import_kaldi(ctx: StageContext) -> None:
    from asrtrain.adapt.ivector_sets import import_kaldi_ivectors

    cfg, paths = ctx.cfg, ctx.paths
    dirs = cfg.ivector.get("kaldi_dirs") or {}
    for name in data_sets(cfg):
        # what is imported was not extracted here: a later source=train extracts again
        (paths.ivector_set(name) / ".done").unlink(missing_ok=True)
        info = import_kaldi_ivectors(Path(dirs[name]), paths.data_set(name),
                                     paths.ivector_set(name))
        log.info("ivectors %s: imported %d utterances' %d-dim i-vectors (period %d) from %s",
                 name, info["utterances"], info["dim"], info["period"], info["source"])


def _check(cfg: DictConfig) -> None:
    """The section read (types, ranges, unknown keys); Kaldi dirs given for every set."""
    c = IvectorConfig.from_config(cfg)
    if c.source == "kaldi":
        dirs = c.kaldi_dirs or {}
        missing = [s for s in data_sets(cfg) if s not in dirs]
        if missing:
            raise AsrtrainError(f"ivector.source=kaldi: ivector.kaldi_dirs has no directory for "
                                f"set {missing[0]} (give {{{missing[0]}: "
                                "KALDI/exp/nnet3/ivectors_SET}})")


STAGE = Stage("ivectors", run, reads=("features",), config=("ivector",),
              ignored=("ivector.device", "ivector.online.batch_frames"),
              resumable=("ivector",),   # each inner step's key holds the options it depends on
              check=_check,
              doc="diagonal UBM, i-vector extractor, online i-vectors of every set")
