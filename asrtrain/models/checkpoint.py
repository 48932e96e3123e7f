"""What a model checkpoint holds, and the one way to turn one back into a model.

A model checkpoint (``train_dir/epoch-N.pt``, ``final.pt``) is a plain dict written with
``torch.save`` (so every reader, old or new, sees the same keys); :class:`ModelCheckpoint` is its
schema.  The trainer builds one per epoch (``ModelCheckpoint(...).to_dict()``); the decoders read
them with :func:`load_model`, which checks the keys and names the file in every error.  See
``docs/architecture.md``, "Data flow: features and checkpoints".

Every file :func:`save` writes gets a sha256 sidecar (:mod:`asrtrain.models.checksum`) that
:func:`load` compares before unpickling, and a model's weights must be finite: a checkpoint cut
short or altered after it was written is an error naming the file, not a NaN loss at step one.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asrtrain import AsrtrainError
from asrtrain.fileio import atomic_open
from asrtrain.models import checksum
from asrtrain.models.registry import DEFAULT_ARCH, arch_of, build_model

#: Keys every model checkpoint has.
REQUIRED = ("model", "model_config", "input_dim", "output_dim", "features")


class _Hashing:
    """A writable file that hashes what goes through it (``torch.save`` writes in order)."""

    def __init__(self, f) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.error: OSError | None = None

    def write(self, data) -> int:
        self.sha.update(data)
        try:
            return self.f.write(data)
        except OSError as e:  # torch's writer turns it into "unexpected pos": keep it
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through a temporary name (synced), so a crash never leaves a torn
    checkpoint, and the sha256 of its bytes beside it (recorded before the rename: a file under
    its real name always has its checksum).

    Raises:
        OSError: writing failed (a full disk: ``ENOSPC``), naming ``path``; not torch's
            ``[enforce fail at inline_container.cc] unexpected pos``, which says neither.
    """
    with atomic_open(path, "wb") as f:
        out = _Hashing(f)
        try:
            torch.save(obj, out)
        except RuntimeError as e:
            if out.error is None:
                raise
            raise OSError(out.error.errno, out.error.strerror, str(path)) from e
        checksum.write_sidecar(path, out.sha.hexdigest())


def load(path: str | Path) -> dict:
    """The dict saved at ``path`` (on the CPU), after checking it against its sha256.

    Raises:
        AsrtrainError: the file is missing, differs from its recorded checksum, or cannot be
            unpickled (one line naming the file).
    """
    path = Path(path)
    try:
        data = path.read_bytes()  # read once: hashed, then unpickled from memory
    except FileNotFoundError:
        data = None
    checksum.verify(path, data)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as e:
        raise AsrtrainError(f"{path}: cannot read the checkpoint ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}); rerun the recipe "
                            "to redo it") from e


def check_finite(state: Mapping[str, Any], where: str | Path) -> None:
    """Raise naming ``where`` and the first weight that holds NaN or inf."""
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                raise AsrtrainError(f"{where}: weight {key!r} holds {bad} NaN or infinite "
                                    f"value(s) of {value.numel()}: the checkpoint is unusable")


