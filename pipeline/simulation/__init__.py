"""Transaction simulator: card payments with six drifting fraud patterns, look-alike genuine behaviour
and noisy, delayed labels.

``simulate(load_simulation_config(env))`` returns a :class:`Simulation` (transactions, labels,
ground truth); :mod:`pipeline.simulation.io` writes and reads event files.
"""

from pipeline.simulation.config import GENUINE, PATTERNS, SimulationConfig, load_simulation_config
from pipeline.simulation.simulator import Simulation, simulate

__all__ = ["GENUINE", "PATTERNS", "Simulation", "SimulationConfig", "load_simulation_config", "simulate"]
