"""Small manifested datasets and training configs for the training tests (no ingest needed)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pipeline.config import PROJECT_ROOT
from pipeline.training.config import derive_train_config, write_train_toml
from pipeline.training.synthetic import SyntheticSpec, write_synthetic_dataset

# 4 train days x 600 rows, 2 shards a day: 8 train shards (divisible by 1, 2 and 4 ranks).
TINY_SPEC = SyntheticSpec(train_days=4, validation_days=1, test_days=1, rows_per_day=600, shards_per_date=2,
                          row_group_rows=100, num_cards=400, seed=11)

# A model and loop small enough that a 2-process run takes seconds on 2 shared cores.
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "data": {"global_batch_size": 256, "shuffle_window_rows": 300},
    "model": {"embedding_dim": 2, "hidden_dim": 16, "num_blocks": 1, "dropout": 0.1},
    "schedule": {"warmup_steps": 3},
    "compression": {"method": "topk_ef", "density": 0.05, "dense_warmup_steps": 2, "density_warmup_epochs": 0.5},
    "checkpoint": {"every_steps": 4, "keep_last": 2},
    # A sampled run as long as an unsampled one and validated every epoch, unless a test says otherwise.
    "loop": {"epochs": 2, "log_every": 1, "checksum_every": 3, "early_stop_patience": 5, "sampled_epochs": 0,
             "sampled_validate_every_epochs": 0, "sampled_validation_negative_rate": 0},
}


def write_tiny_dataset(root: Path, spec: SyntheticSpec = TINY_SPEC) -> Path:
    write_synthetic_dataset(root, spec)
    return root


def train_config_dict(overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """conf/dev/train.toml as a dict, with TINY_OVERRIDES and then ``overrides`` applied per slice."""
    table = derive_train_config("dev", TINY_OVERRIDES)
    for section, values in (overrides or {}).items():
        table[section].update(values)
    return table


def write_conf_dir(directory: Path, overrides: dict[str, dict[str, Any]] | None = None) -> Path:
    """A conf directory (for $FRAUD_CONF_DIR) whose train.toml is the tiny config plus ``overrides``;
    registry.toml is conf/dev's (``fraudctl train`` registers finished runs)."""
    write_train_toml(train_config_dict(overrides), directory / "train.toml")
    shutil.copy(PROJECT_ROOT / "conf" / "dev" / "registry.toml", directory / "registry.toml")
    return directory