@dataclass
class ModelCheckpoint:
    """The contents of a model checkpoint.

    ``model``: the state dict; ``model_config``: the ``model`` config group, what
    :func:`asrtrain.models.registry.build_model` rebuilds the model from: its ``arch`` (always
    recorded: ``blstm`` when the config named none), ``module`` when the arch is registered
    outside asrtrain, ``head`` and the builder's own keys; ``input_dim``/``output_dim``: the
    model's sizes (features after the transform; units or pdfs); ``features``: the ``features``
    config group (``delta_order``,
    ``norm_vars``, ``frame_shift`` in ms: how to read features for this model).  Hybrid models
    (``head: ce``) add ``log_priors`` (log pdf priors from the training alignments, [output_dim])
    and ``chunk`` (the frames per chunk they were trained on).  ``epoch``, ``global_samples`` and
    ``metrics`` say where training was; ``precision`` how (``trainer.precision``: fp32 or bf16;
    the trainer always records it; None in a checkpoint made outside training). The weights are
    fp32 either way.
    """

    model: Mapping[str, torch.Tensor]
    model_config: Mapping[str, Any]
    input_dim: int
    output_dim: int
    features: Mapping[str, Any]
    log_priors: torch.Tensor | None = None
    chunk: int | None = None
    epoch: int | None = None
    global_samples: int | None = None
    metrics: Mapping[str, float] | None = None
    precision: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this schema does not know

    def __post_init__(self) -> None:
        if "arch" not in self.model_config:  # recorded, so the checkpoint names its builder
            self.model_config = {"arch": DEFAULT_ARCH, **self.model_config}

    @property
    def arch(self) -> str:
        """The registered model (``model.arch``) that rebuilds this one."""
        return arch_of(self.model_config)

    @property
    def head(self) -> str:
        """``ctc`` or ``ce`` (frame cross-entropy, a hybrid model)."""
        return str(self.model_config.get("head", "ctc"))

    @property
    def delta_order(self) -> int:
        return int(self.features.get("delta_order", 0))

    @property
    def norm_vars(self) -> bool:
        return bool(self.features.get("norm_vars", False))

    @property
    def frame_shift(self) -> float:
        """Seconds between input frames."""
        return float(self.features.get("frame_shift", 10.0)) / 1000

    def to_dict(self) -> dict[str, Any]:
        """What is saved: the fields by name, those not set left out."""
        out = {"model": self.model, "model_config": self.model_config,
               "input_dim": self.input_dim, "output_dim": self.output_dim,
               "features": self.features}
        for key in ("log_priors", "chunk", "epoch", "global_samples", "metrics", "precision"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str | Path = "<checkpoint>") -> ModelCheckpoint:
        """Check ``d`` (read from ``where``) against the schema: keys and types (whether the
        parts fit together is checked by :meth:`build`)."""
        if not isinstance(d, Mapping):
            raise AsrtrainError(f"{where}: not a model checkpoint (a {type(d).__name__})")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            names = ", ".join(map(repr, missing))
            raise AsrtrainError(f"{where}: not a model checkpoint: no {names} (it has "
                                f"{sorted(d)})")
        known = {*REQUIRED, "log_priors", "chunk", "epoch", "global_samples", "metrics",
                 "precision"}
        try:
            ckpt = cls(d["model"], dict(d["model_config"]), int(d["input_dim"]),
                       int(d["output_dim"]), dict(d["features"]),
                       log_priors=None if d.get("log_priors") is None
                       else torch.as_tensor(d["log_priors"], dtype=torch.float32),
                       chunk=None if d.get("chunk") is None else int(d["chunk"]),
                       epoch=d.get("epoch"), global_samples=d.get("global_samples"),
                       metrics=d.get("metrics"),
                       precision=None if d.get("precision") is None else str(d["precision"]),
                       extra={k: v for k, v in d.items() if k not in known})
        except (TypeError, ValueError) as e:
            raise AsrtrainError(f"{where}: a checkpoint key has the wrong type: {e}") from e
        if ckpt.input_dim < 1 or ckpt.output_dim < 1:
            raise AsrtrainError(f"{where}: input_dim {ckpt.input_dim}, output_dim "
                                f"{ckpt.output_dim}: expected positive sizes")
        if isinstance(ckpt.model, Mapping):
            check_finite(ckpt.model, where)
        return ckpt

    @classmethod
    def load(cls, path: str | Path, head: str | None = None) -> ModelCheckpoint:
        """The checkpoint at ``path``, checked; ``head`` (``ctc`` or ``ce``): the kind of model
        the caller wants (a hybrid ``ce`` checkpoint must hold ``log_priors``)."""
        ckpt = cls.from_dict(load(path), path)
        if head is not None and ckpt.head != head:
            raise AsrtrainError(f"{path}: a model.head={ckpt.head} model, expected "
                                f"model.head={head}")
        if ckpt.head == "ce" and ckpt.log_priors is None:
            raise AsrtrainError(f"{path}: no 'log_priors' in the checkpoint; a hybrid model is "
                                "trained with model.head=ce")
        return ckpt

    def save(self, path: str | Path) -> None:
        save(self.to_dict(), path)

    def build(self, device: str | torch.device = "cpu", where: str | Path = "<checkpoint>"
              ) -> torch.nn.Module:
        """The model with its weights, rebuilt by its arch's builder (the registry imports the
        ``module`` it records first), on ``device``, in eval mode; the parts of the checkpoint
        must fit together (state, sizes, priors). An arch not registered is an error naming
        ``where`` and the registered ones."""
        if self.log_priors is not None and self.log_priors.shape != (self.output_dim,):
            raise AsrtrainError(f"{where}: log_priors has shape {tuple(self.log_priors.shape)}, "
                                f"expected [{self.output_dim}]")
        try:
            model = build_model(self.model_config, self.input_dim, self.output_dim,
                                where=f"{where}: model")
        except AsrtrainError:
            raise
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise AsrtrainError(f"{where}: cannot rebuild the model.arch={self.arch} model "
                                f"from its model_config ({type(e).__name__}: {e})") from e
        try:
            model.load_state_dict(self.model)
        except (KeyError, ValueError, RuntimeError) as e:
            raise AsrtrainError(f"{where}: the model state does not fit its model_config "
                                f"({e})") from e
        return model.to(torch.device(device)).eval()


def load_model(path: str | Path, device: str | torch.device = "cpu",
               head: str | None = None) -> tuple[torch.nn.Module, ModelCheckpoint]:
    """The model saved at ``path`` (on ``device``, in eval mode) and its checkpoint
    (:meth:`ModelCheckpoint.load` checks it; ``head`` as there)."""
    ckpt = ModelCheckpoint.load(path, head)
    return ckpt.build(device, path), ckpt
