"""Which ``trainer.precision`` the model's kernels run in on a device, and the autocast the
trainer runs the forward pass and the loss's inputs in.

bf16 is probed, not assumed: once per process and device, :func:`precision_refusal` runs one
tiny training step of a :class:`~asrtrain.models.blstm.BLSTM` (both of the layouts the device
uses, LSTM and linear layers, cross-entropy, backward) under :func:`autocast`. On CPUs torch runs
the bf16 LSTM through oneDNN, which needs AVX-512: on x86 CPUs without it (the AMD EPYCs of this
project) it fails with "could not create a primitive descriptor for the LSTM forward propagation
primitive" (reproduced on AVX-512 CPUs by capping oneDNN with ``ONEDNN_MAX_CPU_ISA=AVX2``;
``AVX512_CORE`` and above run it). The trainer and the train stages' checks refuse such a
precision in one line before any training (:func:`check_precision`); ``bench/gpu.py`` leaves it
out and says why.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re

import torch

from asrtrain import AsrtrainError

#: The environment variables that cap oneDNN's instruction set (named in a refusal when set).
ONEDNN_ISA_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The context the forward pass and the loss run in: bf16 autocast on ``device``'s type
    (cuda or cpu) for ``precision`` bf16, nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe_device(device: torch.device) -> str:
    """``this CPU (<model name>[, ONEDNN_MAX_CPU_ISA=...])`` or the GPU's name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    caps = [f"{k}={os.environ[k]}" for k in ONEDNN_ISA_VARS if os.environ.get(k)]
    return f"this CPU ({', '.join([cpu_name(), *caps])})"


def precision_refusal(precision: str, device: torch.device) -> str | None:
    """Why the model cannot train in ``precision`` on ``device`` (one line naming the device and
    what it lacks), or None when it can. fp32 always can; bf16 is probed once per device."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            return f"{describe_device(device)} does not compute in bfloat16"
    return _bf16_refusal(device)


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a ``trainer.precision`` that ``device`` cannot train in, before any training.

    Raises:
        AsrtrainError: ``trainer.precision=bf16: <device> has no bf16 LSTM kernel (...): use
            trainer.precision=fp32``.
    """
    why = precision_refusal(precision, device)
    if why is not None:
        raise AsrtrainError(f"trainer.precision={precision}: {why}: use trainer.precision=fp32")


@functools.cache
def _bf16_refusal(device: torch.device) -> str | None:
    from asrtrain.models.blstm import BLSTM

    # The probe's weights and inputs must not move the seeded generators of the run.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        try:
            model = BLSTM(5, 3, layers=2, cells=8, bottleneck=4).to(device).train()
            feats = torch.randn(3, 6, 5, device=device)
            targets = torch.randint(0, 3, (18,), device=device)
            # every sequence full (the bidirectional layout), then unequal lengths (padded on
            # CPUs, packed on GPUs): every kernel a training step can meet
            for lengths in (torch.full((3,), 6), torch.tensor([6, 4, 2])):
                with autocast(device, "bf16"):
                    logits, _ = model(feats, lengths)
                    loss = torch.nn.functional.cross_entropy(logits.reshape(18, 3), targets)
                loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except RuntimeError as e:
            return f"{describe_device(device)} has no bf16 LSTM kernel ({_one_line(e, device)})"
    return None


def _one_line(e: RuntimeError, device: torch.device) -> str:
    """The first line of torch's message, without oneDNN's advice to rerun verbosely."""
    lines = str(e).strip().splitlines()
    msg = re.sub(r"\.?\s*Run workload with environment variable .*$", "",
                 lines[0] if lines else "").strip()
    library = ("oneDNN" if device.type == "cpu" and "primitive" in msg
               else type(e).__name__)
    return f"{library}: {msg or 'no message'}"
