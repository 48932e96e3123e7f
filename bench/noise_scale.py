"""The gradient noise scale of a recipe's hybrid task, in chunks (issue 24 item 1).

    python bench/noise_scale.py recipes/tiny exp_dir=EXP [overrides] [--model traj.pt] \
        [--small 8] [--big 256] [--draws 16] --out bench/results/noise_scale.json
    python bench/noise_scale.py --hours 4 [--model traj.pt] ... --out ...

``--hours H`` measures on bench/science.py's scaled corpus of H hours and its experiment dir
(exp/science/corpus-Hh, exp-Hh: made there when missing, with the features and the small GMM
alignments of science.py) with science.py's small hybrid model; the recipe and overrides are then
science.py's.

The simple noise scale of McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch
Training" (2018, arXiv:1812.06162), section 2.2 and appendix A.1: ``B_simple = tr(Sigma) / |G|^2``,
with ``G`` the true gradient and ``Sigma`` the per-sample gradient covariance. It is the batch
size near which the benefit of a larger batch turns from linear (fewer steps for the same
samples) to nothing (the same steps for more samples): the critical batch is of its order.

The estimator is the paper's (A.1): the expected squared norm of a batch-``b`` gradient is
``|G|^2 + tr(Sigma) / b``, so the squared norms at two batch sizes ``b < B`` give unbiased
estimates of both terms,

    |G|^2    ~ (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

each averaged over many batches before the ratio is taken (the ratio of noisy estimates is
biased; the averages are not). Here a draw is ``B / b`` consecutive batches of ``b`` chunks of one
epoch's order (the task's own shuffling, SpecAugment where the trainer has it, the model in
training mode): their gradients give ``|G_b|^2`` (the mean of their squared norms) and their mean
gives ``|G_B|^2``, with the same samples. Draw ``d`` uses epoch ``d``'s order. The spread is a
jackknife over the draws.

The model is the recipe's initial model (``trainer.seed``), or ``--model``: a state dict, such as
the consensus model ``asrtrain simulate`` writes beside its trajectory.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class NoiseScale:
    """The estimates from the mean squared gradient norms at batches ``small`` and ``big``."""

    small: int
    big: int
    small_sq: float      # mean |G_small|^2
    big_sq: float        # mean |G_big|^2
    grad_sq: float       # |G|^2
    trace: float         # tr(Sigma)
    b_simple: float      # tr(Sigma) / |G|^2; inf where |G|^2 is estimated at or below 0


def estimate(small_sq: float, big_sq: float, small: int, big: int) -> NoiseScale:
    """The paper's unbiased estimates from the mean squared norms of batch-``small`` and
    batch-``big`` gradients (appendix A.1)."""
    if not 0 < small < big:
        raise ValueError(f"need 0 < small < big, got {small} and {big}")
    grad_sq = (big * big_sq - small * small_sq) / (big - small)
    trace = (small_sq - big_sq) / (1 / small - 1 / big)
    b_simple = trace / grad_sq if grad_sq > 0 else math.inf
    return NoiseScale(small, big, small_sq, big_sq, grad_sq, trace, b_simple)


def jackknife(small_sqs: list[float], big_sqs: list[float], small: int, big: int) -> float:
    """The jackknife standard error of ``B_simple`` over the draws (nan with fewer than 2)."""
    n = len(small_sqs)
    if n < 2:
        return math.nan
    s_tot, b_tot = sum(small_sqs), sum(big_sqs)
    loo = [estimate((s_tot - s) / (n - 1), (b_tot - b) / (n - 1), small, big).b_simple
           for s, b in zip(small_sqs, big_sqs, strict=True)]
    if not all(math.isfinite(v) for v in loo):
        return math.inf
    mean = sum(loo) / n
    return math.sqrt((n - 1) / n * sum((v - mean) ** 2 for v in loo))


def measure(cfg, small: int, big: int, draws: int, model_state: dict | None = None) -> dict:
    """``draws`` draws of ``big // small`` batches of ``small`` chunks of the hybrid task of
    ``cfg`` (a composed recipe); the noise scale of the model (its initial one, or
    ``model_state``)."""
    import torch

    from asrtrain import AsrtrainError
    from asrtrain.simulate.workload import TaskWorkload, system_config
    from asrtrain.train.tasks import FrameCETask

    if big % small:
        raise AsrtrainError(f"--big {big} must be a multiple of --small {small}")
    hcfg = system_config(cfg, "hybrid")
    hcfg.trainer.batch_chunks = small
    work = TaskWorkload(hcfg)
    if not isinstance(work.task, FrameCETask):
        raise AsrtrainError("the noise scale is measured in chunks: the hybrid task only")
    model = work.model
    if model_state is not None:
        model.load_state_dict(model_state)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    per = big // small
    small_sqs, big_sqs = [], []
    for d in range(draws):
        grads = []
        for batch in work.batches(d, 0, 1):
            if work.samples(batch) != small:   # an epoch's last, short batch
                continue
            model.zero_grad(set_to_none=True)
            work.loss(model, batch).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in params]).double())
            if len(grads) == per:
                break
        if len(grads) < per:
            raise AsrtrainError(f"an epoch has fewer than {per} batches of {small} chunks "
                                f"({work.task.samples_per_epoch} chunks): lower --big")
        g = torch.stack(grads)
        small_sqs.append(float((g * g).sum(1).mean()))
        big_sqs.append(float(g.mean(0).pow(2).sum()))
    n = len(small_sqs)
    est = estimate(sum(small_sqs) / n, sum(big_sqs) / n, small, big)
    return {**asdict(est), "b_simple_se": jackknife(small_sqs, big_sqs, small, big),
            "draws": n, "chunks_per_epoch": work.task.samples_per_epoch,
            "num_pdfs": work.task.output_dim,
            "heldout_loss": work.heldout_loss(model)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", nargs="?", help="the recipe (not with --hours)")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--hours", type=float, help="bench/science.py's scaled corpus of this size")
    ap.add_argument("--model", help="a state dict to measure at (default: the initial model)")
    ap.add_argument("--small", type=int, default=8, help="the small batch, chunks")
    ap.add_argument("--big", type=int, default=256, help="the big batch, chunks")
    ap.add_argument("--draws", type=int, default=16, help="draws of big/small small batches")
    ap.add_argument("--out", required=True, help="the JSON written")
    args = ap.parse_args(argv)

    import torch

    from asrtrain import AsrtrainError
    from asrtrain.fileio import write_text
    from asrtrain.recipe import compose_recipe

    torch.set_num_threads(1)
    if (args.hours is None) == (args.recipe is None):
        ap.error("give a recipe (and its overrides) or --hours, not both")
    recipe, overrides = args.recipe, list(args.overrides)
    if args.hours is not None:
        import science  # bench/science.py, beside this file

        recipe = str(science.RECIPE)
        exp = science.SCIENCE_DIR / f"exp-{args.hours:g}h"
        corpus = science.corpus_overrides(args.hours, science.SCIENCE_DIR)
        overrides = [*science.ensure_exp(exp, corpus), *science.TINY_MODEL, *overrides]
    try:
        state = torch.load(args.model, map_location="cpu") if args.model else None
        result = measure(compose_recipe(recipe, overrides), args.small, args.big, args.draws,
                         state)
    except AsrtrainError as e:
        raise SystemExit(f"noise_scale: {e}") from None
    result.update(recipe=recipe, overrides=overrides, model=args.model, hours=args.hours,
                  method="McCandlish et al. 2018 (arXiv:1812.06162), appendix A.1")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(result, indent=1) + "\n")
    print(f"B_simple = {result['b_simple']:.1f} +- {result['b_simple_se']:.1f} chunks "
          f"(|G|^2 {result['grad_sq']:.3g}, tr(Sigma) {result['trace']:.3g}; batches "
          f"{args.small} and {args.big}, {result['draws']} draws; held-out loss "
          f"{result['heldout_loss']:.3f}) -> {out}")


if __name__ == "__main__":
    main()
