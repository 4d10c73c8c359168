"""Decisions the risk team acts on: the review budget, the operating points chosen from it, and
what the live model realises at them; the prior-shift correction of calibrated probabilities.
Pure arithmetic, apart from reading and writing a version's ``operating_points.json``."""
