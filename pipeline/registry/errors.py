"""Named failures of the registry layer. Every one means "nothing was changed": the CLI maps them to
exit code 1 with the message, and ``champion`` is only ever moved after all of them had their chance.
"""

from __future__ import annotations

# One class for "not a usable training checkpoint", owned by the run-directory contract (torch-free,
# so importing it here keeps the command line fast); re-exported for the registry's callers. It is
# not a RegistryError (training raises it too): callers that map expected failures catch both.
from pipeline.training.run_dir import CheckpointError  # noqa: F401


class RegistryError(RuntimeError):
    """Base class: an expected failure whose message tells the operator what to do."""


class TrackingUnavailable(RegistryError):
    """The MLflow tracking server / store cannot be reached or read."""


class RunDirError(RegistryError):
    """A training run directory is incomplete or unreadable (unfinished run, missing model)."""


class NoChallenger(RegistryError):
    """The registered model has no ``challenger`` version to gate."""


class NoChampion(RegistryError):
    """An operation needs a ``champion`` (or ``previous-champion``) that the registry does not have."""


class ModelLoadError(RegistryError):
    """A model URI does not resolve, or its artifacts are missing or corrupt."""


class SignatureMismatch(RegistryError):
    """A model's input signature does not match the dataset's columns or types."""


class DatasetError(RegistryError):
    """A published dataset (or the requested window of it) cannot be read."""


class LockTimeout(RegistryError):
    """Another promotion or rollback holds the registry lock for too long."""
