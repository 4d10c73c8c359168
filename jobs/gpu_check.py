"""``make gpu-check``: train a few hundred steps on one GPU and print samples/s.

Runs the real job (torchrun, nccl, bf16 autocast, top-k hook) on a synthetic manifested dataset in
a temporary directory. Exit codes: 0 trained; 1 the job failed; 2 no CUDA device here.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from pipeline.training.config import derive_train_config, write_train_toml  # noqa: E402
from pipeline.training.launch import Torchrun, TrainingJobFailed, run_training  # noqa: E402
from pipeline.training.synthetic import SyntheticSpec, write_synthetic_dataset  # noqa: E402

STEPS = 300
SPEC = SyntheticSpec(train_days=10, validation_days=2, test_days=1, rows_per_day=100_000, shards_per_date=4,
                     row_group_rows=65_536, num_cards=200_000)


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine; run it where `nvidia-smi` shows a GPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dataset"
        write_synthetic_dataset(root, SPEC)
        config = write_train_toml(derive_train_config("prod", {
            "data": {"global_batch_size": 16384},
            "checkpoint": {"every_steps": 100},
            "loop": {"epochs": 100, "max_steps": STEPS, "log_every": 50},
        }), Path(tmp) / "train.toml")
        try:
            summary = run_training(None, Path(tmp) / "run", root, Torchrun(nproc_per_node=1), config_path=config)
        except TrainingJobFailed as exc:
            print(f"gpu-check: {exc}", file=sys.stderr)
            return 1
    print(f"gpu-check: {torch.cuda.get_device_name(0)}, backend {summary.backend}, {summary.global_step} steps, "
          f"{summary.train_samples_per_s:,.0f} samples/s, validation AUC {summary.best_metrics['auc_roc']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
