"""The ``model`` section (``hybrid.model`` too), read by :func:`asrtrain.settings.read`:
:class:`ModelConfig` holds the keys every model has, whatever its arch; an arch registered with
a dataclass of its own options (:func:`asrtrain.models.registry.register_model`'s ``config``)
has the rest read by it, as :class:`BlstmConfig` for the built-in ``blstm``. Their defaults are
those of ``conf/model/blstm_ibm.yaml`` (the tests compare them). Neither torch nor the models
are imported here, so a recipe's model section is checked in a plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asrtrain.settings import bad, choice, integer, number, opt, optional, text

#: ``model.arch`` when a model section has none.
DEFAULT_ARCH = "blstm"
#: The heads a model may have: CTC over units, or frame cross-entropy over pdfs (hybrid).
HEADS = ("ctc", "ce")


def _arch(key: str, value: Any) -> str:
    """An arch name (None: :data:`DEFAULT_ARCH`); whether it is registered is the registry's
    question, asked once ``model.module`` is imported."""
    if value is None:
        return DEFAULT_ARCH
    if not isinstance(value, str):   # the registry's common_settings names the registered
        raise bad(key, value, "the name of a registered model")
    return value


def _modules(key: str, value: Any) -> tuple[str, ...]:
    """``model.module``: none, a dotted module name, or a list of them."""
    if value is None:
        return ()
    modules = [value] if isinstance(value, str) else value
    if not isinstance(modules, list | tuple) or not all(
            isinstance(m, str) and m and all(p.isidentifier() for p in m.split("."))
            for m in modules):
        raise bad(key, value, "a module name (a.b.c) or a list of them")
    return tuple(modules)


@dataclass(frozen=True)
class ModelConfig:
    """The keys of every model section (``model``, ``hybrid.model``), whatever its arch."""

    name: str | None = opt(None, optional(text))   # the model's dir: exp/models/<name>
    arch: str = opt(DEFAULT_ARCH, _arch)           # a registered model (docs: "Models")
    head: str = opt("ctc", choice(*HEADS))         # ctc | ce (frame cross-entropy, hybrid)
    module: tuple[str, ...] = opt((), _modules)    # modules that register archs of their own
    stack_frames: int = opt(1, integer(1))         # input frames per output frame
    alignments: dict | None = None                 # hybrid: {train, dev} pdf alignment dirs
    #                                                (train_hybrid gives them, not the YAML)


@dataclass(frozen=True)
class BlstmConfig:
    """``model.arch=blstm``'s own options: IBM's BLSTM (Zhang et al., ICASSP 2019), 6 layers of
    512 cells per direction, a 256-dim linear bottleneck (0: none)."""

    layers: int = opt(6, integer(1))
    cells: int = opt(512, integer(1))
    bottleneck: int = opt(256, integer(0))
    dropout: float = opt(0.0, number(0.0, 1.0))    # on every layer's outputs but the last
    stack_frames: int = opt(1, integer(1))         # as ModelConfig's (the same key, read twice)
