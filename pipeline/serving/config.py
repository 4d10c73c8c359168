"""The scoring service's config slice (``conf/<env>/serving.toml``), one dataclass per component.

The HTTP layer gets :class:`ServerConfig`, the model reloader :class:`ModelConfig`, the fusion
policy and the choice of thresholds :class:`DecisionConfig`, the realised rates and their health
check :class:`AlertsConfig`, the rule book :class:`RulesConfig`, the online-feature feed
:class:`StreamConfig`, the timing rules on scored payments :class:`TimeRulesConfig`, the score
publisher :class:`ScoresConfig`, the admin endpoints :class:`AdminConfig`, the process's share of a
partitioned tier :class:`PartitionConfig`, the tier's router (``fraudctl route``)
:class:`RouterConfig`. Where the model comes from (registry URI, model name), which Kafka cluster
and topics, the label delay of the features, the timing bounds and where the raw store lives are
*not* repeated here: they come from ``registry.toml``, ``kafka.toml`` and ``ingest.toml`` (one
definition each). Loading checks ``[stream] expiry_margin_hours`` against ingest.toml's lateness bound
(:func:`expiry_margin_floor_hours`): the service accepts a payment that late, so its state must hold
that payment's whole history.

Connection settings: ``$FRAUD_SERVING_HOST`` / ``$FRAUD_SERVING_PORT`` (and ``--host`` / ``--port``)
win over the file, and the admin token is read from ``$FRAUD_SERVING_ADMIN_TOKEN`` so that it never
has to be checked in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.config import ConfigError, env_override, load_section
from pipeline.decisions.prior_tracking import PriorTrackingConfig
from pipeline.decisions.review_tracking import ReviewTrackingConfig
from pipeline.ingest.config import RawStoreConfig, load_ingest_config
from pipeline.paths import resolve_state_path

ADMIN_TOKEN_ENV = "FRAUD_SERVING_ADMIN_TOKEN"


@dataclass(frozen=True)
class ServerConfig:
    """Where the service listens and how much it accepts per request."""

    host: str = env_override("FRAUD_SERVING_HOST", "127.0.0.1")  # loopback unless deliberately exposed
    port: int = env_override("FRAUD_SERVING_PORT", 8080)
    max_body_bytes: int = 16_384  # POST /score: one transaction is ~300 bytes; anything far bigger is abuse
    max_batch_bytes: int = 1_048_576  # POST /score/batch
    max_batch_items: int = 500
    limit_concurrency: int = 512  # open connections beyond this get 503 from uvicorn instead of queueing
    freeze_heap: bool = False  # once started and seeded, freeze start-up's objects out of GC (serving.heap)


@dataclass(frozen=True)
class ModelConfig:
    """How the champion is followed and used."""

    poll_interval_s: float = 10.0  # how often the champion alias is read from the registry
    shadow: bool = False  # also score the challenger (logged and published, never decides)
    warmup_rows: int = 64  # rows scored by a freshly loaded model before it takes traffic
    explain_top_k: int = 3  # features reported per decision (0: no attribution, one forward per request)
    # Payments scoring below this and below the version's review threshold get no feature attribution
    # (their occlusion rows cost ~30x the score itself): every payment the score flags is explained. 0: all.
    explain_min_score: float = 0.5
    torch_threads: int = 1  # the scoring thread's forwards run beside the event loop, which needs a core


ThresholdPolicy = Literal["version", "config"]
MissingPointsPolicy = Literal["config", "refuse"]
MAX_RATE_WINDOW_S = 86_400  # the rate ring holds one bucket per second of the longest window


@dataclass(frozen=True)
class DecisionConfig:
    """Which thresholds the fusion policy (:mod:`pipeline.serving.decision`) applies to the calibrated
    score, and the allowlist's limit (see :mod:`pipeline.serving.thresholds`)."""

    # "version": each version's operating points (chosen from its review budget when its run was
    # finalised); "config": review_threshold / block_threshold below for every version (an override).
    thresholds: ThresholdPolicy = "version"
    # A version packaged before operating points existed: "config" serves it with the thresholds below
    # (warning logged, shown on /health); "refuse" does not load it (the live version keeps serving).
    without_operating_points: MissingPointsPolicy = "config"
    review_threshold: float = 0.5  # at or above: send to manual review (only as the override or the fallback)
    block_threshold: float = 0.9  # at or above: decline (likewise)
    # An allow-listed card/merchant/device is allowed unless its score is at least this extreme;
    # then the thresholds decide as for anyone else (a compromised VIP card is still a stolen card).
    allowlist_override: float = 0.99
    # A version's review threshold held at its budget on its own live scores (see
    # pipeline.decisions.review_tracking); only for thresholds that come with a budget.
    review_tracking: ReviewTrackingConfig = field(default_factory=ReviewTrackingConfig)
    # The probability served beside the score, moved to the fraud rate of the last days' live scores
    # (see pipeline.decisions.prior_tracking); decisions stay on the score.
    prior_tracking: PriorTrackingConfig = field(default_factory=PriorTrackingConfig)

    def __post_init__(self) -> None:
        if not 0.0 <= self.review_threshold <= self.block_threshold <= self.allowlist_override <= 1.0:
            raise ConfigError("serving decision thresholds must satisfy 0 <= review_threshold <= block_threshold "
                              f"<= allowlist_override <= 1, got {self.review_threshold}, {self.block_threshold}, "
                              f"{self.allowlist_override}")


