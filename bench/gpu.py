"""Frames/s per learner of the hybrid BLSTM: model alone against the trainer end to end.

    python bench/gpu.py [--quick] [--out bench/results] [--chunks 128 512 1536]
                        [--precisions fp32 bf16] [--model ibm|small] [--device auto|cpu|cuda]
                        [--chunk-data resident stream] [--inputs flat ibm260]

A synthetic SWB-shaped task (260-dim input, 32k pdfs, 21-frame chunks; issue 11) at each batch
size (chunks per step) and precision (``trainer.precision``):

- ``model_only_fps``: synthetic tensors already on the device, each step the task's loss
  (``FrameCETask.loss``: forward, frame cross-entropy) under the trainer's autocast, backward,
  gradient clipping and an SGD step: what the GPU can do;
- ``end_to_end_fps``: a data dir of real kaldiio feature arks and an alignment dir in the layout
  ``ChunkSet`` reads, trained through the trainer's own epoch loop (``trainer._train_epoch``:
  the task's loader, the learning-rate schedule, the single-learner backend's calls, the
  non-finite-loss check), frames/s of its last epoch (the first one warms up);
- ``--inputs``: the 260 input dims as one ark (``flat``), or as the recipe writes them
  (``ibm260``: 40-dim fbank whose Δ/ΔΔ the loader computes, 40-dim fMLLR, a 100-dim online
  i-vector every 10 frames; conf/features/ibm260.yaml), so the loaders' assembly is timed too;
- the gossip exchange at the model's size: two gloo processes swap the flat fp32 parameter
  vector (as the AD-PSGD gossip does, through host memory), seconds and MB/s per exchange; on
  CUDA also the device→host→device copies of that vector.

Precisions the device cannot train the model in (bf16 on a CPU without AVX-512: the trainer's
own probe, :func:`asrtrain.models.precision.precision_refusal`) are left out, and the output and
the JSON's ``precisions_left_out`` say why.

Writes ``<out>/gpu.json`` (rows with ``device``, ``chunks``, ``precision``, ``model_only_fps``,
``end_to_end_fps``, ``end_to_end_share``, ``chunk_data``: the trainer's loader, resident or
stream; ``precisions_left_out``; the gossip figures; the settings) and ``<out>/gpu.png``.
``--quick`` runs on the CPU with a small model and small batches in well under 2 minutes (the
test runs it); the full run uses CUDA when there is a GPU. End to end here means one learner:
the gossip's cost is measured beside it, not inside the steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import kaldiio
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402

from asrtrain.distributed.backend import SingleProcessBackend  # noqa: E402
from asrtrain.fileio import atomic_open, write_text  # noqa: E402
from asrtrain.models import build_model  # noqa: E402
from asrtrain.models.precision import precision_refusal  # noqa: E402
from asrtrain.train.chunks import ChunkBatch  # noqa: E402
from asrtrain.train.config import TrainerConfig  # noqa: E402
from asrtrain.train.schedule import LRSchedule  # noqa: E402
from asrtrain.train.tasks import build_task  # noqa: E402
from asrtrain.train.trainer import _Run, _train_epoch, autocast, build_optimizer  # noqa: E402

CHUNK = 21
INPUT_DIM = 260
#: the parts of the ``ibm260`` input (conf/features/ibm260.yaml): fbank (Δ/ΔΔ added by the loader),
#: fMLLR, online i-vector, and the i-vectors' period in frames (Kaldi's ``ivector_period``)
FBANK_DIM, FMLLR_DIM, IVECTOR_DIM, IVECTOR_PERIOD = 40, 40, 100, 10
INPUTS = ("flat", "ibm260")
MODELS = {  # the IBM model of conf/hybrid/ibm.yaml, and one small enough for a CPU test
    "ibm": {"layers": 6, "cells": 512, "bottleneck": 256},
    "small": {"layers": 2, "cells": 32, "bottleneck": 16},
}


@dataclass
class Settings:
    """What one bench run measures."""

    model: str = "ibm"
    pdfs: int = 32000
    chunks: list[int] = field(default_factory=lambda: [128, 512, 1536])
    precisions: list[str] = field(default_factory=lambda: ["fp32", "bf16"])
    device: str = "auto"
    warmup_steps: int = 3       # model only, before timing
    steps: int = 30             # model only, timed (10 left the share noisy: 328k vs 495k)
    utts: int = 0               # synthetic utterances (0: enough for end_to_end_steps)
    utt_frames: int = 300       # 15 chunks of 21 frames each
    end_to_end_steps: int = 20  # steps of the largest batch in one epoch
    epochs: int = 2             # end to end; the last one is timed
    chunk_data: list[str] = field(default_factory=lambda: ["resident"])  # trainer.chunk_data
    gossip_params: int = 0      # 0: the model's size
    gossip_rounds: int = 5
    # how the 260 input dims are stored: "flat" (one 260-dim ark), "ibm260" (the recipe's:
    # 40 log-mel + Δ/ΔΔ computed by the loader | 40 fMLLR | a 100-dim i-vector a row every
    # IVECTOR_PERIOD frames, three tables as the features, align and ivectors stages write them)
    inputs: list[str] = field(default_factory=lambda: ["flat"])
    profile: str | None = None  # a folder: each row's timed epoch under torch.profiler, a table

    @classmethod
    def quick(cls) -> Settings:
        return cls(model="small", pdfs=500, chunks=[8, 32], device="cpu", warmup_steps=2,
                   steps=8, end_to_end_steps=8, gossip_rounds=3)

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def num_utts(self) -> int:
        per_utt = len(range(0, self.utt_frames - CHUNK + 1, CHUNK)) + 1
        return self.utts or -(-max(self.chunks) * self.end_to_end_steps // per_utt)


# ------------------------------------------------------------------ the synthetic task on disk
def write_task(root: Path, s: Settings, inputs: str = "flat", seed: int = 0) -> Path:
    """An exp dir with ``data/train`` (feature arks, utt2num_frames) and ``ali`` (int32 pdf
    arks, num_pdfs), as the features and align stages write them; returns the exp dir.
    ``inputs="ibm260"`` writes the recipe's three tables instead of one 260-dim ark: 40-dim
    fbank in ``data/train``, 40-dim fMLLR in ``data/train_fmllr`` and online i-vectors in
    ``ivectors/train`` (a row every ``IVECTOR_PERIOD`` frames)."""
    from asrtrain.features.reader import ivector_rows

    rng = np.random.default_rng(seed)
    data, ali = root / "data" / "train", root / "ali"
    data.mkdir(parents=True)
    ali.mkdir()
    utts = [f"spk{i % 8}-utt{i:06d}" for i in range(s.num_utts())]
    utts.sort()
    tables = {"feats": (data, "feats", INPUT_DIM if inputs == "flat" else FBANK_DIM)}
    if inputs == "ibm260":
        tables["fmllr"] = (root / "data" / "train_fmllr", "feats", FMLLR_DIM)
        tables["ivector"] = (root / "ivectors" / "train", "ivector_online", IVECTOR_DIM)
    writers = {}
    with contextlib.ExitStack() as stack:
        for name, (where, stem, _) in tables.items():
            where.mkdir(parents=True, exist_ok=True)
            writers[name] = stack.enter_context(
                kaldiio.WriteHelper(f"ark,scp:{where}/{stem}.ark,{where}/{stem}.scp"))
        pdfs = stack.enter_context(kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp"))
        for utt in utts:
            for name, (_, _, dim) in tables.items():
                rows = ivector_rows(s.utt_frames, IVECTOR_PERIOD) if name == "ivector" \
                    else s.utt_frames
                writers[name](utt, rng.standard_normal((rows, dim), dtype=np.float32))
            pdfs(utt, rng.integers(0, s.pdfs, s.utt_frames, dtype=np.int32))
    if inputs == "ibm260":
        write_text(root / "ivectors" / "train" / "ivector_period", f"{IVECTOR_PERIOD}\n")
    write_text(ali / "num_pdfs", f"{s.pdfs}\n")
    for name, value in (("wav.scp", lambda u: "/dev/null"), ("text", lambda u: "a"),
                        ("utt2spk", lambda u: u.split("-")[0]),
                        ("utt2num_frames", lambda u: str(s.utt_frames))):
        write_text(data / name, "".join(f"{u} {value(u)}\n" for u in utts))
    spk2utt: dict[str, list[str]] = {}
    for u in utts:
        spk2utt.setdefault(u.split("-")[0], []).append(u)
    write_text(data / "spk2utt", "".join(f"{k} {' '.join(v)}\n" for k, v in sorted(
        spk2utt.items())))
    return root


def task_config(exp: Path, s: Settings, chunks: int, precision: str, chunk_data: str,
                inputs: str = "flat"):
    """The config the train_hybrid stage would give the trainer for this task."""
    features = {"delta_order": 0, "norm_vars": False} if inputs == "flat" else \
        {"delta_order": 2, "norm_vars": False, "append": ["fmllr", "ivector"]}
    return OmegaConf.create({
        "exp_dir": str(exp), "train_dir": str(exp / "model"),
        "sets": {"train": "train", "dev": "train", "test": []},
        "features": features,
        "model": {"name": f"hybrid_{s.model}", **MODELS[s.model], "dropout": 0.0,
                  "stack_frames": 1, "head": "ce",
                  "alignments": {"train": str(exp / "ali"), "dev": str(exp / "ali")}},
        "trainer": {"chunk": CHUNK, "batch_chunks": chunks, "precision": precision,
                    "optimizer": "sgd", "lr": 1e-3, "momentum": 0.9, "warmup_epochs": 0.0,
                    "log_every": 1 << 30, "cpu": s.torch_device().type == "cpu",
                    "chunk_data": chunk_data},
    })


# ------------------------------------------------------------------ the two measurements
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_only_fps(task, model, optimizer, tcfg: TrainerConfig, chunks: int, s: Settings,
                   device: torch.device) -> float:
    """Frames/s of training steps on synthetic tensors already on ``device``."""
    g = torch.Generator(device="cpu").manual_seed(0)
    batch = ChunkBatch(torch.randn(chunks, CHUNK, INPUT_DIM, generator=g).to(device),
                       torch.full((chunks,), CHUNK),
                       torch.randint(0, task.output_dim, (chunks, CHUNK), generator=g).to(device))

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        with autocast(device, tcfg.precision):
            loss = task.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        optimizer.step()

    for _ in range(s.warmup_steps):
        step()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(s.steps):
        step()
    synchronize(device)
    return chunks * CHUNK * s.steps / (time.perf_counter() - t0)


@contextlib.contextmanager
def profiled(s: Settings, epoch: int, name: str, device: torch.device):
    """The timed (last) epoch under torch.profiler where ``s.profile`` names a folder: its
    operators by self CPU time and by device time in ``<profile>/<name>.txt`` (the end-to-end
    figure of that row includes the profiler's overhead)."""
    if s.profile is None or epoch != s.epochs:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield
    table = prof.key_averages()
    text = [f"{name}: by self CPU time", table.table(sort_by="self_cpu_time_total", row_limit=30)]
    if device.type == "cuda":
        text += ["by self device time", table.table(sort_by="self_cuda_time_total", row_limit=30)]
    Path(s.profile).mkdir(parents=True, exist_ok=True)
    write_text(Path(s.profile) / f"{name}.txt", "\n".join(text) + "\n")


def measure(exp: Path, s: Settings, chunks: int, precision: str, chunk_data: str,
            inputs: str = "flat") -> dict:
    """One row: model-only and end-to-end frames/s of one batch size, precision, loader and
    input layout."""
    device = s.torch_device()
    cfg = task_config(exp, s, chunks, precision, chunk_data, inputs)
    tcfg = TrainerConfig.from_config(cfg.trainer)
    task = build_task(cfg)
    if task.input_dim != INPUT_DIM:
        raise SystemExit(f"bench/gpu.py: the {inputs} input has {task.input_dim} dims, "
                         f"expected {INPUT_DIM}")
    torch.manual_seed(tcfg.seed)
    model = build_model(cfg.model, task.input_dim, task.output_dim).to(device)
    optimizer = build_optimizer(tcfg, model.parameters())
    only = model_only_fps(task, model, optimizer, tcfg, chunks, s, device)
    backend = SingleProcessBackend(device=device)
    backend.setup(model, optimizer)
    run = _Run(cfg, tcfg, backend, task, model, optimizer, torch.Generator().manual_seed(1),
               exp / "model")
    per_epoch = task.steps_per_epoch(1)
    schedule = LRSchedule.from_config(tcfg, task.samples_per_epoch)
    for epoch in range(1, s.epochs + 1):
        with profiled(s, epoch, f"{chunks}_{precision}_{chunk_data}_{inputs}", device):
            figures = _train_epoch(run, epoch, (epoch - 1) * per_epoch, per_epoch, schedule)
    e2e = figures.frames / figures.seconds
    row = {"device": device_name(device), "chunks": chunks, "precision": precision,
           "chunk_data": chunk_data, "inputs": inputs,
           "model_only_fps": round(only), "end_to_end_fps": round(e2e),
           "end_to_end_share": round(e2e / only, 3), "end_to_end_steps": figures.steps,
           "epoch_chunks": task.samples_per_epoch,
           "parameters": sum(p.numel() for p in model.parameters())}
    print(f"{row['device']}: {chunks} chunks {precision} ({chunk_data}, {inputs}): model only "
          f"{only:,.0f} frames/s, end to end {e2e:,.0f} frames/s ({e2e / only:.0%}) over "
          f"{figures.steps} steps", flush=True)
    return row


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} thread(s), {os.cpu_count()} cores)"


