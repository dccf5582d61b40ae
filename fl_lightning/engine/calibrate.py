"""Whether a CPU process trains its vectorised groups batched or one client at a time: measured on the
run's own clients, not assumed.

On a GPU a client's small-batch step is launch-bound and batching clients pays. On a CPU it depends on the
network and the sizes: batching saves the per-operation overhead of many small steps (linear chains,
embeddings, small recurrent and convolutional layers), but a group's stacked weights do not stay in cache
where one client's do (a hundred clients of the FedAvg paper's 2NN hold 63 MB of first-layer weights and
every step reads and writes them all), and ``vmap``'s batched convolutions can be slower than plain ones.
So with ``model.runtime.vectorize_cpu=measure`` (the default) a CPU process measures both on its first clients
(:class:`CpuDecision`): it trains the first few clients of its first round one at a time (a tenth of a
group, at least :data:`MIN_TIMED` and at most :data:`MAX_TIMED`), then a small probe group (as many
clients, at least :data:`MIN_PROBE`), then, if the probe was faster, the rest of the round in groups,
timing each side's local work per client-step (the clients' uploads and local evaluation included, the
engine's work between clients not; on one intra-op thread the thread's CPU time, which other processes
on a shared machine inflate less than wall-clock time, else wall-clock time), and from then on trains
every group the faster way. Where batching does not pay, the probe says so and only its few clients ran
the slower way (the character LSTM under vmap measured 0.23x on the benchmarks' machine: a first round
that trained all but two of its clients batched took several times as long as one at a time); where
the probe pays, the decision is made on a full group (whose stacked weights may not stay in cache where a
probe's do). Nothing is trained twice: the measured clients are the round's. A round too small to split
is timed whole, one way this round and the other way the next. The first client trained one at a time
(warm-up) is left out of its side's time.

**A reading against batching is taken twice.** On a shared machine one reading can be far off (the 2NN's
groups read 1.05x to 2.36x against a steady 2.3x while other processes ran), and a single low reading would
train the whole run one at a time. So when the first measurement finds batching slower, the process
measures again at once (clients one at a time, a probe, a full group, as above) and decides on the mean of
the two readings (:attr:`CpuDecision.readings`). A measurement that finds batching faster decides at once:
the cost of a wrong "batched" is bounded by how much slower batching truly is, which the second reading of
a true loss would show.

**Where a group would run through** ``torch.func.vmap`` (a network that is not a linear chain of
:mod:`~fl_lightning.engine.batched`: convolutions, recurrent layers, embeddings; or a compiled forward, or
bf16 autocast) the clients train one at a time without measuring (:meth:`CpuDecision.rule`): on CPUs
``vmap``'s batched convolutions and its unrolled recurrence measured slower than one client at a time
(the zero-config SmallCNN 0.79x and 0.98x; LEAF's character LSTM 0.23x and 0.38x, whose probe of 4
clients alone made a 5-client round several times as long: a measurement there only costs), and an LSTM
written as batched matrix products per time step was slower still (hidden 64, 100 clients: 83 ms per
client-step against 5 ms for ``aten::lstm`` one client at a time; hidden 256 is compute-bound, 65 ms per
step one at a time, where batching cannot save the per-operation overhead it is for; the SmallCNN's
convolutions as one grouped convolution measured 0.57x to 1.37x with the sizes). So on a CPU only
the batched linear chain is measured; ``model.runtime.vectorize_cpu=batched`` batches the others anyway.

Groups are of ``model.runtime.vectorize`` clients (within the memory budget). Smaller groups, whose weights
would stay in cache across the local steps, were measured too and not worth it on the benchmarks'
2-core machine: with a round's per-client work (upload, metrics, local evaluation) included, groups of
4 to 100 clients of the 2NN took the same time per client-step within the noise of a shared machine
(and a large linear layer holds its steps back instead, :class:`~fl_lightning.engine.batched.Deferred`).
A resumed run measures again in its first round.

The decision is logged once (a notice when the clients train one at a time, since the run is then slower
than asked) and put in every round's record as ``vectorize/*`` scalars (logged to TensorBoard and kept in
``summary.json``): ``vectorize/batched`` (1 or 0), ``vectorize/group_size`` (the clients per group),
``vectorize/speedup`` (measured time per client-step one at a time over batched: the mean of the readings;
absent where the rule decided) and
``vectorize/fused_sgd`` (1 when the local SGD step ran fused into the batched backward, see
:mod:`~fl_lightning.engine.batched`).

``model.runtime.vectorize_cpu=batched`` or ``one_at_a_time`` pins the choice: a rerun that must take the same
path bit for bit (batched and one-at-a-time results agree to float rounding, not bit for bit).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

#: ``model.runtime.vectorize_cpu`` values.
CPU_MODES = ("measure", "batched", "one_at_a_time")
#: Clients timed one at a time before any group: a tenth of the largest group, within these bounds.
MIN_TIMED, MAX_TIMED = 2, 5
#: The smallest probe group (a first group of this many clients, or as many as were timed one at a time,
#: before any full group): groups of 4 to 100 clients of the 2NN took the same time per client-step.
MIN_PROBE = 4
#: Fraction of the host's available memory that a CPU group may use when no budget is given.
HOST_MEMORY_FRACTION = 0.5


@dataclass
class Timing:
    """Seconds of local work and client-steps, per timed client (one at a time) or group."""

    seconds: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    clients: int = 0

    def add(self, seconds: float, steps: int, clients: int = 1) -> None:
        self.seconds.append(seconds)
        self.steps.append(steps)
        self.clients += clients

    def per_step(self, skip_first: bool = False) -> float:
        """Seconds per client-step (the first entry left out if ``skip_first`` and there are others)."""
        start = 1 if skip_first and len(self.seconds) > 1 else 0
        return sum(self.seconds[start:]) / max(1, sum(self.steps[start:]))


class CpuDecision:
    """A CPU process's choice between groups of ``largest`` clients and one client at a time, measured or
    pinned; see the module docstring.

    Args:
        mode: ``model.runtime.vectorize_cpu``: ``measure``, ``batched`` or ``one_at_a_time``.
        largest: The clients per group (``model.runtime.vectorize`` within the memory budget).
    """

    def __init__(self, mode: str, largest: int) -> None:
        if mode not in CPU_MODES:
            raise ValueError(f"mode {mode!r} is not one of {CPU_MODES}")
        self.mode = mode
        self.largest = largest
        #: Whether groups train batched (None: still measuring).
        self.batched: bool | None = {"batched": True, "one_at_a_time": False}.get(mode)
        self.to_time = min(MAX_TIMED, max(MIN_TIMED, math.ceil(largest / 10)))
        #: The first group's size (the probe; a full group if it is not smaller than one).
        self.probe = min(largest, max(MIN_PROBE, self.to_time))
        self.one = Timing()  # clients one at a time
        self.groups = Timing()  # batched groups (after a probe that paid: the full groups only)
        #: The probe group's timing once it paid (None: no probe yet, or the probe was a full group).
        self.probed: Timing | None = None
        #: The round in which the measurement ended (None: pinned, decided by rule, or not yet).
        self.round: int | None = None
        #: Each measurement's speedup (one at a time over batched): one, or two where the first found
        #: batching slower; the decision is on their mean.
        self.readings: list[float] = []
        #: Why the clients train one at a time without a measurement (None: measured or pinned).
        self.reason: str | None = None
        #: The clock of the timings: the thread's CPU time on one intra-op thread (preemption by other
        #: processes does not count), wall-clock time otherwise (intra-op threads work in parallel).
        self.clock: Callable[[], float] = (
            time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        )

    def rule(self, reason: str) -> None:
        """Decide one client at a time without measuring, for ``reason`` (a group would run under vmap)."""
        if self.batched is None:
            self.batched, self.reason = False, reason

    @property
    def measuring(self) -> bool:
        return self.batched is None

    @property
    def size(self) -> int | None:
        """The clients per group (1: one at a time; None: still measuring)."""
        return None if self.batched is None else (self.largest if self.batched else 1)

    def next_group(self, left: int) -> int:
        """The size of the next group of a round with ``left`` clients still to train (1: one at a time)."""
        if self.batched is not None:
            return min(self.largest, left) if self.batched else 1
        if left < 2 or len(self.one.seconds) < self.to_time:
            return 1
        if self.probed is None and not self.groups.seconds:
            return min(self.probe, left)  # the probe
        return min(self.largest, left)

    def add(self, size: int, seconds: float, steps: int, round: int) -> bool:
        """The timed local work of a group of ``size`` clients (1: one client one at a time), ``steps``
        client-steps in all; True when this ended the measurement."""
        if self.batched is not None:
            return False
        (self.one if size == 1 else self.groups).add(seconds, steps, size)
        if size == 1 or len(self.one.seconds) < MIN_TIMED:
            return False
        if self.probed is None and size < self.largest and self.reading >= 1.0:
            self.probed, self.groups = self.groups, Timing()  # the probe paid: decide on a full group
            return False
        self.readings.append(self.reading)
        if len(self.readings) == 1 and self.reading < 1.0:  # against batching: measure once more
            self.one, self.groups, self.probed = Timing(), Timing(), None
            return False
        self.batched = self.speedup >= 1.0
        self.round = round
        return True

    @property
    def reading(self) -> float:
        """This measurement's time per client-step one at a time over batched (NaN before both ran)."""
        if not self.one.seconds or not self.groups.seconds:
            return math.nan
        return self.one.per_step(skip_first=True) / max(self.groups.per_step(), 1e-12)

    @property
    def speedup(self) -> float:
        """What the decision is on: the mean of the readings once decided, else the current reading."""
        return statistics.fmean(self.readings) if self.round is not None else self.reading

    def describe(self) -> str:
        """The measurement, for the decision's log line."""
        if self.reason is not None:
            return self.reason
        text = (
            f"{1e3 * self.groups.per_step():.3f} ms per client-step batched against "
            f"{1e3 * self.one.per_step(skip_first=True):.3f} ms one at a time ({self.reading:.2f}x), "
            f"measured in round {self.round} on {self.one.clients} + {self.groups.clients} clients"
            + (f" (after a probe of {self.probed.clients})" if self.probed is not None else "")
        )
        if len(self.readings) > 1:
            text += f"; a first reading {self.readings[0]:.2f}x; {self.speedup:.2f}x on average"
        return text


def host_memory_budget() -> float | None:
    """Bytes a CPU group may use without a ``model.runtime.vectorize_memory_gb``: :data:`HOST_MEMORY_FRACTION`
    of the host's available memory (``MemAvailable`` of ``/proc/meminfo``, else the free physical pages);
    None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return HOST_MEMORY_FRACTION * int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return HOST_MEMORY_FRACTION * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
