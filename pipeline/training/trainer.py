"""The training job, as a story: restore -> loop train_step -> checkpoint -> validate -> early stop
-> calibrate -> export. Components (data stream, DDP model with its communication hook, optimizer,
checkpointer) are built from their config slices in ``__init__``; ``state`` holds only what a resume
needs besides weights, optimizer and residuals.

Every rank runs the same code; collectives (DDP, checksums, validation gather, checkpoint barriers)
keep them in step. Only rank 0 writes the shared run-directory files.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import signal
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from models.fraud_mlp import FraudModel, FraudModelConfig
from models.piecewise_linear import fit_bin_edges
from pipeline.config import to_dict
from pipeline.datasets.manifest import load_manifest, manifest_path
from pipeline.features import definitions as fd
from pipeline.training import run_dir as files
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.comm_hooks import CommTiming, register_compression
from pipeline.training.compression import density_at_step
from pipeline.training.config import TrainConfig
from pipeline.training.data import (
    Batch,
    TrainStream,
    bin_fit_sample,
    feature_moments,
    normalization_from_moments,
    split_global_batch,
)
from pipeline.training.distributed import (
    DistEnv,
    barrier,
    check_replicas,
    log_rank,
    log_rank0,
    no_forward_buffer_sync,
)
from pipeline.training.early_stopping import epoch_picked_by, judge_validation, validation_picks
from pipeline.training.evaluate import gather_scored, score_split, split_metrics
from pipeline.training.finalize import TrainingOutcome, finalize_run
from pipeline.training.loss import make_loss
from pipeline.training.optimizer import FreezableAdamW
from pipeline.training.progress import ProgressLine, format_progress
from pipeline.training.schedule import lr_at_step
from pipeline.training.weight_average import WeightAverage


class TrainingDiverged(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient."""


class RunDirectoryInUse(RuntimeError):
    """The run directory already holds checkpoints and resuming is off."""


@dataclasses.dataclass
class TrainerState:
    global_step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch of the next step
    step_in_epoch: int = 0  # next step within that epoch (the data position)
    best_ap: float = -math.inf
    best_step: int = -1
    best_epoch: int = -1
    best_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    epochs_without_improvement: int = 0
    stopped_early: bool = False
    skipped_steps: int = 0
    consecutive_skips: int = 0
    bytes_sent_total: int = 0  # this rank's bytes handed to gradient collectives
    bytes_dense_total: int = 0  # what fp32 all-reduce would have handed over


