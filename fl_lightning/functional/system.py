"""A client as a device on the simulated clock: its time for a round, what fits a deadline, seeded draws.

The time model is FedScale's (Lai et al., ICML 2022; its client completion time,
``fedscale/cloud/internal/client_metadata.py``): a client's time is its download, its computation and its
upload,

.. math:: t_k = \\frac{8 B_{down}}{10^6 d_k} + \\frac{s_k b}{v_k} + \\frac{8 B_{up}}{10^6 u_k}

with ``B`` the bytes sent each way, ``d_k``/``u_k`` its download/upload bandwidth in Mbit/s, ``s_k`` its local
steps of batch ``b`` and ``v_k`` its compute speed in training samples per second. Every random draw here
takes its generator from the caller, seeded by ``(run seed, stream, round or client)``, so it repeats on a
rerun, on every process and after a resume.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

#: Bits per byte over the bits of one Mbit: seconds per byte at 1 Mbit/s.
_MBIT = 8 / 1e6


def transfer_seconds(nbytes: int, mbps: float) -> float:
    """Seconds to move ``nbytes`` at ``mbps`` megabits per second: ``8 B / (10^6 mbps)``."""
    return nbytes * _MBIT / mbps


def compute_seconds(steps: int, batch_size: int, speed: float) -> float:
    """Seconds of ``steps`` local steps of ``batch_size`` samples at ``speed`` samples per second."""
    return steps * batch_size / speed


def client_seconds(steps: int, batch_size: int, speed: float, down_s: float, up_s: float) -> float:
    """A client's time for a round: download + computation + upload (module docstring)."""
    return down_s + compute_seconds(steps, batch_size, speed) + up_s


def steps_within(budget_s: float, batch_size: int, speed: float, down_s: float, up_s: float) -> int:
    """The most local steps whose download, computation and upload fit in ``budget_s`` seconds (0: none):
    ``floor((budget - down - up) * speed / batch)`` (a relative 1e-9 absorbs float rounding at the edge)."""
    left = budget_s - down_s - up_s
    if left <= 0:
        return 0
    return max(0, math.floor(left * speed / batch_size * (1 + 1e-9)))


def lognormal(median: float, sigma: float, count: int, generator: torch.Generator) -> list[float]:
    """``count`` draws of ``median * exp(sigma * z)``, ``z ~ N(0, 1)``: a lognormal whose median is
    ``median`` and whose log has standard deviation ``sigma`` (0: every draw is ``median``)."""
    z = torch.randn(count, generator=generator, dtype=torch.float64)
    return [median * math.exp(sigma * float(v)) for v in z]


def uniform(count: int, generator: torch.Generator) -> list[float]:
    """``count`` draws of U[0, 1) (float64)."""
    return [float(v) for v in torch.rand(count, generator=generator, dtype=torch.float64)]


def bernoulli(probabilities: Sequence[float], generator: torch.Generator) -> list[bool]:
    """One draw per probability: ``True`` with probability ``p`` (``p = 1``: always, ``p = 0``: never)."""
    u = uniform(len(probabilities), generator)
    return [v < p for v, p in zip(u, probabilities, strict=True)]


def cycle_online(time_s: float, day_s: float, online_fraction: float, phase: float) -> bool:
    """Whether a client with a day/night cycle is online at ``time_s``: it is online for the first
    ``online_fraction`` of every period of ``day_s`` seconds, shifted by its ``phase`` in [0, 1) (its time
    zone): ``frac(time / day + phase) < online_fraction``."""
    if online_fraction >= 1:
        return True
    return (time_s / day_s + phase) % 1.0 < online_fraction


def next_online(time_s: float, day_s: float, online_fraction: float, phase: float) -> float:
    """The first time at or after ``time_s`` at which :func:`cycle_online` holds (``time_s`` if it does)."""
    if online_fraction >= 1 or cycle_online(time_s, day_s, online_fraction, phase):
        return time_s
    frac = (time_s / day_s + phase) % 1.0
    return time_s + (1.0 - frac + 1e-9) * day_s  # just past the edge, where float rounding cannot undo it


def straggler_count(cohort: int, fraction: float) -> int:
    """How many of a round's ``cohort`` selected devices are stragglers under FedProx's ``drop_percent``
    (Li et al., MLSys 2020, Sec. 5.2; its code, ``flearn/trainers/fedprox.py``, keeps
    ``round(cohort * (1 - fraction))`` devices active, with Python's round, and makes the others
    stragglers)."""
    return cohort - round(cohort * (1 - fraction))


def straggler_work(count: int, high: int, generator: torch.Generator) -> list[int]:
    """``count`` amounts of work drawn uniformly from ``{1, ..., high - 1}``: FedProx's stragglers run
    ``np.random.randint(low=1, high=E)`` local epochs, i.e. in [1, E) (``flearn/trainers/fedprox.py``)."""
    if high < 2:
        raise ValueError(f"straggler work is drawn from [1, {high}): needs high >= 2")
    return [int(v) for v in torch.randint(1, high, (count,), generator=generator)]


def over_selected(count: int, ratio: float) -> int:
    """Clients to sample so that ``count`` finish: ``ceil((1 + r) * count)`` (Bonawitz et al., MLSys 2019,
    Sec. 2.2: the server selects more devices than it needs and closes the round when enough reported)."""
    return math.ceil((1 + ratio) * count - 1e-9)


def first_to_finish(times: Mapping[int, float], count: int) -> list[int]:
    """The ``count`` clients that finish first (time, then client id), sorted by id."""
    order = sorted(times, key=lambda c: (times[c], c))
    return sorted(order[:count])


__all__ = [
    "bernoulli",
    "client_seconds",
    "compute_seconds",
    "cycle_online",
    "first_to_finish",
    "lognormal",
    "next_online",
    "over_selected",
    "steps_within",
    "straggler_count",
    "straggler_work",
    "transfer_seconds",
    "uniform",
]
