"""Typed configuration of the training job, one frozen slice per component.

``conf/<env>/train.toml`` holds one table per slice ([data], [model], [optim], [schedule],
[compression], [checkpoint], [loop], [faults], [decisions]); each component receives only its slice.
The dataset root is the one connection-like setting: ``$FRAUD_DATASET_ROOT`` or the CLI wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.atomic import write_text_atomic
from pipeline.config import ConfigError, env_override, from_dict, load_section
from pipeline.decisions.operating_points import DecisionBudget

CompressionMethod = Literal["allreduce", "fp16", "bf16", "int8", "int8_ef", "topk_ef", "topk", "topk_int8_ef",
                            "powersgd"]
WarmupExchange = Literal["allreduce", "int8"]
LossKind = Literal["weighted_bce", "focal"]


@dataclass(frozen=True)
class DataConfig:
    # Relative paths resolve under the state directory (pipeline.paths.resolve_state_path).
    dataset_root: str = env_override("FRAUD_DATASET_ROOT", "datasets/fraud-dev")
    version: str = ""  # "" = the version LATEST points at
    global_batch_size: int = 4096  # rows per optimizer step, all ranks and micro-steps together
    shuffle_window_rows: int = 200_000  # rows held in memory for shuffling (bounds RAM per rank)
    # Share of the genuine train rows each epoch keeps (every fraud is kept; drawn again each epoch).
    # 1 reads every row. The calibration on the unsampled validation split removes the -log(rate)
    # it adds to the log-odds (pipeline/training/sampling.py).
    negative_sample_rate: float = 1.0
    # Sampled genuine rows weigh 1 / negative_sample_rate in the training loss (importance weights), so
    # the objective is the unsampled run's in expectation. Unweighted, every fraud would weigh 1 / rate
    # as much as in the data: a strong positive weighting, which ranks worse (costs AP).
    weigh_sampled_negatives: bool = True
    # Rows (a uniform sample of the train split) the numeric bin edges are fitted on, by rank 0.
    bin_fit_rows: int = 500_000

    @property
    def sampled(self) -> bool:
        return self.negative_sample_rate < 1.0


@dataclass(frozen=True)
class ModelConfig:
    """The architecture knobs of models.fraud_mlp.FraudModelConfig (same names, passed through)."""

    embedding_dim: int = 8
    hidden_dim: int = 128
    num_blocks: int = 2
    dropout: float = 0.1
    numeric_bins: int = 16  # piecewise-linear bins per numeric feature, edges from a decision tree
    numeric_embedding_dim: int = 8
    ensemble_size: int = 4  # TabM-mini members; each multiplies the backbone's compute
    # Width of the GRU over the card's last payments (their order and gaps); 0 = the columns only.
    # A dataset without the sequence columns (feature version < 4) trains without it whatever this says.
    # Off by default: measured, it adds nothing over the same columns (see conf/prod/train.toml).
    sequence_hidden: int = 0


@dataclass(frozen=True)
class BlendConfig:
    """``[blend]``: a LightGBM booster trained by the same job on the same rows, its raw score stacked
    with the network's logit by the calibration fit (pipeline/training/blend.py). Each decision uses
    rows the others did not fit on: the booster stops on the latest train rows (which it does not
    train on), the stacking weight is cross-fitted over time folds of validation, and the blend is
    kept only when its out-of-fold validation AP beats the network's by more than ``min_ap_gain``."""

    gbm: bool = False
    learning_rate: float = 0.05
    num_leaves: int = 63
    min_data_in_leaf: int = 50
    feature_fraction: float = 0.9
    bagging_fraction: float = 0.8
    bagging_freq: int = 1
    max_rounds: int = 2000
    early_stopping_rounds: int = 50  # on the log-loss of the early-stopping rows below
    # The latest share of the train rows (by event time): the booster does not train on them, their
    # log-loss stops it, so validation stays unseen by the booster's fit. The latest, because they are
    # closest in time to what the model will score.
    early_stopping_share: float = 0.1
    # Once those rows chose the number of rounds, train the booster again on every train row for that
    # many: the latest rows, the ones nearest what it will score, are then in its fit too, and
    # validation stays unseen (twice the booster's fit time).
    refit_all_train: bool = False
    # One thread: on shared cores LightGBM's OpenMP threads spin-wait (2 threads ran 20x slower here).
    num_threads: int = 1
    max_train_rows: int = 5_000_000  # a larger train split is sampled (seeded) down to this for the booster
    # On a negative sample ([data] negative_sample_rate < 1), weigh the booster's kept genuine rows by
    # 1 / rate as the network's. Off: the booster fits the sample as it is, and the stack's fitted shift
    # absorbs the prior offset that leaves in its raw score. Measured on the default portfolio at 0.1
    # (validation AP of the booster alone, 2 seeds): weighted 0.322 / 0.329 (stopped at 35-44 trees: each
    # kept genuine row's 10x weight makes the early-stopping log-loss noisy), unweighted 0.402 / 0.385,
    # the whole train split 0.384 at 8x the fit time.
    weigh_sampled_negatives: bool = False
    # Validation is cut into this many time-contiguous folds holding equal frauds; each fold is scored
    # by a stack fitted on the others, so the keep test judges weights on rows they were not fitted on.
    stacking_folds: int = 2
    min_ap_gain: float = 0.0  # the blend's out-of-fold validation AP must beat the network's by more than this
    # Resamples of the card-clustered paired bootstrap of that gain: its interval is recorded in
    # summary.json as the decision's uncertainty (evidence, not the rule: see blend.py).
    bootstrap_resamples: int = 500

    def __post_init__(self) -> None:
        checks = [
            (0.0 < self.early_stopping_share < 1.0,
             f"blend.early_stopping_share must be in (0, 1) (the booster trains on the rest), "
             f"got {self.early_stopping_share}"),
            (self.stacking_folds >= 2, f"blend.stacking_folds must be >= 2 (one to fit, one to judge), "
                                       f"got {self.stacking_folds}"),
            (self.bootstrap_resamples >= 1, f"blend.bootstrap_resamples must be >= 1, got {self.bootstrap_resamples}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def lightgbm_params(self, seed: int) -> dict[str, object]:
        """LightGBM's parameters (the baseline bench trains its LightGBM with the same)."""
        return {"objective": "binary", "learning_rate": self.learning_rate, "num_leaves": self.num_leaves,
                "min_data_in_leaf": self.min_data_in_leaf, "feature_fraction": self.feature_fraction,
                "bagging_fraction": self.bagging_fraction, "bagging_freq": self.bagging_freq,
                "num_threads": self.num_threads, "verbose": -1, "seed": seed}


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-3  # peak learning rate, reached at the end of warmup
    weight_decay: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 1.0  # max global L2 norm of the (synchronised) gradient
    accumulation_steps: int = 1  # micro-steps per optimizer step (no_sync on all but the last)
    loss: LossKind = "weighted_bce"
    # Positive-class weight for weighted_bce; <= 0 means sqrt(negatives / positives) of the train split.
    # 1 (unweighted) ranks best: the sqrt weight cost ~0.02 average precision in our measurements.
    pos_weight: float = 1.0
    focal_gamma: float = 2.0
    focal_alpha: float = 0.75  # weight of the positive class in the focal loss
    # Exponential moving average of the weights (pipeline/training/weight_average.py): what is
    # validated and exported. 0 = off; 0.999 averages over roughly the last 1000 steps.
    ema_decay: float = 0.999


@dataclass(frozen=True)
class ScheduleConfig:
    warmup_steps: int = 100  # linear ramp 0 -> lr over these optimizer steps
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio at the last step


@dataclass(frozen=True)
class CompressionConfig:
    """How gradients travel between ranks (pipeline/training/comm_hooks.py): ``allreduce`` (fp32),
    torch's ``fp16`` / ``bf16`` / ``powersgd`` hooks, ``int8`` / ``int8_ef`` (per-chunk int8, without or
    with error feedback), ``topk`` / ``topk_ef`` (fp32 values, int32 indices) and ``topk_int8_ef``.
    The quantized width is part of the method's name: the hooks send one byte per entry, and there is
    no width option (another width needs its own packing and its own method)."""

    method: CompressionMethod = "topk_ef"
    density: float = 0.01  # share of each parameter's gradient entries sent per step (top-k)
    dense_warmup_steps: int = 20  # plain all-reduce for the first steps: gradients are large and noisy
    # Top-k only: how the dense warm-up steps travel. "int8" quantizes them (about 4x fewer bytes, the
    # rounding error kept by error feedback) instead of an fp32 all-reduce.
    dense_warmup_exchange: WarmupExchange = "allreduce"
    # Deep Gradient Compression's sparsity warm-up: density decays exponentially density_warmup_start ->
    # density over this many epochs after the dense steps. Its bytes are the decay's mean density
    # (0.145 of dense from 1.0 to 0.001, 0.0215 from 0.1): most of a sparse run's bytes.
    density_warmup_epochs: float = 1.0
    density_warmup_start: float = 1.0
    # DDP's bucket size (25 is DDP's default): gradients are exchanged per bucket as soon as it is full,
    # so smaller buckets overlap more communication with backward's compute, at more collectives.
    bucket_cap_mb: float = 25.0
    quantization_chunk: int = 256  # int8 methods: entries per fp32 scale (4 bytes per 256: 1.6% overhead)
    powersgd_rank: int = 1  # powersgd: rank of the low-rank approximation (torch's matrix_approximation_rank)
    # Top-k only: AdamW's second moment stops updating when the dense warm-up ends (1-bit Adam), so
    # sparse steps' few large accumulated entries do not distort it (pipeline/training/optimizer.py).
    freeze_variance: bool = False
    # Top-k with error feedback only: clip each rank's gradient before it enters the residual (DGC), not
    # the averaged one after; clipping what is sent would drop accumulated mass that error feedback owes.
    local_clipping: bool = False
    # With freeze_variance: rank entries by the step they would make (|acc| / sqrt(frozen variance)),
    # not by raw magnitude, which Adam's per-entry scaling makes incomparable across entries.
    select_by_update: bool = False


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 200  # also saved at every epoch end
    keep_last: int = 3  # step checkpoints kept besides best/
    resume: bool = True  # resume from the latest checkpoint in the run directory


@dataclass(frozen=True)
class LoopConfig:
    seed: int = 1234
    epochs: int = 10
    max_steps: int = 0  # stop after this many optimizer steps in total (0 = run all epochs)
    log_every: int = 20
    checksum_every: int = 100  # compare a parameter checksum across ranks every N steps
    early_stop_patience: int = 3  # validations without an average-precision gain before stopping
    early_stop_min_delta: float = 1e-4
    # Epochs trained before a validation may pick the exported weights or count toward patience (the run's
    # last epoch always may). One validation day holds 50-400 frauds, and an underfit first epoch can win on
    # it by noise: in the baseline bench's short layout, epoch 0 was picked in 3 of 9 runs, each losing
    # 0.05-0.08 test-week AP against the same seed's later epochs.
    min_epochs: int = 1
    # Validation frauds below which validation picks no epoch and stops nothing: the run trains its whole
    # schedule and exports its last weights (0: validation always picks). See conf/prod's [loop].
    min_validation_frauds: int = 0
    max_consecutive_skips: int = 5  # non-finite steps in a row before the job fails
    threads_per_rank: int = 1  # torch intra-op threads per process (ranks share the cores)
    validate: bool = True  # per-epoch validation (benchmarks measuring throughput turn it off)
    # Validate after every k-th epoch (and the last). Scoring the unsampled validation split costs the
    # same however few rows an epoch samples ([data] negative_sample_rate): with short sampled epochs,
    # validating each one would spend the run's time on scoring instead of optimizer steps.
    validate_every_epochs: int = 1
    # Epochs when [data] negative_sample_rate < 1 (0: `epochs`). Each draws fresh genuine rows, so
    # more, shorter epochs give the optimizer steps AP needs while still costing a share of a full run.
    sampled_epochs: int = 0
    # validate_every_epochs when sampling (0: validate_every_epochs).
    sampled_validate_every_epochs: int = 0
    # Share of the genuine validation rows a per-epoch validation scores (1: the whole split). Below 1 it
    # scores every validation fraud and a seeded sample of the genuine rows, the same rows every epoch,
    # each kept genuine row weighing 1 / rate, so AP, AUC-ROC, recall at 1% FPR and the loss are
    # estimates of the whole split's; card precision@100 and ECE need every row and are not recorded.
    # Picking and stopping use that AP; the exported weights are still calibrated, their operating
    # points chosen and the blend judged on the whole split (finalisation).
    validation_negative_rate: float = 1.0
    # validation_negative_rate when [data] negative_sample_rate < 1 (0: validation_negative_rate).
    sampled_validation_negative_rate: float = 0.0

    def validation_sample_rate(self, sampled: bool) -> float:
        """Share of the genuine validation rows each validation scores, on a negative sample or not."""
        return (self.sampled_validation_negative_rate if sampled and self.sampled_validation_negative_rate
                else self.validation_negative_rate)

    def run_epochs(self, sampled: bool) -> int:
        """Epochs of a run, on a negative sample or not."""
        return self.sampled_epochs if sampled and self.sampled_epochs else self.epochs

    def validation_period(self, sampled: bool) -> int:
        """Epochs between validations, on a negative sample or not."""
        return (self.sampled_validate_every_epochs if sampled and self.sampled_validate_every_epochs
                else self.validate_every_epochs)


@dataclass(frozen=True)
class FaultConfig:
    """Injected faults, for the tests of the recovery paths. All off in checked-in configs."""

    nan_loss_at_steps: tuple[int, ...] = ()  # rank 0's loss becomes NaN at these global steps
    sigkill_rank: int = -1  # this rank SIGKILLs itself ...
    sigkill_at_step: int = 0  # ... when reaching this global step, on the first attempt only


@dataclass(frozen=True)
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    # The review budget the finalised model's thresholds are chosen from (on its validation split):
    # they ship with the version, so every later stage (gate, service, monitor) reads them from it.
    decisions: DecisionBudget = field(default_factory=DecisionBudget)
    blend: BlendConfig = field(default_factory=BlendConfig)


def _compression_checks(c: CompressionConfig) -> list[tuple[bool, str]]:
    """(holds, what to fix) for [compression]: options must fit the method they are combined with."""
    topk = c.method.startswith("topk")
    return [
        (0.0 < c.density <= 1.0, f"compression.density must be in (0, 1], got {c.density}"),
        (c.dense_warmup_steps >= 0, "compression.dense_warmup_steps must be >= 0"),
        (c.density <= c.density_warmup_start <= 1.0,
         f"compression.density_warmup_start must be in [density, 1] = [{c.density}, 1], got {c.density_warmup_start} "
         "(the density warm-up decays from it to compression.density)"),
        (c.bucket_cap_mb > 0, "compression.bucket_cap_mb must be > 0 (DDP's default is 25)"),
        (c.quantization_chunk >= 1, "compression.quantization_chunk must be >= 1 (entries per int8 scale)"),
        (c.powersgd_rank >= 1, "compression.powersgd_rank must be >= 1"),
        (c.dense_warmup_exchange == "allreduce" or topk,
         f"compression.dense_warmup_exchange = {c.dense_warmup_exchange!r} applies to the top-k methods only "
         f"(method = {c.method!r} has no top-k warm-up to quantize; PowerSGD's warm-up is torch's all-reduce): "
         "set it to \"allreduce\""),
        (not c.freeze_variance or topk,
         f"compression.freeze_variance applies to the top-k methods only: set it to false for method = {c.method!r}"),
        (not c.freeze_variance or c.dense_warmup_steps >= 1,
         "compression.freeze_variance needs compression.dense_warmup_steps >= 1 (the dense steps estimate "
         "the variance that is then frozen)"),
        (not c.select_by_update or c.freeze_variance,
         "compression.select_by_update needs compression.freeze_variance = true (it ranks entries by the "
         "frozen variance)"),
        (not c.local_clipping or c.method in ("topk_ef", "topk_int8_ef"),
         "compression.local_clipping applies to the top-k methods with error feedback only (it protects "
         f"their residuals); set it to false for method = {c.method!r}"),
    ]


def validate_config(config: TrainConfig, source: str) -> TrainConfig:
    """Reject values that would fail later in a less obvious way."""
    checks = [
        (config.data.global_batch_size > 0, "data.global_batch_size must be > 0"),
        (config.data.bin_fit_rows >= 1, "data.bin_fit_rows must be >= 1"),
        (0.0 < config.data.negative_sample_rate <= 1.0,
         f"data.negative_sample_rate must be in (0, 1] (1 keeps every genuine row), got {config.data.negative_sample_rate}"),
        (config.loop.sampled_epochs >= 0, "loop.sampled_epochs must be >= 0 (0 = loop.epochs)"),
        (config.loop.sampled_validate_every_epochs >= 0,
         "loop.sampled_validate_every_epochs must be >= 0 (0 = loop.validate_every_epochs)"),
        (0.0 < config.loop.validation_negative_rate <= 1.0,
         f"loop.validation_negative_rate must be in (0, 1] (1 scores every validation row), "
         f"got {config.loop.validation_negative_rate}"),
        (0.0 <= config.loop.sampled_validation_negative_rate <= 1.0,
         f"loop.sampled_validation_negative_rate must be in [0, 1] (0 = loop.validation_negative_rate), "
         f"got {config.loop.sampled_validation_negative_rate}"),
        (config.loop.validate_every_epochs >= 1,
         f"loop.validate_every_epochs must be >= 1, got {config.loop.validate_every_epochs}"),
        (config.model.numeric_bins >= 0, "model.numeric_bins must be >= 0 (0 = no piecewise-linear encoding)"),
        (config.model.numeric_embedding_dim >= 1, "model.numeric_embedding_dim must be >= 1"),
        (config.model.ensemble_size >= 1, "model.ensemble_size must be >= 1"),
        (config.model.sequence_hidden >= 0, "model.sequence_hidden must be >= 0 (0 = no sequence encoder)"),
        (config.optim.accumulation_steps >= 1, "optim.accumulation_steps must be >= 1"),
        (0.0 <= config.optim.ema_decay < 1.0, "optim.ema_decay must be in [0, 1) (0 = no weight average)"),
        *_compression_checks(config.compression),
        (config.checkpoint.keep_last >= 1, "checkpoint.keep_last must be >= 1"),
        (config.checkpoint.every_steps >= 1, "checkpoint.every_steps must be >= 1"),
        (config.loop.epochs >= 1, "loop.epochs must be >= 1"),
        (config.loop.min_validation_frauds >= 0,
         f"loop.min_validation_frauds must be >= 0 (0 = validation always picks), "
         f"got {config.loop.min_validation_frauds}"),
        (config.loop.min_epochs >= 1, f"loop.min_epochs must be >= 1 (1 = any validated epoch may be picked), "
                                      f"got {config.loop.min_epochs}"),
        (config.loop.max_consecutive_skips >= 1, "loop.max_consecutive_skips must be >= 1"),
        (config.loop.threads_per_rank >= 1, "loop.threads_per_rank must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"{source}: {message}")
    return config


def load_train_config(env: str | None = None, path: Path | None = None) -> TrainConfig:
    """``conf/<env>/train.toml`` (or an explicit TOML file) as a validated :class:`TrainConfig`."""
    config = load_section(TrainConfig, "train", env, path)
    return validate_config(config, str(path or f"conf/{env or 'default'}/train.toml"))


def train_config_from_dict(table: dict, source: str = "<dict>") -> TrainConfig:
    """Build from a nested dict (e.g. a run's config.json without its world_size/backend keys)."""
    return validate_config(from_dict(TrainConfig, table, source=source), source)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def write_train_toml(table: dict[str, dict], path: Path) -> Path:
    """Write a nested ``{slice: {key: value}}`` dict as a train.toml (benchmarks and tests derive
    their configs from the checked-in one this way). Validated first, so a bad override fails here."""
    train_config_from_dict(table, source=str(path))
    lines = []
    for section, values in table.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    write_text_atomic(path, "\n".join(lines))  # the night's ledger keeps it: a rerun must not find half a file
    return path


def derive_train_config(env: str, overrides: dict[str, dict] | None = None) -> dict[str, dict]:
    """``conf/<env>/train.toml`` as a nested dict with per-slice ``overrides`` applied."""
    from pipeline.config import to_dict

    table = to_dict(load_train_config(env))
    for section, values in (overrides or {}).items():
        table[section].update(values)
    return table
