"""Decisions the risk team acts on: the review budget, the operating points chosen from it, and
what the live model realises at them (pure; no I/O)."""
