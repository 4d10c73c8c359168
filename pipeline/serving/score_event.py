"""What the service publishes to the scores topic for every decision (key: ``transaction_id``).

One definition, written by :mod:`pipeline.serving.publisher` and read back by
:mod:`pipeline.serving.consistency` and the live-model monitor (:mod:`pipeline.monitoring.join`). Feature values are JSON numbers written as the shortest
decimal that round-trips, so reading them back gives the exact float64 the model saw. Encoded with
msgspec (one event: 6 us against the json module's 42, on every decision the service makes);
non-finite numbers are refused, as JSON has none.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import msgspec

SCORE_EVENT_VERSION = 1


@dataclass(frozen=True)
class ShadowScore:
    """The challenger's opinion on the same features: logged, never decides."""

    model_version: int
    score: float
    decision: str


@dataclass(frozen=True)
class ScoreEvent:
    transaction_id: str
    card_id: str
    event_time: str  # as the request carried it (RFC 3339)
    model_version: int
    score: float
    decision: str  # allow | review | block
    decided_by: str  # blocklist | allowlist | score | no_score
    rules: tuple[str, ...]  # rule hits, e.g. "blocklist:card=card-42"
    thresholds: tuple[str, ...]  # thresholds the score reached
    features: dict[str, float | int]  # the model's inputs, FEATURE_COLUMNS order
    scored_at: str  # RFC 3339, the service's clock
    shadow: ShadowScore | None = None
    schema_version: int = field(default=SCORE_EVENT_VERSION)
    # The version's operating points the score was judged at (None in events written before they
    # existed): what the monitor measures recall and precision at, whatever the rules decided.
    review_threshold: float | None = None
    block_threshold: float | None = None
    # The score as a probability at the live fraud prior (pipeline.decisions.prior_tracking); None
    # when the version does not track one.
    probability: float | None = None

    def to_json(self) -> bytes:
        # Not dataclasses.asdict(self): it deep-copies the features of every decision first.
        body = {name: getattr(self, name) for name in _FIELDS}
        body["shadow"] = None if self.shadow is None else asdict(self.shadow)
        if not (math.isfinite(self.score) and all(map(math.isfinite, self.features.values()))):
            raise ValueError(f"score event of {self.transaction_id} has a non-finite score or feature: {body}")
        return _ENCODER.encode(body)

    @staticmethod
    def from_json(data: bytes | str) -> ScoreEvent:
        d: dict[str, Any] = json.loads(data)
        shadow = d.pop("shadow", None)
        return ScoreEvent(**{**d, "rules": tuple(d["rules"]), "thresholds": tuple(d["thresholds"]),
                             "shadow": ShadowScore(**shadow) if shadow else None})


_FIELDS = tuple(f.name for f in fields(ScoreEvent))
_ENCODER = msgspec.json.Encoder()
