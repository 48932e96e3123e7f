"""The tiny recipe, small: the override sets of ``recipes/tiny/small.yaml``, which the test
suite and ``bench/`` read, so that their experiments share digests (one place, not copies)."""

from __future__ import annotations

from pathlib import Path

import yaml

SMALL_YAML = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "small.yaml"


def _sets(path: Path = SMALL_YAML) -> dict[str, list[str]]:
    try:
        sets = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"{path}: cannot read the small override sets: {e}") from None
    if not isinstance(sets, dict) or not all(
            isinstance(v, list) and all(isinstance(o, str) for o in v) for v in sets.values()):
        raise SystemExit(f"{path}: each entry must be a list of overrides or set names")
    return sets


def overrides(*names: str, path: Path = SMALL_YAML) -> list[str]:
    """The overrides of the named sets, in order, each set's references expanded in place."""
    sets = _sets(path)

    def expand(name: str, seen: tuple[str, ...]) -> list[str]:
        if name not in sets:
            raise SystemExit(f"{path}: no set {name!r} (sets: {', '.join(sets)})")
        if name in seen:
            raise SystemExit(f"{path}: set {name!r} includes itself ({' -> '.join(seen)})")
        out = []
        for item in sets[name]:
            if item in sets:
                out += expand(item, (*seen, name))
            elif "=" in item or item.startswith("~"):
                out.append(item)
            else:
                raise SystemExit(f"{path}: set {name!r}: {item!r} is neither an override "
                                 "(key=value, ~key) nor a set's name")
        return out

    return [o for name in names for o in expand(name, ())]
