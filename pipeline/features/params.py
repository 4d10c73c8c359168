"""The knobs of the label-derived features (``[features]`` in ingest.toml).

One definition for every side that computes features: the Spark build
(:mod:`pipeline.features.transforms`), the pandas frame (:mod:`pipeline.features.frame`) and the
scorer's online state (:mod:`pipeline.features.online`). Kept apart from the Spark code so that
the scoring service never imports Spark.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.features.kernel import US_PER_SECOND


@dataclass(frozen=True)
class FeatureParams:
    """Knobs of the label-derived features (``[features]`` in ingest.toml)."""

    # A fraud report is usable by features only this long after reported_at (case-handling lag).
    label_delay_hours: float = 24.0
    # A report counts toward its merchant's fraud rate only if its transaction happened at most this
    # long before the report (bounds how far back the raw store is read to find the merchant).
    label_match_days: int = 90

    @property
    def label_delay_us(self) -> int:
        return int(self.label_delay_hours * 3600 * US_PER_SECOND)
