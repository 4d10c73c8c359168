"""Training job entry point, one process per rank under torchrun.

    torchrun --nproc-per-node 2 jobs/train.py --env dev --run-dir .state/runs/r1 --dataset-root ...

Exit codes: 0 trained (summary.json written); 1 training failed (message on stderr: diverged,
replicas mismatched, a corrupt checkpoint); 2 the job cannot run as configured (bad arguments or
config, missing or unusable dataset, batch geometry, run directory in use: see
pipeline/training/preflight.py), and no retry can help. torchrun restarts failed workers up to
--max-restarts whatever the code; ``fraudctl train`` runs the same checks before it starts torchrun.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

# torchrun runs this file as a script: make the project importable without an install.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.training.checkpoint import CheckpointError  # noqa: E402
from pipeline.training.config import load_train_config  # noqa: E402
from pipeline.training.distributed import (  # noqa: E402
    ReplicaMismatch,
    destroy_distributed,
    init_distributed,
    log_rank,
)
from pipeline.training.preflight import (  # noqa: E402
    CANNOT_START_ERRORS,
    EXIT_CANNOT_START,
    check_startable,
    resolve_dataset_root,
)
from pipeline.training.trainer import Trainer, TrainingDiverged  # noqa: E402

# Failures of a run that had started (exit 1; a restart resumes from the last checkpoint).
RUN_FAILURES = (CheckpointError, ReplicaMismatch, TrainingDiverged)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default=None, help="read conf/<env>/train.toml (default $FRAUD_ENV or dev)")
    parser.add_argument("--config", type=Path, default=None, help="explicit train.toml (wins over --env)")
    parser.add_argument("--run-dir", type=Path, required=True, help="the run directory (see run_dir_contract)")
    parser.add_argument("--dataset-root", default=None,
                        help="dataset root holding manifests/ (default: data.dataset_root of the config)")
    parser.add_argument("--no-resume", action="store_true", help="refuse to continue existing checkpoints")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_train_config(args.env, args.config)
        if args.no_resume:
            config = dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, resume=False))
        dataset_root = resolve_dataset_root(config, args.dataset_root)
        env = init_distributed()
        try:
            check_startable(config, dataset_root, env.world_size)
            Trainer(config, args.run_dir, dataset_root, env).train()
        finally:
            destroy_distributed()
    except CANNOT_START_ERRORS as exc:
        log_rank(f"training failed: {type(exc).__name__}: {exc}")
        return EXIT_CANNOT_START
    except RUN_FAILURES as exc:
        log_rank(f"training failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
