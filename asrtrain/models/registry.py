"""The registry of acoustic models: ``model.arch`` names a registered builder.

A model is one builder function registered under its arch name with :func:`register_model`::

    @register_model("gru")
    def build_gru(cfg: Mapping, input_dim: int, output_dim: int, head: str) -> nn.Module:
        return MyGRU(input_dim, output_dim, hidden=int(cfg["hidden"]))

The built-in arch is ``blstm`` (:mod:`asrtrain.models.blstm`, IBM's BLSTM: the CTC model and the
hybrid model), the default when a ``model`` section has no ``arch``. A model defined elsewhere (a
recipe's own module, a test) is registered by importing its module: ``model.module`` names it (a
dotted module name on the Python path, or a list of them), and :func:`build_model` imports it
before it looks the arch up, in every process that builds the model: the stage's checks, each
learner of a multi-learner run, the decoders and ``asrtrain transcribe`` (the checkpoint keeps
``model.module``). Nothing else lists models: training, the training stages' checks and
:meth:`asrtrain.models.checkpoint.ModelCheckpoint.build` all ask here.

**The builder** is called as ``builder(cfg, input_dim, output_dim, head)``: ``cfg`` the model's
config section as plain data (``model``, or ``hybrid.model``: ``name``, ``arch``, ``head`` and
the builder's own keys; a hybrid model's also ``alignments``, which it ignores), ``input_dim``
the feature dimension after the features config's deltas and appended streams, ``output_dim``
the CTC units (blank = 0) or the pdfs, ``head`` ``ctc`` or ``ce`` (frame cross-entropy, a hybrid
model). It must give the same model for the same config, the one way to rebuild a checkpoint.

**The model** it returns is an ``nn.Module`` with:

- ``forward(feats, lengths) -> (logits, out_lengths)``: ``feats`` float [batch, frames, dim]
  (padded), ``lengths`` int64 [batch] on the CPU; ``logits`` **float32** [batch, frames',
  output_dim] (under ``trainer.precision=bf16`` the forward runs in autocast; the loss and the
  decoders read fp32 logits), ``out_lengths`` [batch] = ``lengths // stack_frames``, at least 1;
  the frames of an utterance's outputs depend only on its own frames (decoders batch utterances
  of unequal length; hybrid decoding runs fixed-length chunks).
- ``stack_frames``: an int, how many input frames make one output frame; it must equal the
  config's ``stack_frames`` (default 1), which the CTC task reads to drop utterances too short
  for their units and the CTC decoder to time words.
- a ``state_dict`` of tensors that ``load_state_dict`` takes back: checkpoints, checkpoint
  averaging (float entries averaged, others kept), and the distributed backends (which broadcast
  and average the float entries and gossip ``parameters()``) use nothing else. ``train()`` and
  ``eval()`` as any module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from asrtrain import AsrtrainError
from asrtrain.registry import claim

#: The built-in archs and the module that registers each (imported on first use).
BUILTIN = {"blstm": "asrtrain.models.blstm"}
#: ``model.arch`` when a model section has none.
DEFAULT_ARCH = "blstm"
#: The heads a model may have: CTC over units, or frame cross-entropy over pdfs (hybrid).
HEADS = ("ctc", "ce")

Builder = Callable[[Mapping[str, Any], int, int, str], Any]

_REGISTRY: dict[str, Builder] = {}


def register_model(name: str, builder: Builder | None = None):
    """Make ``builder`` the model ``model.arch=<name>`` selects; a decorator when ``builder``
    is left out. Registering another function under a taken name is an error."""
    if not isinstance(name, str) or not name.isidentifier():
        raise AsrtrainError(f"model arch name {name!r} is not an identifier")

    def register(fn: Builder) -> Builder:
        return claim(_REGISTRY, name, fn, f"model arch {name!r}")
    return register if builder is None else register(builder)


def model_names() -> tuple[str, ...]:
    """Every arch registered so far and the built-in ones, sorted."""
    return tuple(sorted(set(BUILTIN) | set(_REGISTRY)))


def arch_of(cfg: Mapping[str, Any]) -> str:
    """The arch a model section selects (:data:`DEFAULT_ARCH` when it names none)."""
    arch = cfg.get("arch")
    return DEFAULT_ARCH if arch is None else arch


def modules_of(cfg: Mapping[str, Any], where: str = "model") -> list[str]:
    """The module names of ``model.module`` (none, one, or a list)."""
    modules = cfg.get("module")
    if modules is None:
        return []
    if isinstance(modules, str):
        modules = [modules]
    if not isinstance(modules, list | tuple) or not all(
            isinstance(m, str) and m and all(p.isidentifier() for p in m.split("."))
            for m in modules):
        raise AsrtrainError(f"{where}.module={modules!r}: expected a module name (a.b.c) or a "
                            "list of them")
    return list(modules)


def import_modules(cfg: Mapping[str, Any], where: str = "model") -> None:
    """Import the modules of ``model.module`` (which register their models)."""
    for name in modules_of(cfg, where):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise AsrtrainError(f"{where}.module={name!r}: cannot import it ({type(e).__name__}: "
                                f"{e}); it must be on the Python path (PYTHONPATH) of every "
                                "process that builds the model") from e


def model_builder(cfg: Mapping[str, Any], where: str = "model") -> Builder:
    """The builder ``cfg`` (a model section) selects, once ``cfg.module`` is imported.

    Raises:
        AsrtrainError: one line naming ``<where>.arch`` and the registered archs.
    """
    import_modules(cfg, where)
    arch = arch_of(cfg)
    if not isinstance(arch, str):
        raise AsrtrainError(f"{where}.arch={arch!r}: expected the name of a model, one of "
                            f"{', '.join(model_names())}")
    if arch not in _REGISTRY and arch in BUILTIN:
        importlib.import_module(BUILTIN[arch])
    if arch not in _REGISTRY:
        hint = ("" if modules_of(cfg, where) else
                f" (a model defined outside asrtrain: {where}.module names the module that "
                "registers it)")
        raise AsrtrainError(f"{where}.arch={arch!r}: not a registered model; registered: "
                            f"{', '.join(model_names())}{hint}")
    return _REGISTRY[arch]


def head_of(cfg: Mapping[str, Any], where: str = "model") -> str:
    head = cfg.get("head", "ctc")
    if head not in HEADS:
        raise AsrtrainError(f"{where}.head={head!r}: expected one of {', '.join(HEADS)}")
    return head


def check_model_config(cfg: Mapping[str, Any], where: str = "model") -> None:
    """What a training stage checks before anything runs: the head, the modules, the arch."""
    cfg = _plain(cfg)
    head_of(cfg, where)
    arch = arch_of(cfg)
    if isinstance(arch, str) and arch in BUILTIN and not modules_of(cfg, where):
        return  # asrtrain's own arch, known without importing its module (and torch): a plan
    model_builder(cfg, where)


def build_model(cfg: Mapping[str, Any], input_dim: int, output_dim: int,
                where: str = "model"):
    """The model of ``cfg`` (a model config section, or a checkpoint's ``model_config``) for
    ``input_dim`` inputs and ``output_dim`` outputs, built by its arch's builder and checked
    against the interface's ``stack_frames`` (see the module docstring)."""
    import torch

    cfg = _plain(cfg)
    head = head_of(cfg, where)
    builder = model_builder(cfg, where)
    model = builder(cfg, int(input_dim), int(output_dim), head)
    arch = arch_of(cfg)
    if not isinstance(model, torch.nn.Module):
        raise AsrtrainError(f"{where}.arch={arch!r}: its builder returned a "
                            f"{type(model).__name__}, not a torch.nn.Module")
    stack = getattr(model, "stack_frames", None)
    want = int(cfg.get("stack_frames", 1))
    if stack != want:
        raise AsrtrainError(f"{where}.arch={arch!r}: the model's stack_frames is {stack!r}, but "
                            f"{where}.stack_frames={want}: a model must set stack_frames to "
                            "the config's (the CTC task and decoder read it there)")
    return model


def _plain(cfg: Any) -> dict[str, Any]:
    """A config section (an omegaconf node or a mapping) as plain data."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(cfg, Mapping):
        raise AsrtrainError(f"a model config must be a mapping, not {type(cfg).__name__}")
    return dict(cfg)