@dataclass(frozen=True)
class AlertsConfig:
    """Realised review and block rates (/metrics) and the /health check of the review rate against the
    live version's budget (:mod:`pipeline.serving.rates`, :mod:`pipeline.serving.rate_check`)."""

    rate_windows_s: tuple[int, ...] = (300, 3600)  # sliding windows of the realised rates on /metrics
    review_rate_window_s: int = 3600  # /health judges the review rate over this window
    # Degraded when the rate is outside [budget * (1 - band), budget * (1 + band)] ...
    rate_band: float = 0.5
    degraded_after_s: float = 900.0  # ... for this long without a break (0: at once)
    # Fewer payments than this in the window are not judged: at a 0.5% budget, 10,000 payments hold
    # ~50 flags, whose noise (+-14%) stays well inside a 50% band.
    min_payments: int = 10_000
    check_interval_s: float = 5.0  # how often the check runs (and at every GET /health)


@dataclass(frozen=True)
class RulesConfig:
    """The block/allow list file (format in docs/scoring.md) and how often it is re-read."""

    path: str = "serving/rules.toml"  # relative paths are under the state directory; a missing file = no rules
    refresh_interval_s: float = 600.0

    def file(self) -> Path:
        return resolve_state_path(self.path)


# What the feed does with a position outside its partition (see pipeline.serving.stream_watch).
OffsetGapPolicy = Literal["wait", "earliest"]


@dataclass(frozen=True)
class StreamConfig:
    """The online features' inputs: the raw store at start, then the transactions and labels topics;
    and how the feed's progress is judged (:mod:`pipeline.serving.stream_watch`)."""

    seed_from_raw_store: bool = True  # replay the raw store's recent history before consuming Kafka
    consume: bool = True  # follow the topics (off: features see only the seed and scored payments)
    # History is dropped this long (plus the longest window) behind the latest event seen, so payments
    # that arrive (or are scored) up to this late still see every earlier payment their windows read.
    # At least ingest.toml's [raw] max_lateness_days, the latest a payment is accepted (checked on load).
    expiry_margin_hours: float = RawStoreConfig.max_lateness_days * 24
    expire_interval_s: float = 60.0
    poll_timeout_ms: int = 200  # a consumer poll returns after this when idle (bounds shutdown time)
    # A position before the partition's earliest offset or beyond its end (topic recreated): "wait"
    # stays degraded until the partition reaches it; "earliest" resumes from the earliest offset and
    # records the skipped range. Either way /health is degraded while the position is out of range.
    on_offset_gap: OffsetGapPolicy = "wait"
    watch_interval_s: float = 10.0  # how often every partition's earliest and end offsets are read
    # Degraded when a position has not moved for this long while its partition's end grew past it.
    stall_after_s: float = 120.0


# What a scored payment's event time is judged against (see TimeRulesConfig); "off": not judged.
LateReference = Literal["watermark", "clock", "off"]
FutureReference = Literal["clock", "off"]


