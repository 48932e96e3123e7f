"""Registries by name (backends, model archs): one rule for taking a name."""

from __future__ import annotations

from typing import Any, TypeVar

from asrtrain import AsrtrainError

T = TypeVar("T")


def claim(registry: dict[str, Any], name: str, obj: T, what: str) -> T:
    """Put ``obj`` (a class or function) under ``name`` in ``registry``.

    The same definition again (same module and qualified name: a module imported twice, as
    ``__main__`` and by name, or reloaded) takes the name back; another one is an error naming
    both, where ``what`` says what the name is (``"backend 'x'"``, ``"model arch 'x'"``).
    """
    old = registry.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (obj.__module__,
                                                                   obj.__qualname__):
        raise AsrtrainError(f"{what} is registered twice: by {old.__module__}."
                            f"{old.__qualname__} and {obj.__module__}.{obj.__qualname__}")
    registry[name] = obj
    return obj
