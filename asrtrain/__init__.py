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


#: ``extra=`` of a log record meant for the stage log only (library chatter, per-iteration
#: details): the console handler of ``asrtrain.cli`` drops such records, file handlers keep them.
STAGE_LOG_ONLY = {"stage_log_only": True}


class AsrtrainError(Exception):
    """An error for the user: the message names the file, line, utterance or rank at fault."""

    #: The command's exit status when this error ends it.
    exit_code = 1


class Interrupted(AsrtrainError):
    """The run was stopped by a signal (Ctrl-C, SIGTERM); what it finished is kept."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum  # as a shell reports a process ended by the signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the run unwinds the same way (``asrtrain.cli``)."""

    signum = 15


def interrupt_signal(error: BaseException) -> int | None:
    """The signal number if ``error`` means the process was asked to stop, else None.

    Ctrl-C is a KeyboardInterrupt; torchrun's launcher turns SIGTERM and SIGINT into its own
    ``SignalException`` (it installs handlers while learners run and leaves them installed).
    """
    import signal

    if isinstance(error, KeyboardInterrupt):
        return int(getattr(error, "signum", signal.SIGINT))
    if type(error).__name__ == "SignalException":
        return int(getattr(error, "sigval", signal.SIGTERM))
    return None
