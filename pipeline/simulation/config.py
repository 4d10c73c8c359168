"""Simulator settings (``conf/<env>/simulation[.<preset>].toml``): population, window, fraud mix and
shapes, drift, label noise.

``seed`` and ``start_date`` fix the random stream of a window; ``seed`` alone fixes the card and
merchant population, the fraud rings' merchant campaigns and the drift of the fraud mix (all keyed
to calendar days), so consecutive windows (nightly runs) continue the same story.

Presets: ``simulation.toml`` is the default portfolio; ``simulation.<preset>.toml`` next to it is
another one (different population, fraud mix and seed), chosen by ``preset=`` or ``$FRAUD_SIM_PRESET``.

Settings added after transaction ids were first minted are declared with :func:`later_setting`: left
at their default they stay out of :func:`config_fingerprint`, so a preset that does not use them
keeps the ids (and the whole output) it had before they existed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from pipeline.config import ConfigError, conf_dir, load_section

# Fraud pattern names; the order is the code stored in event blocks. ``GENUINE`` is not a pattern.
GENUINE = "genuine"
# New patterns go at the end: the code of every earlier one stays what it was.
PATTERNS = ("card_testing", "account_takeover", "compromised_merchant", "geo_impossible", "amount_threshold",
            "low_and_slow", "compromise_window")
PRESET_ENV_VAR = "FRAUD_SIM_PRESET"
_PRESET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_LATER = "later_setting"  # field metadata key, see later_setting()


def later_setting(default: Any) -> Any:
    """A setting added after transaction ids were first minted: at ``default`` it is left out of
    :func:`config_fingerprint`, so the presets that leave it there keep their ids. Its default must
    also leave the simulator's output as it was (a pattern weight of 0, an amplitude of 0, ...)."""
    return field(default=default, metadata={_LATER: True})


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

    card_testing: float = 0.22
    account_takeover: float = 0.20
    compromised_merchant: float = 0.15
    geo_impossible: float = 0.08
    amount_threshold: float = 0.20
    low_and_slow: float = 0.15
    compromise_window: float = later_setting(0.0)

    def weights(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in PATTERNS}


@dataclass(frozen=True)
class PopulationConfig:
    """How the portfolio's cardholders spend, including the genuine behaviour that looks like fraud."""

    median_amount_eur: float = 35.0  # population median of a card's typical payment
    online_share: float = 0.25  # mean share of card-not-present payments (beta-spread per card)
    travel_day_share: float = 0.04  # mean share of days a card spends abroad
    far_trip_share: float = 0.25  # of travel days, spent outside Europe
    night_owl_share: float = 0.10  # cards whose payments cluster around midnight
    big_purchase_rate: float = 0.01  # per card and day: a one-off purchase of several times the usual ticket
    micro_burst_rate: float = 0.01  # per card and day: a few in-app purchases of a euro or two within an hour
    # Per card and day: a few days of changed habits (a holiday, a move): other hours, other shops,
    # bigger tickets, on the card's own devices; what a compromise window looks like but for who pays.
    episode_rate: float = later_setting(0.0)


@dataclass(frozen=True)
class FraudShapeConfig:
    """Knobs of individual patterns (see :mod:`pipeline.simulation.patterns`)."""

    threshold_amount: float = 250.0  # amount_threshold fraud is above this (merchant's currency), at targeted shops
    threshold_merchant_share: float = 0.05  # of resellable web shops, targeted at any one time
    campaign_days: int = 14  # how long a merchant stays skimmed or targeted before the ring moves on
    card_test_cashout_share: float = 0.5  # card-testing bursts followed by one large purchase
    # Zero-amount authorisations (card verification) in card-testing bursts. Off: the event contract
    # requires amount > 0 until it accepts 0; tests are then tiny positive amounts only.
    zero_amount_card_tests: bool = False
    compromise_days: int = later_setting(4)  # a compromised card is used for 2 to this many days
    compromise_payments_per_day: float = later_setting(2.5)  # mean fraud payments on each of them (>= 1)
    compromise_in_person_share: float = later_setting(0.4)  # windows cashed out with a cloned card (else online)


@dataclass(frozen=True)
class DriftConfig:
    """Change over weeks, keyed to calendar days (so nightly windows continue it)."""

    fraud_mix_amplitude: float = 0.6  # each pattern's share is scaled by exp(amplitude * a slow wave)
    genuine_amount_amplitude: float = 0.08  # seasonal swing of genuine tickets (peak in mid-December)
    # Each calendar week's fraud rate is fraud_rate * exp(amplitude * u), u uniform in [-1, 1] per week.
    fraud_rate_amplitude: float = later_setting(0.0)