@dataclass(frozen=True)
class TimeRulesConfig:
    """Ingest's timing rules on scored payments (:class:`pipeline.serving.features.PaymentTimeRules`):
    a payment they refuse is answered 422 with the contract's reason and never reaches the features.
    The bounds are ingest.toml's ``[raw] max_lateness_days`` and ``max_clock_skew_s``, not repeated here."""

    # late_event: more than max_lateness_days behind "watermark", the latest payment event time the
    # features have seen (ingest's own rule: a replay of old history is not late), or behind "clock",
    # the service's wall clock (live traffic only).
    late_against: LateReference = "watermark"
    # future_event_time: more than max_clock_skew_s ahead of the service's wall clock (ingest: of the
    # record's Kafka timestamp). Never the watermark: it cannot tell a far-future time from progress.
    future_against: FutureReference = "clock"


@dataclass(frozen=True)
class ScoresConfig:
    """Every decision goes to the scores topic (transaction id, model version, score, decision, features)."""

    publish: bool = True
    topic: str = "scores"
    create_topic: bool = False  # create it when missing (embedded broker); a real cluster's topics are provisioned
    queue_size: int = 10_000  # decisions waiting to be sent; beyond this they are dropped and counted


@dataclass(frozen=True)
class AdminConfig:
    """Admin endpoints (reload, pin, rules refresh) need ``Authorization: Bearer <token>``."""

    token: str = env_override(ADMIN_TOKEN_ENV, "")  # empty: the admin endpoints are disabled


@dataclass(frozen=True)
class PartitionConfig:
    """This process's share of a partitioned scoring tier (:mod:`pipeline.serving.partitioning`):
    service partition ``index`` of ``count`` owns the cards the transactions topic's murmur2
    partitioner puts on its partitions ``p % count == index``. ``fraudctl serve --partition I/N``
    sets index and count; ``count = 1`` (the default) owns every card."""

    index: int = 0
    count: int = 1
    # host:port of each service partition, by index: named in the 421 answer to a misdirected request.
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ConfigError(f"partition.index must be in 0..count-1, got {self.index} of {self.count}")
        if self.addresses and len(self.addresses) != self.count:
            raise ConfigError(f"partition.addresses names {len(self.addresses)} partitions, count is {self.count}")


@dataclass(frozen=True)
class RouterConfig:
    """``fraudctl route``'s calls to the partitions (:mod:`pipeline.serving.router`)."""

    # Every call to a partition (a payment, a batch part, /health, /ready) ends within this, or the
    # router answers 504 naming the partition: a stalled partition must not hang the tier's front.
    # Above a full batch's scoring time (max_batch_items), far below a payment switch's patience.
    upstream_timeout_s: float = 5.0


