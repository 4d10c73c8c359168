"""The commands the README and docs/scoring.md show parse against the real CLI.

Every ``fraudctl ...`` line of their ```bash blocks goes through click's own parser (the group's
options, each subcommand, every option, its type and callback, required options, extra arguments),
without running the command; every ``jobs/ingest.py ...`` line through the job's ``parse_args``. So
a renamed flag or subcommand, a date that is not a date, or pseudo-syntax such as ``--a X | --b Y``
(which a shell runs as a pipe) fails here before a user pastes it. Seconds: nothing is executed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from pipeline.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "scoring.md")
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
# The shell variables the docs' commands use, with a value of the type their option takes (a
# typed option fed "$SLURM_NNODES" literally would be refused). A new variable goes here.
EXAMPLE_VARIABLES = {"SLURM_NNODES": "2", "head": "node0", "RUN_DATE": "2026-11-29", "SLURM_JOB_ID": "1",
                     "RUN": "nightly-2026-11-29"}
CONTROL_OPERATORS = {"|", "||", "&", "&&", ";", ";;"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")  # VAR=value, alone or before a command
WRAPPERS = {"srun", "sudo", "exec", "time"}  # programs that run the next word as the command
JOBS = {"jobs/ingest.py": ROOT / "jobs" / "ingest.py"}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int  # of the block line where the command starts
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.words)}"


def bash_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of every ```bash block: backslash continuations joined, and a
    quoted string that spans lines (a JSON body) kept whole, as the shell reads them."""
    lines = []
    for block in BASH_BLOCK.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        pending, start = "", first
        for offset, raw in enumerate(block.group(1).splitlines()):
            if not pending:
                start = first + offset
            if raw.rstrip().endswith("\\") and not raw.lstrip().startswith("#"):
                pending += raw.rstrip()[:-1] + " "
                continue
            pending += raw
            if not _quotes_closed(pending):
                pending += "\n"
                continue
            lines.append((start, pending))
            pending = ""
        assert not pending, f"unclosed quote or continuation in the block at line {first}: {pending!r}"
    return lines


