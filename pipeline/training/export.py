"""Rebuild a FraudModel from a checkpoint directory and export it with ``save_model``.

The registry's ``rollback --from-checkpoint`` uses :func:`export_model_from_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path

from models.fraud_mlp import FraudModel, FraudModelConfig, save_model
from models.gbm import load_gbm_term
from pipeline.atomic import staged_dir
from pipeline.training.calibration import Calibration, apply_calibration
from pipeline.training.checkpoint import (
    CALIBRATION_FILE,
    MODEL_CONFIG_FILE,
    TRAINER_FILE,
    CheckpointError,
    load_tensor_file,
)


def load_checkpoint_model(checkpoint_dir: Path, apply_stored_calibration: bool = True) -> FraudModel:
    """The checkpoint's weights (normalisation buffers included) in eval mode, on CPU; with the
    stored calibration folded in when the checkpoint has one (``best/`` after training)."""
    checkpoint_dir = Path(checkpoint_dir)
    for name in (MODEL_CONFIG_FILE, TRAINER_FILE):
        if not (checkpoint_dir / name).is_file():
            raise CheckpointError(f"{checkpoint_dir} is not a training checkpoint (no {name}); pass a "
                                  "<run_dir>/checkpoints/step-NNNNNNNN or .../best directory")
    config = FraudModelConfig.from_json((checkpoint_dir / MODEL_CONFIG_FILE).read_text())
    model = FraudModel(config)
    model.load_state_dict(load_tensor_file(checkpoint_dir / TRAINER_FILE)["model"])
    calibration_file = checkpoint_dir / CALIBRATION_FILE
    if apply_stored_calibration and calibration_file.is_file():
        stored = load_tensor_file(calibration_file)
        apply_calibration(model, Calibration(float(stored["temperature"]), float(stored["logit_shift"])))
        model.gbm = load_gbm_term(checkpoint_dir)  # a blend's booster, weighted by that same calibration
    return model.eval()


def export_model_from_checkpoint(checkpoint_dir: Path, out_dir: Path) -> Path:
    """Publish the checkpoint's model (calibrated when the checkpoint has a calibration) as
    ``out_dir``, whole (:func:`pipeline.atomic.staged_dir`): it replaces any previous ``out_dir``."""
    model = load_checkpoint_model(checkpoint_dir)
    with staged_dir(Path(out_dir)) as staging:
        save_model(model, staging)
    return Path(out_dir)
