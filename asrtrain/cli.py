"""The `asrtrain` command: run a recipe, be a learner under torchrun, score, show topologies."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import click

from asrtrain import AsrtrainError, Interrupted, Terminated, __version__, interrupt_signal
from asrtrain.logs import setup_logging


def _sigterm(signum: int, frame) -> None:
    raise Terminated  # unwinds like Ctrl-C: temporaries removed, finished work kept


class _Group(click.Group):
    """Turns AsrtrainError into a one-line message and its exit status (1, or 128 + the signal
    for an interrupted run), without a traceback; SIGTERM is handled like Ctrl-C."""

    def invoke(self, ctx: click.Context):
        signal.signal(signal.SIGTERM, _sigterm)
        try:
            return super().invoke(ctx)
        except BaseException as e:
            code = _report(e)
            if code is None:
                raise
            sys.exit(code)


def _report(error: BaseException) -> int | None:
    """Say ``error`` in one line on stderr and return the exit status it means, or None for an
    error that is not ours to put in one line (its traceback is the message)."""
    if isinstance(error, SystemExit):
        return None
    if isinstance(error, Interrupted):
        click.echo(f"asrtrain: {error}", err=True)
        return error.exit_code
    if isinstance(error, AsrtrainError):
        click.echo(f"asrtrain: error: {error}", err=True)
        return error.exit_code
    signum = interrupt_signal(error)
    if signum is None:
        return None
    click.echo(f"asrtrain: interrupted by {signal.Signals(signum).name}: what finished "
               "is kept; run the same command to resume", err=True)
    return 128 + signum


def _exit_now(code: int) -> None:
    """End this process with ``code`` at once, after flushing its output and logs.

    A learner that fails may leave threads inside C++ calls (its gossip thread in a gloo
    receive, its heartbeat in a store call). The interpreter's exit ends such daemon threads by
    ``pthread_exit`` as they take the GIL back, and that unwinds through C++ frames that may
    not unwind: ``terminate called without an active exception`` and SIGABRT, after the one
    clear line. ``os._exit`` skips that finalization; what the learner wrote is already on disk
    (checkpoints are written to a temporary name and renamed)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
            pass
    logging.shutdown()
    os._exit(code)


@click.group(cls=_Group)
@click.version_option(__version__)
def main() -> None:
    """asrtrain: Kaldi-style speech recognition recipes with synchronous (SSGD) and
    decentralized (AD-PSGD, H-AD-PSGD) distributed training."""


class _RunCommand(click.Command):
    """``asrtrain run --help`` ends with the stages, in order, and what each makes."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from asrtrain.stages import STAGES

        with formatter.section("Stages, in order (a recipe's `stages:` lists those it runs)"):
            formatter.write_dl([(name, stage.doc) for name, stage in STAGES.items()])


@main.command(cls=_RunCommand, context_settings={"ignore_unknown_options": True})
@click.argument("recipe", type=click.Path(exists=True, file_okay=False))
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--stage", "start", default=None, help="First stage to run (default: the first).")
@click.option("--to", "stop", default=None, help="Last stage to run (default: the last).")
@click.option("--force", "force", multiple=True, is_flag=False, flag_value="all",
              metavar="[STAGE]", help="Rerun STAGE (repeat or use commas for more) and every "
              "stage that reads it, inner steps included; alone: every stage from --stage to --to.")
@click.option("-n", "--dry-run", is_flag=True,
              help="Print which stages would run and why (what changed), and run nothing.")
@click.option("--show-config", is_flag=True, help="Print the composed config and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def run(recipe: str, overrides: tuple[str, ...], start: str | None, stop: str | None,
        force: tuple[str, ...], dry_run: bool, show_config: bool, verbose: bool) -> None:
    """Run the stages of RECIPE (a directory with recipe.yaml), e.g. `asrtrain run recipes/tiny`.

    OVERRIDES are Hydra overrides, e.g. `trainer.backend=adpsgd trainer.learners=4 model=blstm_ibm`.
    A stage reruns when a config key it depends on changed, when a stage it reads reruns, or when
    --force names it; every other stage is skipped (see --dry-run).
    """
    if not (dry_run or show_config):
        # torch first (every stage imports it; the import starts no thread), then the fork
        # server while this process is clean: before logging, stages, threads. It shares the
        # import, and imports the rest of what learners need only if one is asked for.
        import torch  # noqa: F401

        from asrtrain.distributed.warm import start_fork_server

        start_fork_server()
    from omegaconf import OmegaConf

    from asrtrain.distributed.nodes import node_rank, run_node
    from asrtrain.pipeline import run_recipe
    from asrtrain.recipe import compose_recipe
    from asrtrain.relocate import record_location, relocate
    from asrtrain.report import print_summary
    from asrtrain.stages import STAGES

    setup_logging(verbose)
    cfg = compose_recipe(recipe, overrides)
    if show_config:
        click.echo(OmegaConf.to_yaml(cfg, resolve=True))
        return
    names = [n for f in force for n in f.split(",") if n]
    forced = True if "all" in names else set(names)
    if node_rank(cfg):  # node k > 0 of a multi-node run: only its learners (node 0 runs the rest)
        run_node(cfg, STAGES, start, stop, forced, dry_run)
        return
    # a moved or copied exp dir: its records are made to name where it is now
    relocate(cfg.exp_dir, dry_run)
    try:
        run_recipe(cfg, STAGES, start, stop, forced, dry_run)
    finally:
        if not dry_run and Path(cfg.exp_dir, ".done").is_dir():
            record_location(cfg.exp_dir)
    print_summary(cfg, dry_run)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def train(config: str, verbose: bool) -> None:
    """Be one learner of a training run (the train stage starts these under torchrun).

    CONFIG is the resolved config.yaml the train stage writes in its output directory.
    """
    import os

    from asrtrain.distributed.liveness import record_error
    from asrtrain.train.worker import run_learner

    setup_logging(verbose)
    try:
        run_learner(config)
    except BaseException as e:
        record_error(e)
        if isinstance(e, AsrtrainError) and os.environ.get("TORCHELASTIC_ERROR_FILE"):
            _exit_now(e.exit_code)  # its line is the launcher's to quote, once for all learners
        code = _report(e)
        if code is None:
            if isinstance(e, SystemExit):
                raise
            import traceback

            traceback.print_exc()
            code = 1
        _exit_now(code)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        # A learner that finished ends as one that failed does (_exit_now): its work is on disk
        # and its logs are flushed, and no interpreter finalization can abort it after the fact
        # (test_simulate's 4-learner CTC run, twice: rank 3 trained both epochs, then SIGABRT,
        # "terminate called without an active exception", and the stage failed)
        _exit_now(0)


def _register() -> None:
    from asrtrain.distributed.topology import topology_command
    from asrtrain.report import report_command
    from asrtrain.score.command import score_command

    main.add_command(report_command, "report")
    main.add_command(score_command, "score")
    main.add_command(topology_command, "topology")
    from asrtrain.simulate.command import simulate_command
    from asrtrain.transcribe import transcribe_command

    main.add_command(simulate_command, "simulate")
    main.add_command(transcribe_command, "transcribe")


_register()

if __name__ == "__main__":
    main()
