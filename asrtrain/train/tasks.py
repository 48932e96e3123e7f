"""What is being learned: CTC over sentencepiece units, or frame cross-entropy over pdf ids.

A task owns its data, its loss and its dev-set metrics; the trainer loop is the same for both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kaldialign
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.distributed.claims import EpochClaims
from asrtrain.features.reader import appended_streams, stream_dirs
from asrtrain.lang.bpe import Units
from asrtrain.models.checkpoint import ModelCheckpoint
from asrtrain.models.ctc import greedy_units
from asrtrain.models.registry import common_settings
from asrtrain.recipe import Paths
from asrtrain.sections import sets_settings
from asrtrain.train.chunks import IGNORE, ChunkSet, log_priors, prefetch
from asrtrain.train.config import TrainerConfig
from asrtrain.train.data import UtteranceSet, iterate, shard
from asrtrain.train.resident import ResidentChunks, learner_data_device, release_freed_heap


class Task:
    """What both tasks share: the model checkpoint they are saved as."""

    input_dim: int
    output_dim: int

    def checkpoint_extra(self) -> dict:
        """The task's own :class:`ModelCheckpoint` fields (the hybrid priors and chunk)."""
        return {}

    def model_checkpoint(self, cfg: DictConfig, state: dict, *, epoch: int | None = None,
                         global_samples: int | None = None,
                         metrics: dict | None = None) -> ModelCheckpoint:
        """The checkpoint of a model of this task with weights ``state`` (see
        ``docs/architecture.md``, "Data flow: features and checkpoints")."""
        return ModelCheckpoint(state, OmegaConf.to_container(cfg.model, resolve=True),
                               self.input_dim, self.output_dim,
                               OmegaConf.to_container(cfg.features, resolve=True), epoch=epoch,
                               global_samples=global_samples, metrics=metrics,
                               **self.checkpoint_extra())


class CTCTask(Task):
    """CTC over sentencepiece units on whole utterances; a sample is an utterance."""

    name = "ctc"

    def __init__(self, cfg: DictConfig) -> None:
        paths = Paths(Path(cfg.exp_dir))
        self.units = Units(paths.lang / "units.model")
        feats, t = cfg.features, TrainerConfig.from_config(cfg.trainer)
        args = dict(delta_order=int(feats.delta_order), norm_vars=bool(feats.norm_vars),
                    subsample=common_settings(cfg.model).stack_frames,
                    max_frames=int(t.max_utt_frames))
        sets = sets_settings(cfg)
        self.train_set = UtteranceSet(paths.data_set(sets.train), self.units.encode, **args)
        self.dev_set = UtteranceSet(paths.data_set(sets.dev), self.units.encode, **args)
        self.batch_frames = int(t.batch_frames)
        self.seed = int(t.seed)
        self.input_dim, self.output_dim = self.train_set.dim, len(self.units)
        self.samples_per_epoch = len(self.train_set)

    def describe(self) -> str:
        return (f"CTC over {self.output_dim} units; {len(self.train_set)} training utterances "
                f"({self.train_set.total_frames / 360000:.2f} h), {len(self.dev_set)} dev")

    def steps_per_epoch(self, world: int) -> int:
        return len(shard(self.train_set.batches(self.batch_frames, self.seed), 0, world))

    def epoch(self, epoch: int, rank: int, world: int,
              claim: EpochClaims | None = None) -> Iterator:
        """This learner's batches of ``epoch``: its shard (as many as every learner's), or with
        ``claim`` the batches of the whole epoch's order it claims, one at a time."""
        batches = self.train_set.batches(self.batch_frames, self.seed + epoch)
        if claim is None:
            return iterate(self.train_set, shard(batches, rank, world))
        return iterate(self.train_set, claimed(batches, claim))

    @staticmethod
    def samples(batch) -> int:
        return len(batch.utts)

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        return self._forward(model, batch)[0]

    def _forward(self, model, batch):
        device = next(model.parameters()).device
        logits, out_lengths = model(batch.feats.to(device), batch.lengths)
        logp = F.log_softmax(logits, dim=-1).transpose(0, 1)
        loss = F.ctc_loss(logp, batch.targets.to(device), out_lengths, batch.target_lengths,
                          blank=0, reduction="sum", zero_infinity=True)
        return loss / len(batch.utts), logits, out_lengths

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, rank: int, world: int) -> dict[str, float]:
        """Sums of dev CTC loss and unit edit errors over this learner's share of the dev set."""
        batches = self.dev_set.batches(self.batch_frames, None)[rank::world]
        loss = errors = units = utts = 0.0
        for batch in iterate(self.dev_set, batches):
            batch_loss, logits, out_lengths = self._forward(model, batch)
            loss += float(batch_loss) * len(batch.utts)
            offset = 0
            for hyp, n in zip(greedy_units(logits, out_lengths),
                              batch.target_lengths.tolist(), strict=True):
                ref = batch.targets[offset: offset + n].tolist()
                offset += n
                errors += kaldialign.edit_distance(ref, [u for u, _ in hyp])["total"]
                units += n
            utts += len(batch.utts)
        return {"loss": loss, "errors": errors, "units": units, "count": utts}

    @staticmethod
    def summarize(sums: dict[str, float]) -> dict[str, float]:
        return {"dev_loss": sums["loss"] / max(sums["count"], 1),
                "dev_unit_error_rate": 100 * sums["errors"] / max(sums["units"], 1)}


