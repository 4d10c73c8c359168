"""What each live day of the demo did against what the gate promised: ``<state>/demo/live_days.jsonl``.

The demo knows the simulator's truth, which production learns only as fraud reports mature. So each
night records one line for the live day the service decided: the payments it scored, how many it
sent to review or blocked, the day's frauds and how many of those it stopped, beside the served
version's recall at the review budget on the gate's holdout and that figure's 95% interval (the
gate's own bootstrap by card, :func:`pipeline.evaluation.comparison.budget_metrics`). Pooled over the
nights, live recall can then be read against the promise.

Two counts of fraud, because they differ by half on the demo's portfolio: every fraud the simulator
made (``frauds``), and the frauds whose report was made within the label maturity after the day
(``frauds_reported``), which is what the holdout's labels count as fraud and so what the promise is
about. Low-and-slow incidents are reported days after their last payment, so most of their payments
are labelled only after the maturity: on the live day of 2026-02-05, 8 of 22 frauds were reported
within 7 days, and none of the 6 low-and-slow ones. The gap between the two recalls is what a holdout
can never show.

One line per night: a night played again after a failure replaces its line (the file is rewritten
atomically), so a rerun never counts a day twice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import pandas as pd

from pipeline.atomic import write_text_atomic
from pipeline.metrics import wilson_interval
from pipeline.monitoring.monitor import labels_cutoff
from pipeline.nightly.records import GateOutcome

LIVE_DAYS_FILE = "live_days.jsonl"
CONFIDENCE = 0.95


@dataclass(frozen=True)
class LiveDay:
    night: int  # 1-based, as the demo prints it
    live_day: str  # the UTC day the service decided (the day after the night's run date)
    version: int  # the version that decided it
    payments: int
    flagged: int  # decided review or block
    realised_review_rate: float  # flagged / payments
    frauds: int  # the simulator's truth, never sent
    frauds_stopped: int  # frauds decided review or block
    review_budget: float | None  # the version's (None: explicit thresholds, no budget)
    holdout_recall_at_budget: float | None  # the version's recall at the budget on the night's gate holdout
    holdout_recall_ci: list[float] | None  # [lo, hi], 95%, the gate's bootstrap by card
    # Fraud as the holdout's labels define it: payments whose fraud report was made before the day's
    # label cutoff (label_maturity_days after it, the monitor's rule), whatever the truth.
    label_maturity_days: int = 0
    frauds_reported: int = 0
    frauds_reported_stopped: int = 0


def holdout_promise(gate: GateOutcome, version: int) -> tuple[float | None, list[float] | None]:
    """``version``'s recall at the budget on the night's holdout, and its interval, from the gate's
    figures: the challenger's when it is the version, else the champion's it was compared with."""
    if version == gate.challenger_version:
        metrics = gate.challenger_metrics
    elif version == gate.compared_with and gate.champion_metrics is not None:
        metrics = gate.champion_metrics
    else:
        return None, None
    lower, upper = metrics.get("recall_at_budget_lower"), metrics.get("recall_at_budget_upper")
    interval = [lower, upper] if lower is not None and upper is not None else None
    return metrics.get("recall_at_budget"), interval


def reported_frauds(labels: pd.DataFrame, day: date, maturity_days: int) -> frozenset[str]:
    """Transactions that a fraud report labels fraud by ``day``'s label cutoff: each payment's latest
    report made before it (a report cleared by a later one before the cutoff is not fraud)."""
    cutoff = labels_cutoff(day, maturity_days)
    made = labels[pd.to_datetime(labels["reported_at"], utc=True) < cutoff]
    latest = made.assign(at=pd.to_datetime(made["reported_at"], utc=True)).sort_values("at", kind="stable")
    latest = latest.groupby("transaction_id", sort=False).tail(1)
    return frozenset(latest.loc[latest["is_fraud"].astype(bool), "transaction_id"])


def record_live_day(workdir: Path, day: LiveDay) -> list[LiveDay]:
    """Add (or, for a night played again, replace) ``day``'s line; all nights' lines in night order."""
    days = {d.night: d for d in load_live_days(workdir)}
    days[day.night] = day
    ordered = [days[n] for n in sorted(days)]
    write_text_atomic(workdir / LIVE_DAYS_FILE, "".join(json.dumps(asdict(d)) + "\n" for d in ordered))
    return ordered


def load_live_days(workdir: Path) -> list[LiveDay]:
    path = workdir / LIVE_DAYS_FILE
    if not path.is_file():
        return []
    return [LiveDay(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Pooled:
    """The live days of every night so far, added up, beside the gate's promise."""

    nights: int
    payments: int
    flagged: int
    frauds: int  # the truth
    frauds_stopped: int
    frauds_reported: int  # fraud as the holdout counts it (reported by the label cutoff)
    frauds_reported_stopped: int
    review_budget: float | None  # when every night had the same one
    label_maturity_days: int | None  # when every night had the same one
    promised_recall: float | None  # holdout recall at the budget, weighted by each night's reported frauds
    promised_ci: tuple[float, float] | None  # the nights' interval bounds, weighted alike

    @property
    def realised_review_rate(self) -> float:
        return self.flagged / self.payments if self.payments else float("nan")

    @property
    def live_recall(self) -> float:
        """Of every fraud (the simulator's truth)."""
        return self.frauds_stopped / self.frauds if self.frauds else float("nan")

    @property
    def reported_recall(self) -> float:
        """Of the frauds reported by the label cutoff: the holdout's definition, what the promise is about."""
        return self.frauds_reported_stopped / self.frauds_reported if self.frauds_reported else float("nan")


