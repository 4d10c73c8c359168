"""``fraudctl register | promote | rollback | history | evaluate``: the MLflow registry commands.

Thin: parse options, load ``conf/<env>/registry.toml``, call one function of ``pipeline.registry``,
print. Expected failures (RegistryError, EvaluationError, bad config) exit 1 with the message, and so
does a model name the store does not know (a typo must not read as an empty history); ``promote``
exits 3 when the gate rejects the challenger. The table of exit codes is README.md, "## Exit codes".
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline.cli.context import cli_context, parse_date
from pipeline.config import ConfigError
from pipeline.evaluation.errors import EvaluationError
from pipeline.registry.config import RegistryConfig, load_registry_config, resolved_tracking_uri
from pipeline.registry.errors import (
    CheckpointError,
    DatasetError,
    ModelLoadError,
    NoChallenger,
    NoChampion,
    RegistryError,
)

# The pipeline.registry modules below config/errors import MLflow and torch (seconds); each command
# imports what it uses so that `fraudctl broker ...` and `--help` stay fast.
if TYPE_CHECKING:
    from mlflow import MlflowClient

SHOWN_MODEL_NAMES = 20  # registered models listed in an unknown-model error


def _config(ctx: click.Context) -> RegistryConfig:
    return load_registry_config(cli_context(ctx).env)


def _expected_errors(f):
    """RegistryError / EvaluationError / CheckpointError / ConfigError -> exit 1 with the message
    (nothing was changed)."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except (RegistryError, EvaluationError, CheckpointError, ConfigError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    return wrapper


def _connect_to_model(config: RegistryConfig, name: str,
                      missing: type[RegistryError] = RegistryError) -> MlflowClient:
    """A client for the store, once it is known to hold registered model ``name``.

    Raises ``missing`` (exit 1) naming the model, the store and the models it does hold: the command's
    own error class, since an unregistered model also has no challenger, champion or loadable version.
    """
    from pipeline.registry.store import connect, model_exists

    client = connect(config)
    if model_exists(client, name):
        return client
    page = client.search_registered_models(max_results=SHOWN_MODEL_NAMES)
    known = ", ".join(sorted(m.name for m in page) + (["..."] if page.token else [])) or "none yet"
    raise missing(f"no registered model {name!r} in {resolved_tracking_uri(config)} (registered models: {known}). "
                  "Fix model_name in conf/<env>/registry.toml (or the model URI), or register a training run "
                  "first with `fraudctl register --run-dir ...`")


def _json_safe(obj):
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    return obj


actor_option = click.option("--actor", default=None, help="Who is acting, for the audit history (default: login name).")


@click.command()
@click.option("--run-dir", required=True, type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="A finished training run directory (with summary.json).")
@click.pass_context
@_expected_errors
def register(ctx: click.Context, run_dir: Path) -> None:
    """Log a finished training run into MLflow and register its model as `challenger`."""
    from pipeline.registry.store import CHALLENGER
    from pipeline.registry.tracking import register_run

    config = _config(ctx)
    version = register_run(run_dir, config)
    click.echo(f"registered {config.model_name} v{version} as {CHALLENGER} (from {run_dir})")