class FrameCETask(Task):
    """Frame cross-entropy over pdf ids on fixed-length chunks; a sample is a chunk."""

    name = "ce"

    def __init__(self, cfg: DictConfig) -> None:
        paths = Paths(Path(cfg.exp_dir))
        feats, t = cfg.features, TrainerConfig.from_config(cfg.trainer)
        # {train: align dir, dev: align dir} (the align stage's, which train_hybrid gives)
        ali = common_settings(cfg.model).alignments
        if not ali or not {"train", "dev"} <= set(ali):
            raise AsrtrainError(f"model.alignments={ali!r}: expected the train and dev sets' "
                                "alignment dirs ({train: DIR, dev: DIR}: train_hybrid gives "
                                "the align stage's)")
        args = dict(chunk=int(t.chunk), delta_order=int(feats.delta_order),
                    norm_vars=bool(feats.norm_vars))
        append = appended_streams(feats)
        sets = sets_settings(cfg)
        train, dev = sets.train, sets.dev
        self.train_set = ChunkSet(paths.data_set(train), ali["train"],
                                  streams=stream_dirs(paths, train, append), **args)
        self.dev_set = ChunkSet(paths.data_set(dev), ali["dev"],
                                streams=stream_dirs(paths, dev, append), **args)
        if self.dev_set.num_pdfs != self.train_set.num_pdfs:
            raise AsrtrainError(f"{ali['dev']}: {self.dev_set.num_pdfs} pdfs, but the training "
                                f"alignments in {ali['train']} have {self.train_set.num_pdfs}")
        if self.dev_set.dim != self.train_set.dim:
            raise AsrtrainError(f"{self.dev_set.data_dir}: a {self.dev_set.dim}-dim input "
                                f"({self.dev_set.reader.describe()}), but the training set's is "
                                f"{self.train_set.dim} ({self.train_set.reader.describe()}) "
                                f"with features {describe_features(feats)}")
        self.batch_size = int(t.batch_chunks)
        self.block_utts = int(t.block_utts)
        self.seed = int(t.seed)
        self.chunk_data, self.device = t.chunk_data, learner_data_device(t.cpu)
        self._resident: dict[str, ResidentChunks] = {}
        self.chunk_store = paths.exp / "chunkstore"  # resident data, mapped by every learner
        self.input_dim, self.output_dim = self.train_set.dim, self.train_set.num_pdfs
        self.samples_per_epoch = len(self.train_set)
        self.priors = log_priors(self.train_set.pdf_counts())
        self._input = self.train_set.reader.describe()  # read now: the tables may go (resident)

    def describe(self) -> str:
        return (f"frame CE over {self.output_dim} pdfs on {self.train_set.chunk}-frame chunks; "
                f"{self.samples_per_epoch} training chunks, {len(self.dev_set)} dev; input "
                f"{self.input_dim} dims: {self._input}")

    def steps_per_epoch(self, world: int) -> int:
        return self.train_set.steps(self.seed + 1, world, self.batch_size)

    def epoch(self, epoch: int, rank: int, world: int,
              claim: EpochClaims | None = None) -> Iterator:
        """This learner's batches of ``epoch``: its shard of :meth:`ChunkSet.plan` with as many
        steps as every learner's, or with ``claim`` the blocks of the whole set's plan it
        claims. A lockstep node (``claim.members`` > 1) needs units of one size, which blocks
        are not: it keeps the shards."""
        seed = self.seed + epoch
        if claim is not None and claim.members == 1:
            args = (seed, rank, world, self.batch_size, self.block_utts, None, claim)
        else:
            steps = self.train_set.steps(seed, world, self.batch_size)
            args = (seed, rank, world, self.batch_size, self.block_utts, steps)
        if self.chunk_data == "stream":
            return prefetch(self.train_set.batches(*args))
        return self.resident("train", rank).batches(*args)

    def resident(self, which: str, rank: int = 0) -> ResidentChunks:
        """The ``train`` or ``dev`` set held on this learner's device, loaded at first use (not
        when the task is built: describing a run must not read every ark). Once it is in the
        chunk store the set's per-utterance tables go (:meth:`ChunkSet.forget_tables`): what a
        learner keeps of a set beyond the store's shared pages is then 8 bytes an utterance."""
        if which not in self._resident:
            chunks = self.train_set if which == "train" else self.dev_set
            self._resident[which] = ResidentChunks(chunks, self.device, announce=rank == 0,
                                                   store_dir=self.chunk_store)
            chunks.forget_tables()
            release_freed_heap()  # the tables' pages back to the kernel, not kept for reuse
        return self._resident[which]

    @staticmethod
    def samples(batch) -> int:
        return batch.samples

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        return self._forward(model, batch)[0]

    def _forward(self, model, batch):
        device = next(model.parameters()).device
        logits, _ = model(batch.feats.to(device), batch.lengths)
        targets = batch.targets.to(device)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=IGNORE)
        return loss, logits, targets

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, rank: int, world: int) -> dict[str, float]:
        loss = correct = frames = 0.0
        dev = self.dev_set if self.chunk_data == "stream" else self.resident("dev", rank)
        for batch in dev.batches(None, rank, world, self.batch_size):
            batch_loss, logits, targets = self._forward(model, batch)
            mask = targets != IGNORE
            n = float(mask.sum())
            loss += float(batch_loss) * n
            correct += float((logits.argmax(-1)[mask] == targets[mask]).sum())
            frames += n
        return {"loss": loss, "correct": correct, "count": frames}

    @staticmethod
    def summarize(sums: dict[str, float]) -> dict[str, float]:
        return {"dev_loss": sums["loss"] / max(sums["count"], 1),
                "dev_frame_accuracy": 100 * sums["correct"] / max(sums["count"], 1)}

    def checkpoint_extra(self) -> dict:
        return {"log_priors": torch.from_numpy(self.priors), "chunk": self.train_set.chunk}


def claimed(units: list, claim: EpochClaims) -> Iterator:
    """The units of ``units`` (an epoch's order) that ``claim`` hands this learner."""
    while (k := claim(len(units))) is not None:
        yield units[k]


def describe_features(feats: DictConfig) -> str:
    """The settings of a features config that shape the model's input, for error messages."""
    return (f"delta_order={feats.get('delta_order', 0)} "
            f"append={list(feats.get('append') or [])}")


def build_task(cfg: DictConfig):
    """The task of the model's head (``model.head``, checked by the model section's reader)."""
    return {"ctc": CTCTask, "ce": FrameCETask}[common_settings(cfg.model).head](cfg)
