"""asrtrain: Kaldi-style speech recognition recipes with decentralized distributed training."""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (the package is installed editable, beside conf/ recipes/ data/).
REPO_ROOT = Path(__file__).resolve().parent.parent


class AsrtrainError(Exception):
    """An error for the user: the message names the file, line, utterance or rank at fault."""