@dataclass(frozen=True)
class SimulationConfig:
    seed: int = 7
    start_date: str = "2026-01-01"  # YYYY-MM-DD, UTC midnight opens the window
    days: int = 7
    num_cards: int = 20_000
    num_merchants: int = 2_000
    tx_per_card_per_day: float = 1.5  # population mean of each card's daily rate (gamma-spread)
    fraud_rate: float = 0.005  # fraud share of all transactions in the window
    unreported_fraud_share: float = 0.12  # fraud incidents nobody ever reports (label noise)
    cleared_report_rate: float = 0.002  # genuine payments that get an is_fraud=false manual review
    false_report_rate: float = 0.0005  # genuine payments wrongly disputed as fraud (label noise)
    false_report_cleared_share: float = 0.6  # of those, later cleared by a manual review (is_fraud=false)
    label_delay: LabelDelayConfig = field(default_factory=LabelDelayConfig)
    pattern_mix: PatternMix = field(default_factory=PatternMix)
    population: PopulationConfig = field(default_factory=PopulationConfig)
    fraud_shapes: FraudShapeConfig = field(default_factory=FraudShapeConfig)
    drift: DriftConfig = field(default_factory=DriftConfig)

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
        for key in ("unreported_fraud_share", "cleared_report_rate", "false_report_rate",
                    "false_report_cleared_share"):
            _require(0 <= getattr(self, key) <= 1, key, getattr(self, key), "in [0, 1]")
        weights = self.pattern_mix.weights()
        _require(all(w >= 0 for w in weights.values()) and sum(weights.values()) > 0, "pattern_mix", weights,
                 "non-negative with a positive sum")
        delay = self.label_delay
        _require(min(delay.fraud_median_days, delay.cleared_median_days) > 0, "label_delay medians",
                 (delay.fraud_median_days, delay.cleared_median_days), "> 0")
        self._validate_population()
        shapes = self.fraud_shapes
        _require(shapes.threshold_amount > 0, "fraud_shapes.threshold_amount", shapes.threshold_amount, "> 0")
        _require(0 < shapes.threshold_merchant_share <= 1, "fraud_shapes.threshold_merchant_share",
                 shapes.threshold_merchant_share, "in (0, 1]")
        _require(shapes.campaign_days >= 1, "fraud_shapes.campaign_days", shapes.campaign_days, ">= 1")
        _require(0 <= shapes.card_test_cashout_share <= 1, "fraud_shapes.card_test_cashout_share",
                 shapes.card_test_cashout_share, "in [0, 1]")
        _require(0 <= self.drift.fraud_mix_amplitude <= 3, "drift.fraud_mix_amplitude",
                 self.drift.fraud_mix_amplitude, "in [0, 3]")
        _require(0 <= self.drift.genuine_amount_amplitude < 1, "drift.genuine_amount_amplitude",
                 self.drift.genuine_amount_amplitude, "in [0, 1)")
        amplitude = self.drift.fraud_rate_amplitude
        _require(0 <= amplitude <= 2 and self.fraud_rate * math.exp(amplitude) < 0.5, "drift.fraud_rate_amplitude",
                 amplitude, "in [0, 2] with fraud_rate * exp(amplitude) < 0.5")
        _require(shapes.compromise_days >= 2, "fraud_shapes.compromise_days", shapes.compromise_days, ">= 2")
        _require(shapes.compromise_payments_per_day >= 1, "fraud_shapes.compromise_payments_per_day",
                 shapes.compromise_payments_per_day, ">= 1")
        _require(0 <= shapes.compromise_in_person_share <= 1, "fraud_shapes.compromise_in_person_share",
                 shapes.compromise_in_person_share, "in [0, 1]")

    def _validate_population(self) -> None:
        pop = self.population
        _require(pop.median_amount_eur > 0, "population.median_amount_eur", pop.median_amount_eur, "> 0")
        for key in ("online_share", "travel_day_share"):
            _require(0 < getattr(pop, key) < 1, f"population.{key}", getattr(pop, key), "in (0, 1)")
        for key in ("far_trip_share", "night_owl_share", "big_purchase_rate", "micro_burst_rate", "episode_rate"):
            _require(0 <= getattr(pop, key) <= 1, f"population.{key}", getattr(pop, key), "in [0, 1]")

    @property
    def window_start(self) -> date:
        return date.fromisoformat(self.start_date)


def _require(ok: bool, key: str, value: object, rule: str) -> None:
    if not ok:
        raise ConfigError(f"simulation.{key} must be {rule}, got {value!r}; fix conf/<env>/simulation.toml "
                          f"or the CLI option")


def load_simulation_config(env: str | None = None, preset: str | None = None) -> SimulationConfig:
    """``conf/<env>/simulation.toml``, or ``simulation.<preset>.toml`` when a preset is named (argument
    first, then ``$FRAUD_SIM_PRESET``), as a validated :class:`SimulationConfig`."""
    preset = preset or os.environ.get(PRESET_ENV_VAR) or None
    if preset is None:
        return load_section(SimulationConfig, "simulation", env)
    if not _PRESET_NAME.match(preset):
        raise ConfigError(f"simulation preset {preset!r} must be lower-case letters, digits, '-' or '_'")
    directory = conf_dir(env)
    path = directory / f"simulation.{preset}.toml"
    if not path.is_file():
        known = sorted(p.name.removeprefix("simulation.").removesuffix(".toml")
                       for p in directory.glob("simulation.*.toml"))
        raise ConfigError(f"simulation preset {preset!r}: no {path} (presets there: {', '.join(known) or 'none'}); "
                          f"fix ${PRESET_ENV_VAR} or the preset option")
    return load_section(SimulationConfig, "simulation", env, path=path)


def config_fingerprint(config: SimulationConfig) -> str:
    """Short stable hash of every setting (a :func:`later_setting` only when set away from its
    default): part of transaction ids, so distinct windows never collide."""
    settings = dataclasses.asdict(config)
    _drop_unset_later_settings(config, settings)
    text = repr(sorted(settings.items()))
    return hashlib.blake2b(text.encode(), digest_size=3).hexdigest()


def _drop_unset_later_settings(config: Any, settings: dict[str, Any]) -> None:
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get(_LATER) and value == f.default:
            del settings[f.name]
        elif dataclasses.is_dataclass(value):
            _drop_unset_later_settings(value, settings[f.name])