def pooled(days: list[LiveDay]) -> Pooled:
    """Sum the nights; the promise is each night's holdout figure weighted by that night's reported
    frauds (the frauds each promise was put to), over the nights that have one."""
    budgets, maturities = {d.review_budget for d in days}, {d.label_maturity_days for d in days}
    promised = [d for d in days if d.holdout_recall_at_budget is not None and d.frauds_reported]
    weight = sum(d.frauds_reported for d in promised)
    recall = sum(d.holdout_recall_at_budget * d.frauds_reported for d in promised) / weight if weight else None
    bounded = [d for d in promised if d.holdout_recall_ci is not None]
    ci_weight = sum(d.frauds_reported for d in bounded)
    ci = (tuple(sum(d.holdout_recall_ci[i] * d.frauds_reported for d in bounded) / ci_weight for i in (0, 1))
          if ci_weight else None)
    return Pooled(nights=len(days), payments=sum(d.payments for d in days), flagged=sum(d.flagged for d in days),
                  frauds=sum(d.frauds for d in days), frauds_stopped=sum(d.frauds_stopped for d in days),
                  frauds_reported=sum(d.frauds_reported for d in days),
                  frauds_reported_stopped=sum(d.frauds_reported_stopped for d in days),
                  review_budget=budgets.pop() if len(budgets) == 1 else None,
                  label_maturity_days=maturities.pop() if len(maturities) == 1 else None,
                  promised_recall=recall, promised_ci=ci)


def _recall(stopped: int, total: int) -> str:
    if not total:
        return "no frauds"
    lo, hi = wilson_interval(stopped, total, CONFIDENCE)
    return f"{stopped} of {total} stopped, recall {stopped / total:.3f} (95% {lo:.3f}-{hi:.3f})"


def pooled_lines(days: list[LiveDay]) -> list[str]:
    """The summary's lines: the live days pooled over the nights so far, beside the promise.

    The promise (the holdout's recall at the budget) counts as fraud what was reported within the
    label maturity; the simulator also knows the frauds reported later or never. Both are shown, and
    the promise is compared with the recall it is about."""
    if not days:
        return ["   live days so far: none scored yet (no champion)"]
    p = pooled(days)
    budget = f" against a budget of {p.review_budget:.2%}" if p.review_budget is not None else ""
    maturity = f"{p.label_maturity_days} days" if p.label_maturity_days is not None else "the label maturity"
    lines = [f"   live days so far ({p.nights} night(s), {p.payments} payments): {p.flagged} sent to review or "
             f"blocked ({p.realised_review_rate:.2%}{budget})",
             f"   frauds reported within {maturity} (what the gate's holdout counts): "
             f"{_recall(p.frauds_reported_stopped, p.frauds_reported)}",
             f"   every fraud (the simulator's truth, {p.frauds - p.frauds_reported} of them reported later or "
             f"never): {_recall(p.frauds_stopped, p.frauds)}"]
    if p.promised_recall is None:
        return [*lines, "   the gate's holdout made no promise for these days"]
    promise = f"{p.promised_recall:.3f}" + (
        f" (95% interval {p.promised_ci[0]:.3f}-{p.promised_ci[1]:.3f})" if p.promised_ci else "")
    verdict = ""
    if p.promised_ci is not None and p.frauds_reported:
        inside = p.promised_ci[0] <= p.reported_recall <= p.promised_ci[1]
        verdict = f": live recall of reported frauds is {'inside' if inside else 'OUTSIDE'} it"
    return [*lines, f"   the gate's holdout promised recall {promise} at the budget{verdict}"]
