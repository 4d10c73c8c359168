"""The only code that moves ``champion`` and ``previous-champion`` (callers hold the registry lock).

``previous-champion`` is an undo stack of depth one per version: whenever ``champion`` moves forward
(promotion, rollback to a chosen version or checkpoint) the new champion remembers its predecessor in
the version tag ``fraud.previous_champion`` and ``previous-champion`` points at it. Rolling back moves
``champion`` to ``previous-champion`` and ``previous-champion`` to *that* version's predecessor, so
repeated rollbacks walk back through history instead of toggling between the last two versions.

Write order keeps a crash between two alias writes harmless: moving forward sets
``previous-champion`` first (the old champion stays live; re-run the gate), reverting sets
``champion`` first (the right model is live; ``previous-champion`` then equals ``champion`` and a
further rollback asks for ``--to-version`` instead of skipping a version).
"""

from __future__ import annotations

from mlflow import MlflowClient

from pipeline.registry.store import CHAMPION, PREVIOUS_CHAMPION, version_by_alias

PREDECESSOR_TAG = "fraud.previous_champion"


def current_champion(client: MlflowClient, model_name: str) -> int | None:
    version = version_by_alias(client, model_name, CHAMPION)
    return int(version.version) if version else None


def previous_champion(client: MlflowClient, model_name: str) -> int | None:
    version = version_by_alias(client, model_name, PREVIOUS_CHAMPION)
    return int(version.version) if version else None


def advance_champion(client: MlflowClient, model_name: str, to_version: int, from_version: int | None) -> None:
    """Make ``to_version`` champion, remembering ``from_version`` as its predecessor."""
    if from_version is not None:
        client.set_model_version_tag(model_name, str(to_version), PREDECESSOR_TAG, str(from_version))
        client.set_registered_model_alias(model_name, PREVIOUS_CHAMPION, str(from_version))
    client.set_registered_model_alias(model_name, CHAMPION, str(to_version))


def revert_champion(client: MlflowClient, model_name: str, to_version: int) -> int | None:
    """Make ``to_version`` (the previous champion) champion again; returns the new previous-champion."""
    tag = client.get_model_version(model_name, str(to_version)).tags.get(PREDECESSOR_TAG)
    predecessor = int(tag) if tag and tag.isdigit() and int(tag) != to_version else None
    client.set_registered_model_alias(model_name, CHAMPION, str(to_version))
    if predecessor is None:
        client.delete_registered_model_alias(model_name, PREVIOUS_CHAMPION)
    else:
        client.set_registered_model_alias(model_name, PREVIOUS_CHAMPION, str(predecessor))
    return predecessor
