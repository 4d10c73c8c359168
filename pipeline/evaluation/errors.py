"""Named failures of the evaluation layer. Each means "nothing was measured": callers that map
expected failures to exit code 1 (the registry commands, the nightly gate stage) catch
:class:`EvaluationError` beside the registry's own ``RegistryError``.
"""

from __future__ import annotations


class EvaluationError(RuntimeError):
    """Base class: an expected failure whose message tells the operator what to do."""


class HoldoutError(EvaluationError):
    """No usable holdout window (missing split, labels not mature, or overlaps training data)."""