@click.command()
@click.option("--dataset-root", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Dataset root whose latest holdout split to score on (default: the challenger's training dataset root).")
@click.option("--dataset-version", default=None, help="Dataset version under the root (default: LATEST).")
@click.option("--json", "as_json", is_flag=True, help="Print the gate report as JSON.")
@actor_option
@click.pass_context
@_expected_errors
def promote(ctx: click.Context, dataset_root: Path | None, dataset_version: str | None, as_json: bool,
            actor: str | None) -> None:
    """Gate `challenger` against `champion` on the same holdout; move `champion` only if it passes.

    \b
    Exit codes:
      0  promoted (or the challenger already is champion)
      3  rejected: worse AUC-ROC, a blocking guardrail, or insufficient evidence; champion unchanged
      1  error (unreachable store, no challenger, corrupt artifact, signature mismatch, ...); champion unchanged
    Re-running the same gate (same challenger, champion and holdout) repeats the recorded decision.
    """
    from pipeline.evaluation.report import format_gate_report
    from pipeline.registry.promotion import run_gate

    config = _config(ctx)
    _connect_to_model(config, config.model_name, missing=NoChallenger)
    report = run_gate(config, dataset_root, dataset_version, actor)
    click.echo(report.to_json() if as_json else format_gate_report(report))
    ctx.exit(report.exit_code)


@click.command()
@click.option("--to-version", type=int, default=None, help="Make this registered version champion.")
@click.option("--from-checkpoint", default=None, metavar="RUN_OR_PATH",
              help="Register the model of a training checkpoint (run name, run dir or checkpoint dir) and make it "
                   "champion, deciding at its run's operating points (a step-* checkpoint: chosen afresh on the run's "
                   "validation split); refused when they cannot be known.")
@click.option("--reason", default=None, help="Why, for the audit history.")
@actor_option
@click.pass_context
@_expected_errors
def rollback(ctx: click.Context, to_version: int | None, from_checkpoint: str | None, reason: str | None,
             actor: str | None) -> None:
    """Move `champion` back to `previous-champion` (or to --to-version N / --from-checkpoint X)."""
    if to_version is not None and from_checkpoint is not None:
        raise click.UsageError("give at most one of --to-version and --from-checkpoint")
    from pipeline.registry.rollback import rollback as rollback_champion
    from pipeline.registry.rollback import rollback_from_checkpoint

    config = _config(ctx)
    _connect_to_model(config, config.model_name, missing=NoChampion)
    if from_checkpoint is not None:
        record = rollback_from_checkpoint(config, from_checkpoint, actor, reason)
    else:
        record = rollback_champion(config, to_version, actor, reason)
    click.echo(f"{config.model_name}: champion v{record.from_version or '-'} -> v{record.to_version} "
               f"({record.action} by {record.actor})")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON lines.")
@click.option("--limit", type=int, default=None, help="Show only the last N records.")
@click.pass_context
@_expected_errors
def history(ctx: click.Context, as_json: bool, limit: int | None) -> None:
    """Current aliases and the audit history: promotions, rejections and rollbacks."""
    from pipeline.decisions.operating_points import operating_points_from_tags
    from pipeline.registry.audit import format_history, read_history
    from pipeline.registry.store import CHALLENGER, CHAMPION, PREVIOUS_CHAMPION, version_by_alias

    config = _config(ctx)
    client = _connect_to_model(config, config.model_name)
    records = read_history(client, config.model_name)
    if limit is not None:
        records = records[-limit:]
    if as_json:
        for r in records:
            click.echo(json.dumps(asdict(r), sort_keys=True))
        return
    aliases, points = {}, {}
    for alias in (CHAMPION, PREVIOUS_CHAMPION, CHALLENGER):
        version = version_by_alias(client, config.model_name, alias)
        aliases[alias] = int(version.version) if version else None
        if version is not None:
            points[int(version.version)] = operating_points_from_tags(version.tags)
    click.echo(format_history(config.model_name, aliases, records, points))


@click.command()
@click.option("--model-uri", required=True, help="e.g. models:/fraud-detector@champion, models:/fraud-detector/3, runs:/<id>/model")
@click.option("--start", required=True, callback=parse_date, help="First date (YYYY-MM-DD), inclusive.")
@click.option("--end", required=True, callback=parse_date, help="Last date (YYYY-MM-DD), inclusive.")
@click.option("--scores-out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write transaction_id, card_id, event_time, score, label as Parquet here.")
@click.option("--dataset-root", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Published dataset root (default: the registered version's training dataset root).")
@click.option("--dataset-version", default=None, help="Dataset version under the root (default: LATEST).")
@click.pass_context
@_expected_errors
def evaluate(ctx: click.Context, model_uri: str, start: date, end: date, scores_out: Path | None,
             dataset_root: Path | None, dataset_version: str | None) -> None:
    """Score MODEL_URI on a published dataset window and print its metrics as JSON."""
    if start > end:
        raise click.BadParameter(f"--start {start} is after --end {end}")
    from pipeline.registry.evaluate import REGISTRY_URI, dataset_root_of, evaluate_window
    from pipeline.registry.store import connect

    config = _config(ctx)
    registered = REGISTRY_URI.match(model_uri)
    client = _connect_to_model(config, registered["name"], ModelLoadError) if registered else connect(config)
    root = dataset_root or dataset_root_of(client, model_uri)
    if root is None:
        raise DatasetError(f"{model_uri} records no training dataset root: pass --dataset-root")
    report = evaluate_window(model_uri, root, start.isoformat(), end.isoformat(), scores_out, dataset_version)
    click.echo(json.dumps(_json_safe(report), sort_keys=True))


registry_commands = (register, promote, rollback, history, evaluate)
