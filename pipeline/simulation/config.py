"""Simulator settings (``conf/<env>/simulation.toml``): population size, window, fraud mix, label timing.

``seed`` and ``start_date`` fix the random stream of a window; ``seed`` alone fixes the card and
merchant population, so consecutive windows (nightly runs) see the same cards.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from datetime import date

from pipeline.config import ConfigError, load_section

# Fraud pattern names; the order is the code stored in event blocks. ``GENUINE`` is not a pattern.
GENUINE = "genuine"
PATTERNS = ("card_testing", "account_takeover", "compromised_merchant", "geo_impossible")


@dataclass(frozen=True)
class LabelDelayConfig:
    """Report delays, lognormal in days: ``median * exp(sigma * N(0, 1))``."""

    fraud_median_days: float = 5.0  # chargebacks and customer reports arrive days after the fraud
    fraud_sigma: float = 0.8
    cleared_median_days: float = 2.0  # manual reviews that clear a flagged genuine payment
    cleared_sigma: float = 0.6


@dataclass(frozen=True)
class PatternMix:
    """Share of fraud *transactions* per pattern (normalised; 0 switches a pattern off)."""

    card_testing: float = 0.30
    account_takeover: float = 0.30
    compromised_merchant: float = 0.25
    geo_impossible: float = 0.15

    def weights(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in PATTERNS}


@dataclass(frozen=True)
class SimulationConfig:
    seed: int = 7
    start_date: str = "2026-01-01"  # YYYY-MM-DD, UTC midnight opens the window
    days: int = 7
    num_cards: int = 20_000
    num_merchants: int = 2_000
    tx_per_card_per_day: float = 1.5  # population mean of each card's daily rate (gamma-spread)
    fraud_rate: float = 0.005  # fraud share of all transactions in the window
    unreported_fraud_share: float = 0.10  # fraud incidents nobody ever reports (label noise)
    cleared_report_rate: float = 0.002  # genuine payments that get an is_fraud=false manual review
    label_delay: LabelDelayConfig = field(default_factory=LabelDelayConfig)
    pattern_mix: PatternMix = field(default_factory=PatternMix)

    def __post_init__(self) -> None:
        try:
            date.fromisoformat(self.start_date)
        except ValueError as exc:
            raise ConfigError(f"simulation.start_date must be YYYY-MM-DD, got {self.start_date!r}") from exc
        _require(self.days >= 1, "days", self.days, ">= 1")
        _require(self.num_cards >= 100, "num_cards", self.num_cards, ">= 100")
        _require(self.num_merchants >= 100, "num_merchants", self.num_merchants, ">= 100")
        _require(self.tx_per_card_per_day > 0, "tx_per_card_per_day", self.tx_per_card_per_day, "> 0")
        _require(0 <= self.fraud_rate < 0.5, "fraud_rate", self.fraud_rate, "in [0, 0.5)")
        _require(0 <= self.unreported_fraud_share <= 1, "unreported_fraud_share", self.unreported_fraud_share,
                 "in [0, 1]")
        _require(0 <= self.cleared_report_rate <= 1, "cleared_report_rate", self.cleared_report_rate, "in [0, 1]")
        weights = self.pattern_mix.weights()
        _require(all(w >= 0 for w in weights.values()) and sum(weights.values()) > 0, "pattern_mix", weights,
                 "non-negative with a positive sum")
        delay = self.label_delay
        _require(min(delay.fraud_median_days, delay.cleared_median_days) > 0, "label_delay medians",
                 (delay.fraud_median_days, delay.cleared_median_days), "> 0")

    @property
    def window_start(self) -> date:
        return date.fromisoformat(self.start_date)


def _require(ok: bool, key: str, value: object, rule: str) -> None:
    if not ok:
        raise ConfigError(f"simulation.{key} must be {rule}, got {value!r}; fix conf/<env>/simulation.toml "
                          f"or the CLI option")


def load_simulation_config(env: str | None = None) -> SimulationConfig:
    """``conf/<env>/simulation.toml`` as a validated :class:`SimulationConfig`."""
    return load_section(SimulationConfig, "simulation", env)


def config_fingerprint(config: SimulationConfig) -> str:
    """Short stable hash of every setting: part of transaction ids, so distinct windows never collide."""
    text = repr(sorted(dataclasses.asdict(config).items()))
    return hashlib.blake2b(text.encode(), digest_size=3).hexdigest()