def _quotes_closed(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return False
    return True


def split_commands(doc: str, number: int, line: str) -> list[Command]:
    """The simple commands of one shell line: comments dropped, split at | || & && ;."""
    # A command substitution's words are another command's: one opaque value here.
    line = re.sub(r"\$\([^()]*\)", "$SUBSTITUTION", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, words = [], []
    for token in lexer:
        if token in CONTROL_OPERATORS:
            commands.append(words)
            words = []
        else:
            words.append(token)
    commands.append(words)
    return [Command(doc, number, tuple(w)) for w in commands if w]


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        doc = str(path.relative_to(ROOT))
        for number, line in bash_lines(path.read_text()):
            commands.extend(split_commands(doc, number, line))
    return commands


def program_and_args(words: tuple[str, ...]) -> tuple[str, list[str]]:
    """The program a command runs (past ``VAR=value`` prefixes and wrappers) and its arguments."""
    words = list(words)
    while words and (ASSIGNMENT.match(words[0]) or words[0] in WRAPPERS):
        words.pop(0)
    return (words[0], words[1:]) if words else ("", [])


def with_example_values(args: list[str]) -> list[str]:
    return [re.sub(r"\$(\w+)", lambda m: EXAMPLE_VARIABLES.get(m.group(1), m.group(0)), a) for a in args]


def parse_fraudctl(args: list[str]) -> click.Context:
    """Parse ``fraudctl ARGS`` as click would, down to the leaf command, without invoking anything.
    Raises click's UsageError / BadParameter / MissingParameter / NoSuchOption as the CLI would."""
    ctx = cli.make_context("fraudctl", list(args))
    command: click.Command = cli
    while isinstance(command, click.Group):
        with warnings.catch_warnings():  # Click 8.2+ keeps the subcommand name apart until 9.0
            warnings.simplefilter("ignore", DeprecationWarning)
            rest = [*ctx.protected_args, *ctx.args]
        if not rest:
            raise click.UsageError(f"{command.name} needs a subcommand", ctx)
        name, command, rest = command.resolve_command(ctx, rest)
        try:
            ctx = command.make_context(name, rest, parent=ctx)
        except click.BadParameter as exc:
            # An existing path can only be the reader's own (a run directory, a dataset).
            if isinstance(getattr(exc.param, "type", None), click.Path) and exc.param.type.exists:
                return ctx
            raise
    return ctx


def load_job(path: Path):
    spec = importlib.util.spec_from_file_location(f"readme_job_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMMANDS = documented_commands()
FRAUDCTL = [c for c in COMMANDS if os.path.basename(program_and_args(c.words)[0]) == "fraudctl"]


def test_the_docs_show_fraudctl_commands():
    # The parser below must find what it checks: a README reshuffle that hid every block would pass.
    assert len(FRAUDCTL) >= 25, [str(c) for c in FRAUDCTL]
    shown = {program_and_args(c.words)[1][0] for c in FRAUDCTL if program_and_args(c.words)[1]}
    assert {"ingest", "simulate", "broker", "rollback", "serve", "consistency"} <= shown


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_commands_paste_into_a_shell(command):
    """``fraudctl rollback --to-version 3 | --from-checkpoint X`` pasted runs ``--from-checkpoint X``
    as a program, and an unquoted ``<run>`` placeholder is a redirection: alternatives are written as
    separate commands, placeholders as shell variables."""
    program, _ = program_and_args(command.words)
    if not program:  # only assignments (export-less VAR=value)
        return
    assert not program.startswith("-"), f"{command}: an option where a program should be"
    redirections = [w for w in command.words if w and not w.strip("<>")]
    assert not redirections, f"{command}: {redirections} is a shell redirection (a <placeholder>?)"


@pytest.mark.parametrize("command", FRAUDCTL, ids=str)
def test_fraudctl_command_parses(command):
    _, args = program_and_args(command.words)
    try:
        parse_fraudctl(with_example_values(args))
    except click.ClickException as exc:
        pytest.fail(f"{command}\n  refused by the CLI: {exc.format_message()}")


JOB_COMMANDS = [(c, job) for c in COMMANDS for job in JOBS if any(w.endswith(job) for w in c.words)]


@pytest.mark.parametrize(("command", "job"), JOB_COMMANDS, ids=lambda x: str(x))
def test_job_command_parses(command, job):
    words = list(command.words)
    script = next(i for i, w in enumerate(words) if w.endswith(job))
    try:
        load_job(JOBS[job]).parse_args(with_example_values(words[script + 1:]))
    except SystemExit as exc:
        pytest.fail(f"{command}\n  refused by {job} (exit {exc.code})")


def test_a_bogus_flag_is_caught():
    """The check itself: an unknown option, subcommand or bad date is refused, not skipped."""
    for args in (["ingest", "--run-date", "2026-11-29", "--bogus"], ["ingestt"],
                 ["ingest", "--run-date", "2026-13-29"], ["rollback", "--to-version", "three"]):
        with pytest.raises(click.ClickException):
            parse_fraudctl(args)
    parse_fraudctl(["--env", "prod", "ingest", "--run-date", "2026-11-29"])
    parse_fraudctl(["broker", "start", "--port", "9092"])
    first, second = split_commands("x", 1, "fraudctl rollback --to-version 3 | --from-checkpoint run # why")
    assert first.words == ("fraudctl", "rollback", "--to-version", "3")
    assert program_and_args(second.words)[0] == "--from-checkpoint"


def test_the_readme_backfill_is_the_range_the_tool_accepts():
    """The README's backfill example spans the dev layout (gap_days included) and its stated day
    count is the configured one: the example used to span 20 days where the tool needs 27."""
    from datetime import date, timedelta

    from pipeline.ingest.config import load_ingest_config
    from pipeline.ingest.dataset_plan import plan_backfill

    dataset = load_ingest_config("dev").dataset
    readme = (ROOT / "README.md").read_text()
    claimed = re.search(r"\(dev: ([\d +]+) = (\d+) days\)", readme)
    assert claimed, "the README states the dev backfill's day count"
    assert sum(int(n) for n in claimed.group(1).split("+")) == int(claimed.group(2)) == dataset.window_days
    backfills = [program_and_args(c.words)[1] for c in FRAUDCTL
                 if c.doc == "README.md" and "--start" in c.words and "ingest" in c.words]
    assert backfills
    for args in backfills:
        start, end = (date.fromisoformat(args[args.index(flag) + 1]) for flag in ("--start", "--end"))
        plan = plan_backfill(start, end, dataset, data_until=end + timedelta(days=dataset.label_maturity_days))
        assert (plan.first_date, plan.last_date) == (start, end)
