"""A stage's done record (``exp/.done/<stage>``: JSON with its digest, config values and input
digests; docs/architecture.md, "Records"), read by the pipeline and by what reports on a run
(:mod:`asrtrain.report`), which is below the pipeline (docs/architecture.md, "Layers")."""

from __future__ import annotations

import json
from pathlib import Path


def read_marker(path: Path) -> dict | None:
    """A stage's done record, or None (missing or not a record: the stage runs)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "digest" in record else None