@dataclass(frozen=True)
class ServingConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    rules: RulesConfig = field(default_factory=RulesConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    time_rules: TimeRulesConfig = field(default_factory=TimeRulesConfig)
    scores: ScoresConfig = field(default_factory=ScoresConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)


def expiry_margin_floor_hours(time_rules: TimeRulesConfig, raw: RawStoreConfig) -> float:
    """The least ``[stream] expiry_margin_hours`` that keeps the whole history of every payment the
    service accepts: ingest's ``max_lateness_days`` behind the latest payment seen (what the feed always
    judges by, and scored payments with ``late_against = "watermark"``), plus ``max_clock_skew_s`` when
    scored payments are judged against the clock, which the latest payment seen may lead by that much.
    (``late_against = "off"`` bounds nothing on /score: payments later than this are scored on
    truncated windows.)"""
    skew_hours = raw.max_clock_skew_s / 3600 if time_rules.late_against == "clock" else 0.0
    return raw.max_lateness_days * 24 + skew_hours


def validate_serving_config(config: ServingConfig, raw: RawStoreConfig,
                            source: str = "serving.toml") -> ServingConfig:
    """Reject values that type-check but cannot work, naming the key to fix. ``raw``: ingest.toml's
    ``[raw]``, whose timing bounds say how late an accepted payment can be."""
    problems = []
    s, m = config.server, config.model
    for key in ("max_body_bytes", "max_batch_bytes", "max_batch_items", "limit_concurrency"):
        if getattr(s, key) < 1:
            problems.append(f"server.{key} must be >= 1, got {getattr(s, key)}")
    if not 0 <= s.port <= 65535:
        problems.append(f"server.port must be in 0..65535, got {s.port}")
    if m.poll_interval_s <= 0 or config.rules.refresh_interval_s <= 0 or config.stream.expire_interval_s <= 0:
        problems.append("model.poll_interval_s, rules.refresh_interval_s and stream.expire_interval_s must be > 0")
    if m.warmup_rows < 1 or m.explain_top_k < 0 or m.torch_threads < 1 or not 0.0 <= m.explain_min_score <= 1.0:
        problems.append("model.warmup_rows and model.torch_threads must be >= 1, model.explain_top_k >= 0, "
                        "model.explain_min_score in [0, 1]")
    if config.stream.expiry_margin_hours < 0 or config.stream.poll_timeout_ms < 1:
        problems.append("stream.expiry_margin_hours must be >= 0 and stream.poll_timeout_ms >= 1")
    floor = expiry_margin_floor_hours(config.time_rules, raw)
    if config.stream.expiry_margin_hours < floor:
        bound = f"ingest.toml's [raw] max_lateness_days = {raw.max_lateness_days:g}" + (
            " plus max_clock_skew_s (late_against = 'clock')" if config.time_rules.late_against == "clock" else "")
        problems.append(f"stream.expiry_margin_hours = {config.stream.expiry_margin_hours:g} is shorter than the "
                        f"{floor:g} h a payment may be late ({bound}): such payments would be scored with part of "
                        f"their history expired; set [stream] expiry_margin_hours to at least {floor:g} "
                        "(or lower the lateness bound)")
    if not (config.stream.watch_interval_s > 0 and config.stream.stall_after_s > 0):
        problems.append(f"stream.watch_interval_s and stream.stall_after_s must be > 0, got "
                        f"{config.stream.watch_interval_s} and {config.stream.stall_after_s}")
    if config.scores.queue_size < 1 or not config.scores.topic:
        problems.append("scores.queue_size must be >= 1 and scores.topic non-empty")
    if not config.router.upstream_timeout_s > 0:
        problems.append(f"router.upstream_timeout_s must be > 0 (seconds), got {config.router.upstream_timeout_s}")
    problems += alerts_problems(config.alerts)
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    return config


def alerts_problems(a: AlertsConfig) -> list[str]:
    """What is wrong with ``[alerts]``, each naming its key."""
    problems = []
    windows = (*a.rate_windows_s, a.review_rate_window_s)
    if not a.rate_windows_s:
        problems.append("alerts.rate_windows_s must name at least one window")
    elif len(set(a.rate_windows_s)) != len(a.rate_windows_s):
        problems.append(f"alerts.rate_windows_s must not repeat a window, got {list(a.rate_windows_s)}")
    if not all(1 <= w <= MAX_RATE_WINDOW_S for w in windows):
        problems.append(f"alerts.rate_windows_s and alerts.review_rate_window_s must be in 1..{MAX_RATE_WINDOW_S} "
                        f"seconds, got {list(a.rate_windows_s)} and {a.review_rate_window_s}")
    if not a.rate_band > 0.0:
        problems.append(f"alerts.rate_band must be > 0 (0.5: within 50% of the budget), got {a.rate_band}")
    if not a.degraded_after_s >= 0.0:
        problems.append(f"alerts.degraded_after_s must be >= 0, got {a.degraded_after_s}")
    if a.min_payments < 1:
        problems.append(f"alerts.min_payments must be >= 1, got {a.min_payments}")
    if not a.check_interval_s > 0.0:
        problems.append(f"alerts.check_interval_s must be > 0, got {a.check_interval_s}")
    return problems


def load_serving_config(env: str | None = None, path: Path | None = None) -> ServingConfig:
    """Load and check ``conf/<env>/serving.toml`` (or ``path``) against the ingest.toml beside it
    (``conf/<env>/ingest.toml`` when ``path``'s folder has none)."""
    beside = None if path is None else path.parent / "ingest.toml"
    ingest = load_ingest_config(env, beside if beside is not None and beside.is_file() else None)
    return validate_serving_config(load_section(ServingConfig, "serving", env, path), ingest.raw,
                                   str(path or "serving.toml"))