def sequence_branch(numeric_features: tuple[str, ...], sequence_hidden: int) -> dict[str, Any]:
    """The sequence fields of FraudModelConfig for a dataset with these ``numeric_features``: the
    card's last payments (fd.SEQUENCE_FEATURES) read by a GRU of width ``sequence_hidden``, or no
    branch when the dataset lacks any of those columns (built before feature version 4)."""
    if not set(fd.SEQUENCE_FEATURES) <= set(numeric_features):
        return {"sequence_columns": (), "sequence_steps": 0, "sequence_hidden": 0}
    return {"sequence_columns": fd.SEQUENCE_FEATURES, "sequence_steps": fd.SEQUENCE_STEPS,
            "sequence_hidden": sequence_hidden}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Trainer:
    def __init__(self, config: TrainConfig, run_dir: Path, dataset_root: Path, env: DistEnv) -> None:
        self.config, self.env = config, env
        self.run_dir, self.dataset_root = Path(run_dir), Path(dataset_root)
        torch.set_num_threads(config.loop.threads_per_rank)
        self.manifest = load_manifest(self.dataset_root, config.data.version or None)
        torch.manual_seed(config.loop.seed)
        self.model_config = FraudModelConfig(
            numeric_features=self.manifest.numeric_features,
            categorical_features=dict(self.manifest.categorical_features),
            **{**to_dict(config.model),
               **sequence_branch(self.manifest.numeric_features, config.model.sequence_hidden)})
        self.model = FraudModel(self.model_config).to(env.device)
        accumulation = config.optim.accumulation_steps
        micro_rows = split_global_batch(config.data.global_batch_size, env.world_size, accumulation)
        self.data = TrainStream(self.dataset_root, self.manifest, env.rank, env.world_size, micro_rows, accumulation,
                                config.data.shuffle_window_rows, config.loop.seed, config.data.negative_sample_rate)
        self.epochs = config.loop.run_epochs(config.data.sampled)
        full = self.data.steps_per_epoch * self.epochs
        self.total_steps = min(full, config.loop.max_steps) if config.loop.max_steps > 0 else full
        self.ddp = DistributedDataParallel(
            self.model, device_ids=[env.device] if env.device.type == "cuda" else None,
            bucket_cap_mb=config.compression.bucket_cap_mb,
            **no_forward_buffer_sync())  # buffers (normalisation, temperature) never change while training
        self.comm = register_compression(self.ddp, config.compression, env.backend, config.optim.grad_clip,
                                         seed=config.loop.seed)
        # AdamW; with compression.freeze_variance its second moment stops after the dense warm-up.
        self.optimizer = FreezableAdamW(
            self.model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay,
            betas=(config.optim.beta1, config.optim.beta2))
        # The weights validated, checkpointed as "model" and exported; None: the raw weights.
        self.average = WeightAverage(self.model, config.optim.ema_decay) if config.optim.ema_decay > 0 else None
        train_shards = self.manifest.shards_for("train")
        frauds = sum(s.frauds for s in train_shards)
        genuine = sum(s.rows for s in train_shards) - frauds
        self.loss_fn = make_loss(config.optim, frauds, genuine)  # on unsampled rows: validation, finalisation
        # Sampled genuine rows weigh 1/rate: as positives weighed `rate` against them (Adam ignores the scale).
        importance = config.data.sampled and config.data.weigh_sampled_negatives
        self.train_loss_fn = make_loss(config.optim, frauds, genuine,
                                       positive_scale=config.data.negative_sample_rate if importance else 1.0)
        self.validation_frauds = sum(s.frauds for s in self.manifest.shards_for("validation"))
        self.validation_picks = validation_picks(self.validation_frauds, config.loop)
        self.files = files.RunDir(self.run_dir)
        self.checkpointer = Checkpointer(self.files.checkpoints, env.rank, env.world_size,
                                         config.checkpoint.keep_last, barrier)
        self.state = TrainerState()
        self.progress = ProgressLine()
        self.loop_seconds = 0.0  # time in data loading + train steps (throughput, not wall)
        self.loop_cpu_seconds = 0.0  # CPU time of this process (all its threads) in the same span
        self.loop_samples = 0
        self.epoch_timing = CommTiming()  # step and communication times of the epoch (of its rest, after a resume)

    # ---- the story -------------------------------------------------------------------------

    def train(self) -> dict[str, Any] | None:
        """Run to completion (or early stop); returns the summary on rank 0, None elsewhere."""
        started = time.time()
        if not self._restore():  # a checkpoint holds the input statistics and edges already
            self._fit_normalization()
            self._fit_bin_edges()
        if self.env.is_rank0:
            self._write_inputs()
        log_rank0(f"training {self.manifest.dataset}@{self.manifest.version}: {self.total_steps} steps "
                  f"({self.data.steps_per_epoch}/epoch), {self.env.world_size} x {self.env.backend}, "
                  f"compression {self.config.compression.method}, resuming at step {self.state.global_step}")
        if self.config.loop.validate and not self.validation_picks:
            log_rank0(f"exported epoch: {epoch_picked_by(self.validation_frauds, self.config.loop)} "
                      f"(all {self.epochs} epochs run; validation still calibrates and judges the blend)")
        while not self._finished():
            self._train_epoch()
        rank_stats = self._gather_rank_stats()
        summary = None
        if self.env.is_rank0:
            self.progress.finish()
            # Finalisation runs here alone while this node's other ranks wait at the barrier below: its
            # scoring of the whole validation split takes their threads too (2 threads: 3.9 s -> 2.5 s
            # on the default bench portfolio's 108k validation rows).
            torch.set_num_threads(self.config.loop.threads_per_rank * self.env.local_world_size)
            self.checkpointer.ensure_best(self.state.best_step if self.state.best_step >= 0 else None)
            state = self.state
            summary = finalize_run(
                self.files, self.checkpointer, self.dataset_root, self.manifest, self.loss_fn,
                TrainingOutcome(
                    global_step=state.global_step, epochs=state.epoch + (1 if state.step_in_epoch else 0),
                    best_epoch=state.best_epoch, best_metrics=state.best_metrics,
                    epoch_picked_by=epoch_picked_by(self.validation_frauds, self.config.loop),
                    stopped_early=state.stopped_early, skipped_steps=state.skipped_steps,
                    bytes_sent_total=state.bytes_sent_total, bytes_dense_total=state.bytes_dense_total,
                    train_samples=self.loop_samples, loop_seconds=self.loop_seconds, rank_stats=rank_stats,
                    world_size=self.env.world_size, backend=self.env.backend,
                    compression=self.config.compression, started_at=started),
                self.config.decisions, self.config.blend, self.config.loop.seed, self.config.data.negative_sample_rate)
        barrier()
        return summary

    def _finished(self) -> bool:
        return (self.state.stopped_early or self.state.global_step >= self.total_steps
                or self.state.epoch >= self.epochs)

    def _train_epoch(self) -> None:
        epoch = self.state.epoch
        self.epoch_timing = CommTiming()
        steps = self.data.epoch(epoch, self.state.step_in_epoch)
        tick, cpu_tick = time.perf_counter(), time.process_time()
        for micro_batches in steps:
            self._maybe_inject_kill()
            self.train_step(micro_batches)
            self.loop_seconds += time.perf_counter() - tick
            self.loop_cpu_seconds += time.process_time() - cpu_tick
            self._after_step()
            if self.state.global_step >= self.total_steps:
                break
            tick, cpu_tick = time.perf_counter(), time.process_time()
        if self.state.step_in_epoch == self.data.steps_per_epoch:
            self.state.epoch, self.state.step_in_epoch = epoch + 1, 0
        is_best = self._validate(epoch) if self._validation_due(epoch) else False
        self._save(epoch, is_best)

    def _validation_due(self, epoch: int) -> bool:
        """After every ``validate_every_epochs``-th epoch, and after the run's last one (so the best
        weights are always chosen from a validated epoch)."""
        return (epoch + 1) % self.config.loop.validation_period(self.config.data.sampled) == 0 or self._finished()

    def train_step(self, micro_batches: list[Batch]) -> None:
        """One optimizer step: micro-batches under ``no_sync`` but the last, clip, then AdamW.

        A non-finite gradient (every rank sees the same synchronised gradient, so all agree) skips
        the step: no update, error-feedback residuals unchanged.
        """
        started = time.perf_counter()
        step, cfg = self.state.global_step, self.config
        self.comm.begin_step(
            density_at_step(step, cfg.compression.density, cfg.compression.dense_warmup_steps,
                            round(cfg.compression.density_warmup_epochs * self.data.steps_per_epoch),
                            cfg.compression.density_warmup_start),
            dense=step < cfg.compression.dense_warmup_steps, step=step)
        lr = lr_at_step(step, cfg.optim.lr, self.total_steps, cfg.schedule)
        freeze_variance = cfg.compression.freeze_variance and step >= cfg.compression.dense_warmup_steps
        for group in self.optimizer.param_groups:
            group["lr"], group["freeze_variance"] = lr, freeze_variance
        if freeze_variance and cfg.compression.select_by_update:
            self._weigh_selection_by_preconditioner()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for i, batch in enumerate(micro_batches):
            sync = i == len(micro_batches) - 1
            with nullcontext() if sync else self.ddp.no_sync(), self._autocast():
                # [B, members]: each ensemble member is trained on its own loss (TabM), the mean is taken.
                logits = self.ddp(batch.numeric.to(self.env.device), batch.categorical.to(self.env.device),
                                  per_member=True).float()
                labels = batch.label.to(self.env.device).unsqueeze(1).expand_as(logits)
                loss = self.train_loss_fn(logits, labels) / len(micro_batches)
                if self.env.is_rank0 and step in cfg.faults.nan_loss_at_steps:
                    loss = loss * float("nan")
                loss.backward()
            if sync:
                self.comm.end_backward()
            loss_sum += float(loss.detach())
            self.loop_samples += len(batch) * self.env.world_size
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 and not self.comm.clipped_locally else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            if self.average is not None:
                self.average.update(step)
            self.comm.commit()
            self.state.consecutive_skips = 0
        else:
            self._skip_step(step)
        self.state.bytes_sent_total += self.comm.step_bytes_sent
        self.state.bytes_dense_total += self.comm.step_bytes_dense
        self.epoch_timing.add(time.perf_counter() - started, self.comm)
        self.state.global_step += 1
        self.state.step_in_epoch += 1
        self.last_loss, self.last_lr = loss_sum, lr

    def _weigh_selection_by_preconditioner(self) -> None:
        """Top-k ranks entries by the step they would make: |acc| / sqrt(frozen variance). Recomputed
        every step from the optimizer state, so a resumed run selects exactly as an uninterrupted one."""
        self.comm.compressor.selection_weights = {
            name: weight.reshape(-1) for name, param in self.model.named_parameters()
            if (weight := self.optimizer.preconditioner(param)) is not None}

    def _skip_step(self, step: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.comm.discard()
        self.state.skipped_steps += 1
        self.state.consecutive_skips += 1
        log_rank0(f"step {step}: non-finite loss or gradient, step skipped "
                  f"({self.state.consecutive_skips} in a row, {self.state.skipped_steps} in total)")
        if self.state.consecutive_skips >= self.config.loop.max_consecutive_skips:
            raise TrainingDiverged(
                f"{self.state.consecutive_skips} consecutive steps had a non-finite loss or gradient "
                f"(last at step {step}): training diverged. Lower optim.lr, check the input features for "
                f"corrupt values, or resume from an earlier checkpoint in {self.checkpointer.directory}")

    def _autocast(self):
        if self.env.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _after_step(self) -> None:
        cfg, step = self.config, self.state.global_step
        if step % cfg.loop.log_every == 0 or step == 1:
            self._log_step()
        if step % cfg.loop.checksum_every == 0:
            check_replicas(self.model, step, self.env.device)
        mid_epoch = 0 < self.state.step_in_epoch < self.data.steps_per_epoch
        if step % cfg.checkpoint.every_steps == 0 and mid_epoch and step < self.total_steps:
            self._save(self.state.epoch, is_best=False)

    def _log_step(self) -> None:
        now = time.perf_counter()
        last = getattr(self, "_last_log", None)
        rate = (self.loop_samples - last[1]) / max(self.loop_seconds - last[0], 1e-9) if last else 0.0
        self._last_log = (self.loop_seconds, self.loop_samples, now)
        if not self.env.is_rank0:
            return
        record = {
            "step": self.state.global_step, "epoch": self.state.epoch, "loss": self.last_loss, "lr": self.last_lr,
            "density": self.comm.density if not self.comm.dense else 1.0,
            "bytes_sent": self.comm.step_bytes_sent, "bytes_dense": self.comm.step_bytes_dense,
            "samples_per_s": rate, "skipped_steps": self.state.skipped_steps, "time": time.time(),
        }
        self.files.append_step(record)
        self.progress.update(format_progress(
            self.state.global_step, self.total_steps, self.state.epoch, rate, self.last_loss, self.last_lr,
            record["density"], record["bytes_sent"], record["bytes_dense"]))

    # ---- validation and checkpoints ---------------------------------------------------------

    def _validate(self, epoch: int) -> bool:
        """Per-epoch validation, best tracking and early stopping. Returns whether this is the best."""
        if not self.config.loop.validate:  # without validation the latest weights are the ones exported
            self.state.best_step, self.state.best_epoch = self.state.global_step, epoch
            return True
        rate = self.config.loop.validation_sample_rate(self.config.data.sampled)
        with self._averaged():
            scored = gather_scored(score_split(self.model, self.dataset_root, self.manifest, "validation",
                                               self.env.rank, self.env.world_size, self.env.device,
                                               negative_rate=rate, seed=self.config.loop.seed))
        metrics = split_metrics(scored, self.loss_fn, negative_rate=rate)
        ap = metrics["average_precision"]
        verdict = judge_validation(ap, epoch, self._finished(), self.state.best_ap if self.state.best_step >= 0 else None,
                                   self.state.epochs_without_improvement, self.config.loop, self.validation_picks)
        improved = verdict.improved
        if improved:
            self.state.best_ap = ap if not math.isnan(ap) else -math.inf
            self.state.best_step, self.state.best_epoch = self.state.global_step, epoch
            self.state.best_metrics = metrics
        self.state.epochs_without_improvement = verdict.epochs_without_improvement
        self.state.stopped_early = verdict.stop
        if self.env.is_rank0:
            self.progress.finish()
            self.files.append_epoch({"epoch": epoch, "step": self.state.global_step, **metrics,
                                     **self.epoch_timing.record(self.config.compression.bucket_cap_mb),
                                     "time": time.time()})
            log_rank0(f"epoch {epoch}: val_loss {metrics['val_loss']:.4f} auc {metrics['auc_roc']:.4f} "
                      f"ap {ap:.4f} "
                      + (f"card_precision@100 {metrics['card_precision_at_100']:.3f}" if rate >= 1.0 else
                         f"(every fraud and {rate:g} of the genuine rows, weighted)")
                      + (" (best)" if improved else "")
                      + ("" if verdict.eligible else f" (before loop.min_epochs {self.config.loop.min_epochs})"
                         if self.validation_picks else " (not picked: too few validation frauds)")
                      + (" -> early stop" if self.state.stopped_early else ""))
        return improved

    def _save(self, epoch: int, is_best: bool) -> None:
        rank_state: dict[str, Any] = {"rng_cpu": torch.get_rng_state()}
        if self.env.device.type == "cuda":
            rank_state["rng_cuda"] = torch.cuda.get_rng_state(self.env.device)
        if self.comm.compressor is not None:
            rank_state["residuals"] = self.comm.compressor.state_dict()
        trainer_state = None
        if self.env.is_rank0:
            with self._averaged():  # "model" holds the weights to validate and export
                model_state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
            trainer_state = {"model": model_state, "optimizer": self.optimizer.state_dict(),
                             "trainer": dataclasses.asdict(self.state)}
            if self.average is not None:  # the raw weights, which training continues from
                trainer_state["training_params"] = [p.detach().cpu().clone() for p in self.model.parameters()]
        self.checkpointer.save(self.state.global_step, epoch, trainer_state, rank_state,
                               self.model_config.to_json(), is_best)

    def _restore(self) -> bool:
        latest = self.checkpointer.latest()
        if latest is None:
            return False
        if not self.config.checkpoint.resume:
            raise RunDirectoryInUse(
                f"{self.run_dir} already has checkpoints (latest {latest.name}) and resuming is off: "
                "pass --resume to continue it or choose a new --run-name")
        trainer_state, rank_state = self.checkpointer.load(latest)
        self.model.load_state_dict(trainer_state["model"])
        if self.average is not None:
            self._restore_average(trainer_state.get("training_params"), latest.name)
        self.optimizer.load_state_dict(trainer_state["optimizer"])
        self.state = TrainerState(**trainer_state["trainer"])
        if rank_state is None:
            log_rank(f"checkpoint {latest.name} has no state for this rank (world size changed): "
                     "starting with empty residuals and a fresh RNG stream")
        else:
            torch.set_rng_state(rank_state["rng_cpu"])
            if "rng_cuda" in rank_state and self.env.device.type == "cuda":
                torch.cuda.set_rng_state(rank_state["rng_cuda"], self.env.device)
            if self.comm.compressor is not None and "residuals" in rank_state:
                self.comm.compressor.load_state_dict(rank_state["residuals"], self.env.device)
        if self.env.is_rank0:
            self.files.truncate_metrics_after(self.state.global_step)
        log_rank0(f"resumed from {latest} (step {self.state.global_step}, epoch {self.state.epoch})")
        return True

    def _averaged(self):
        return self.average.applied() if self.average is not None else nullcontext()

    @torch.no_grad()
    def _restore_average(self, training_params: list[torch.Tensor] | None, checkpoint: str) -> None:
        """The model holds the checkpoint's "model" (the average): make that the average and put the
        raw weights back into the model."""
        self.average.load(list(self.model.parameters()))
        if training_params is None:
            log_rank0(f"checkpoint {checkpoint} was saved without a weight average: training continues "
                      "from its weights, the average starts from them")
            return
        for param, value in zip(self.model.parameters(), training_params, strict=True):
            param.copy_(value)

    def _fit_normalization(self) -> None:
        """Training-set mean/std of the numeric features, summed over every rank's rows."""
        moments = feature_moments(self.dataset_root, self.manifest, self.env.rank, self.env.world_size)
        moments = moments.to(self.env.device)
        if self.env.world_size > 1:
            dist.all_reduce(moments)
        mean, std = normalization_from_moments(moments.cpu())
        self.model.set_normalization(mean.to(self.env.device), std.to(self.env.device))

    def _fit_bin_edges(self) -> None:
        """Rank 0 fits the piecewise-linear bin edges on a sample of the train split and broadcasts
        them, so every replica (and later the scorer) applies the very same edges."""
        bins = self.model_config.numeric_bins
        if bins == 0:
            return
        edges = torch.zeros(len(self.model_config.numeric_features), bins + 1)
        if self.env.is_rank0:
            numeric, labels = bin_fit_sample(self.dataset_root, self.manifest, self.config.data.bin_fit_rows,
                                             self.config.loop.seed)
            edges = torch.from_numpy(fit_bin_edges(numeric, labels, bins))
        edges = edges.to(self.env.device)
        if self.env.world_size > 1:
            dist.broadcast(edges, src=0)
        self.model.set_bin_edges(edges)

    def _write_inputs(self) -> None:
        config = {**to_dict(self.config), "world_size": self.env.world_size, "backend": self.env.backend}
        self.files.write_inputs(config, manifest_path(self.dataset_root, self.manifest.version), self.dataset_root)

    def _maybe_inject_kill(self) -> None:
        faults = self.config.faults
        first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
        if first_attempt and self.env.rank == faults.sigkill_rank and self.state.global_step == faults.sigkill_at_step:
            log_rank(f"fault injection: SIGKILL at step {self.state.global_step}")
            os.kill(os.getpid(), signal.SIGKILL)

    def _gather_rank_stats(self) -> list[dict[str, float]]:
        """Every rank's peak RSS and training-loop CPU seconds (collective)."""
        mine = {"peak_rss_mb": peak_rss_mb(), "loop_cpu_s": self.loop_cpu_seconds}
        if self.env.world_size == 1:
            return [mine]
        every: list[dict[str, float] | None] = [None] * self.env.world_size
        dist.all_gather_object(every, mine)
        return [x for x in every if x is not None]
