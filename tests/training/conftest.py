from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.datasets.manifest import DatasetManifest, load_manifest
from tests.training.dataset_factory import write_tiny_dataset


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Root of a small published dataset (read-only for tests)."""
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny-dataset"))


@pytest.fixture(scope="session")
def tiny_manifest(tiny_dataset: Path) -> DatasetManifest:
    return load_manifest(tiny_dataset)
