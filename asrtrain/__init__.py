"""asrtrain: Kaldi-style speech recognition recipes with decentralized distributed training."""

import os
from pathlib import Path

# OpenMP threads that spin while waiting make a learner 20-100x slower as soon as the cores are
# shared (several learners or jobs on one machine, measured here); passive waiting costs nothing
# when they are not. Must be set before torch loads libgomp, hence here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

#: The repository root (the package is installed editable, beside conf/ recipes/ data/).
REPO_ROOT = Path(__file__).resolve().parent.parent


class AsrtrainError(Exception):
    """An error for the user: the message names the file, line, utterance or rank at fault."""
