"""The registry of acoustic models: ``model.arch`` names a registered builder.

A model is one builder function registered under its arch name with :func:`register_model`::

    @register_model("gru")
    def build_gru(cfg: Mapping, input_dim: int, output_dim: int, head: str) -> nn.Module:
        return MyGRU(input_dim, output_dim, hidden=int(cfg["hidden"]))

**Its options**: an arch may declare a frozen dataclass of its own keys,
``@register_model("gru", config=GruConfig)``: the section is then read by
:func:`asrtrain.settings.read` (:func:`model_settings`), so a typo (``model.hiden=512``) is refused
in one line naming the key and the valid ones, in the training stages' checks before anything
runs, and the builder gets the dataclass instead of the mapping (the keys every model has,
:class:`asrtrain.models.config.ModelConfig`, are read for every arch; a dataclass may list one it
uses too, as ``blstm``'s ``stack_frames``). An arch registered without one gets the section as a
plain mapping, its own keys unchecked.

The built-in arch is ``blstm`` (:mod:`asrtrain.models.blstm`, IBM's BLSTM: the CTC model and the
hybrid model), the default when a ``model`` section has no ``arch``. A model defined elsewhere (a
recipe's own module, a test) is registered by importing its module: ``model.module`` names it (a
dotted module name on the Python path, or a list of them), and :func:`build_model` imports it
before it looks the arch up, in every process that builds the model: the stage's checks, each
learner of a multi-learner run, the decoders and ``asrtrain transcribe`` (the checkpoint keeps
``model.module``). Nothing else lists models: training, the training stages' checks and
:meth:`asrtrain.models.checkpoint.ModelCheckpoint.build` all ask here.

**The builder** is called as ``builder(cfg, input_dim, output_dim, head)``: ``cfg`` its options'
dataclass, or without one the model's config section as plain data (``model``, or
``hybrid.model``: ``name``, ``arch``, ``head`` and the builder's own keys; a hybrid model's also
``alignments``, which it ignores), ``input_dim``
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

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from asrtrain import AsrtrainError
from asrtrain.models.config import DEFAULT_ARCH, HEADS, BlstmConfig, ModelConfig
from asrtrain.registry import claim
from asrtrain.settings import read

__all__ = ["BUILTIN", "BUILTIN_CONFIGS", "DEFAULT_ARCH", "HEADS", "ModelSettings", "arch_of",
           "build_model", "check_model_config", "common_settings", "model_builder",
           "model_names", "model_settings", "register_model"]

#: The built-in archs and the module that registers each (imported on first use).
BUILTIN = {"blstm": "asrtrain.models.blstm"}
#: The options' dataclass each built-in arch registers with (known without importing its
#: module, and torch, so a plan checks the section; tests/test_model_registry.py checks they
#: are the ones registered).
BUILTIN_CONFIGS: dict[str, type] = {"blstm": BlstmConfig}

Builder = Callable[[Any, int, int, str], Any]

_REGISTRY: dict[str, Builder] = {}
_CONFIGS: dict[str, type] = {}


def register_model(name: str, builder: Builder | None = None, config: type | None = None):
    """Make ``builder`` the model ``model.arch=<name>`` selects; a decorator when ``builder``
    is left out. ``config``: the frozen dataclass of the arch's own options (the builder then
    gets one, read from the section by :func:`asrtrain.settings.read`); without it the builder
    gets the section as a plain mapping. Registering another function under a taken name is an
    error."""
    if not isinstance(name, str) or not name.isidentifier():
        raise AsrtrainError(f"model arch name {name!r} is not an identifier")
    if config is not None and not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise AsrtrainError(f"model arch {name!r}: config={config!r} is not a dataclass")

    def register(fn: Builder) -> Builder:
        fn = claim(_REGISTRY, name, fn, f"model arch {name!r}")
        if config is None:
            _CONFIGS.pop(name, None)
        else:
            _CONFIGS[name] = config
        return fn
    return register if builder is None else register(builder)


def model_names() -> tuple[str, ...]:
    """Every arch registered so far and the built-in ones, sorted."""
    return tuple(sorted(set(BUILTIN) | set(_REGISTRY)))


def arch_of(cfg: Mapping[str, Any]) -> str:
    """The arch a model section selects (:data:`DEFAULT_ARCH` when it names none)."""
    arch = cfg.get("arch")
    return DEFAULT_ARCH if arch is None else arch


def common_settings(cfg: Mapping[str, Any], where: str = "model") -> ModelConfig:
    """The keys every model section has (:class:`ModelConfig`), checked; the arch's own keys
    are not looked at (:func:`model_settings` reads them)."""
    cfg = _plain(cfg)
    arch = cfg.get("arch")
    if arch is not None and not isinstance(arch, str):
        raise AsrtrainError(f"{where}.arch={arch!r}: expected the name of a model, one of "
                            f"{', '.join(model_names())}")
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    return read(ModelConfig, {k: v for k, v in cfg.items() if k in names}, where)


def import_modules(common: ModelConfig, where: str = "model") -> None:
    """Import the modules of ``model.module`` (which register their models)."""
    for name in common.module:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise AsrtrainError(f"{where}.module={name!r}: cannot import it ({type(e).__name__}: "
                                f"{e}); it must be on the Python path (PYTHONPATH) of every "
                                "process that builds the model") from e


def _builder(common: ModelConfig, where: str) -> Builder:
    """The builder of ``common.arch``, once ``common.module`` is imported.

    Raises:
        AsrtrainError: one line naming ``<where>.arch`` and the registered archs.
    """
    import_modules(common, where)
    arch = common.arch
    if arch not in _REGISTRY and arch in BUILTIN:
        importlib.import_module(BUILTIN[arch])
    if arch not in _REGISTRY:
        hint = ("" if common.module else
                f" (a model defined outside asrtrain: {where}.module names the module that "
                "registers it)")
        raise AsrtrainError(f"{where}.arch={arch!r}: not a registered model; registered: "
                            f"{', '.join(model_names())}{hint}")
    return _REGISTRY[arch]


def model_builder(cfg: Mapping[str, Any], where: str = "model") -> Builder:
    """The builder ``cfg`` (a model section) selects, once ``cfg.module`` is imported."""
    return _builder(common_settings(cfg, where), where)


@dataclass(frozen=True)
class ModelSettings:
    """A model section read: the keys every model has, and the arch's own options (its
    dataclass, or without one the whole section as a plain mapping, as the builder gets it)."""

    common: ModelConfig
    options: Any


def model_settings(cfg: Mapping[str, Any], where: str = "model",
                   build: bool = True) -> ModelSettings:
    """The model section ``cfg`` (``model``, ``hybrid.model``, a checkpoint's
    ``model_config``) read: :class:`ModelConfig`'s keys, then the arch's own by its dataclass
    (:func:`register_model`'s ``config``). ``build=False``: a built-in arch is read without
    importing its module (and torch), as a plan does.

    Raises:
        AsrtrainError: one line naming ``<where>.<key>``: an unknown key (with the known ones:
            the arch's and the common ones), a value of the wrong type, an unknown arch or
            module.
    """
    cfg = _plain(cfg)
    common = common_settings(cfg, where)
    if not build and common.arch in BUILTIN_CONFIGS and not common.module:
        config = BUILTIN_CONFIGS[common.arch]
    else:
        _builder(common, where)
        config = _CONFIGS.get(common.arch)
    if config is None:
        return ModelSettings(common, cfg)
    own = {f.name for f in dataclasses.fields(config)}
    shared = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in cfg:
        if key not in own | shared:
            raise AsrtrainError(f"{where}.{key}: unknown setting; known: "
                                f"{', '.join(sorted(own | shared))}")
    return ModelSettings(common, read(config, {k: v for k, v in cfg.items() if k in own}, where))


def check_model_config(cfg: Mapping[str, Any], where: str = "model") -> None:
    """What a training stage checks before anything runs: the common keys (head, module...),
    the arch, and the arch's own keys when it declares their dataclass (a built-in arch without
    importing its module and torch: a plan)."""
    model_settings(cfg, where, build=False)


def build_model(cfg: Mapping[str, Any], input_dim: int, output_dim: int,
                where: str = "model"):
    """The model of ``cfg`` (a model config section, or a checkpoint's ``model_config``) for
    ``input_dim`` inputs and ``output_dim`` outputs, built by its arch's builder and checked
    against the interface's ``stack_frames`` (see the module docstring)."""
    import torch

    settings = model_settings(cfg, where)
    common = settings.common
    model = _REGISTRY[common.arch](settings.options, int(input_dim), int(output_dim),
                                   common.head)
    arch = common.arch
    if not isinstance(model, torch.nn.Module):
        raise AsrtrainError(f"{where}.arch={arch!r}: its builder returned a "
                            f"{type(model).__name__}, not a torch.nn.Module")
    stack = getattr(model, "stack_frames", None)
    want = common.stack_frames
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