# ------------------------------------------------------------------ gossip exchange
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _exchange(rank: int, port: int, params: int, rounds: int, out: str) -> None:
    """One of two gloo processes: swap a flat fp32 vector with the other ``rounds`` times."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    mine, theirs = torch.randn(params), torch.empty(params)
    peer = 1 - rank
    seconds = []
    for i in range(rounds + 1):  # the first one sets up the connection
        dist.barrier()
        t0 = time.perf_counter()
        for work in (dist.isend(mine, peer), dist.irecv(theirs, peer)):
            work.wait()
        if i:
            seconds.append(time.perf_counter() - t0)
    if rank == 0:
        write_text(out, json.dumps(seconds))
    dist.destroy_process_group()


def gossip_exchange(params: int, rounds: int, device: torch.device) -> dict:
    """Seconds and MB/s of one pairwise exchange of ``params`` fp32 values between two gloo
    processes (started with spawn: safe after CUDA was used), the median of ``rounds``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "seconds.json")
        mp.start_processes(_exchange, args=(_free_port(), params, rounds, out), nprocs=2,
                           start_method="spawn")
        seconds = sorted(json.loads(Path(out).read_text()))
    median = seconds[len(seconds) // 2]
    mb = params * 4 / 1e6
    result = {"parameters": params, "megabytes": round(mb, 1), "rounds": rounds,
              "exchange_s": round(median, 4), "megabytes_per_s": round(mb / median, 1)}
    if device.type == "cuda":
        result["device_host_copies_s"] = round(device_copies(params, device), 4)
    print(f"gossip: {mb:.1f} MB exchanged in {median:.3f} s ({mb / median:,.0f} MB/s)"
          + (f", device<->host copies {result['device_host_copies_s']:.4f} s"
             if "device_host_copies_s" in result else ""), flush=True)
    return result


def device_copies(params: int, device: torch.device, rounds: int = 5) -> float:
    """Seconds to copy the vector to pinned host memory and back (what gossip adds on GPUs)."""
    x = torch.randn(params, device=device)
    host = torch.empty(params, pin_memory=True)
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(rounds):
        host.copy_(x, non_blocking=True)
        x.copy_(host, non_blocking=True)
    synchronize(device)
    return (time.perf_counter() - t0) / rounds


# ------------------------------------------------------------------ results
def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, precision in enumerate(dict.fromkeys(r["precision"] for r in rows)):
        mine = [r for r in rows if r["precision"] == precision]
        def loader(r: dict) -> str:
            return f"{r['chunk_data']}, {r.get('inputs', 'flat')}"

        first = [r for r in mine if loader(r) == loader(mine[0])]
        ax.plot([r["chunks"] for r in first], [r["model_only_fps"] for r in first], "o--",
                color=f"C{i}", label=f"model only, {precision}")
        for data, style in zip(dict.fromkeys(map(loader, mine)), ("s-", "^:", "v-.", "d-"),
                               strict=False):
            theirs = [r for r in mine if loader(r) == data]
            ax.plot([r["chunks"] for r in theirs], [r["end_to_end_fps"] for r in theirs], style,
                    color=f"C{i}", label=f"end to end ({data}), {precision}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks per step (per learner)")
    ax.set_ylabel("frames/s per learner")
    ax.set_title(f"hybrid BLSTM, {rows[0]['device']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_open(png, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def supported_precisions(precisions: list[str], device: torch.device
                         ) -> tuple[list[str], dict[str, str]]:
    """The precisions of ``precisions`` the model trains in on ``device``, and why each other
    one is left out (printed too).

    Raises:
        SystemExit: none is left to measure.
    """
    left_out = {p: why for p in precisions if (why := precision_refusal(p, device)) is not None}
    for p, why in left_out.items():
        print(f"precision {p} left out: {why}", flush=True)
    kept = [p for p in precisions if p not in left_out]
    if not kept:
        raise SystemExit(f"bench/gpu.py: no precision to measure: {'; '.join(left_out.values())}")
    return kept, left_out


def run(s: Settings, out: Path) -> dict:
    """Every measurement of ``s``; writes ``out/gpu.json`` and ``out/gpu.png``."""
    device = s.torch_device()
    if device.type == "cpu":
        torch.set_num_threads(1)  # as a CPU learner trains (trainer.threads=0)
    logging.basicConfig(level=logging.WARNING)
    precisions, left_out = supported_precisions(s.precisions, device)
    rows: list[dict] = []

    def save(gossip: dict | None) -> dict:
        """gpu.json with the rows so far (``complete`` once the gossip is measured too): a run
        cut short by a time limit keeps what it measured."""
        result = {"rows": rows, "precisions_left_out": left_out, "gossip": gossip,
                  "complete": gossip is not None, "settings": asdict(s),
                  "torch": torch.__version__}
        if device.type == "cuda":
            result["cuda"] = torch.version.cuda
            result["cudnn"] = torch.backends.cudnn.version()
        write_text(out / "gpu.json", json.dumps(result, indent=1) + "\n")
        return result

    for inputs in s.inputs:
        with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
            exp = write_task(Path(tmp) / "exp", s, inputs)
            for data in s.chunk_data:
                for precision in precisions:
                    for chunks in s.chunks:
                        rows.append(measure(exp, s, chunks, precision, data, inputs))
                        save(None)
    result = save(gossip_exchange(s.gossip_params or rows[0]["parameters"], s.gossip_rounds,
                                  device))
    plot(rows, out / "gpu.png")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="CPU, small model, small batches (the test's run)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--pdfs", type=int)
    ap.add_argument("--chunks", type=int, nargs="+")
    ap.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"])
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--chunk-data", nargs="+", choices=["resident", "stream"],
                    help="the trainer's chunk loaders to time end to end")
    ap.add_argument("--inputs", nargs="+", choices=INPUTS,
                    help="input layouts: one 260-dim ark (flat), or the recipe's fbank | fMLLR "
                         "| i-vector tables (ibm260)")
    ap.add_argument("--warmup-steps", type=int, help="model-only steps before timing")
    ap.add_argument("--steps", type=int, help="timed model-only steps")
    ap.add_argument("--end-to-end-steps", type=int, help="steps of the largest batch an epoch")
    ap.add_argument("--epochs", type=int, help="end-to-end epochs; the last is timed")
    ap.add_argument("--gossip-params", type=int, help="0: the model's parameters")
    ap.add_argument("--profile", help="a folder: each row's timed epoch under "
                    "torch.profiler, its operators' table in <folder>/<row>.txt")
    args = ap.parse_args()
    s = Settings.quick() if args.quick else Settings()
    for key in ("model", "pdfs", "chunks", "precisions", "device", "warmup_steps", "steps",
                "end_to_end_steps", "epochs", "chunk_data", "gossip_params", "inputs", "profile"):
        if getattr(args, key) is not None:
            setattr(s, key, getattr(args, key))
    run(s, args.out)


if __name__ == "__main__":
    main()
