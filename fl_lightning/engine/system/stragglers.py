"""FedProx's stragglers (Li et al., MLSys 2020, Sec. 5.2): some of each round's devices do partial work."""

from __future__ import annotations

import torch

from fl_lightning.engine.system.base import SystemModel
from fl_lightning.engine.system.plan import RoundPlan
from fl_lightning.engine.system.policy import RoundPolicy
from fl_lightning.engine.system.profiles import Profiles
from fl_lightning.engine.system.setup import Setup
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.functional.system import straggler_count, straggler_work
from fl_lightning.functional.tensor import derive_seed

#: Seed stream of the round's stragglers and their work.
STRAGGLER_STREAM = 0x5D4


class Stragglers(SystemModel):
    """FedProx's systems heterogeneity (``--model.system=Stragglers --model.system.fraction=0.9``).

    Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020), Sec. 5.2: each round, a
    ``fraction`` of the selected devices are stragglers that run a uniformly random number of local epochs
    ``e ~ U{1, ..., E - 1}`` instead of ``E`` (``model.local_epochs``), drawn afresh per round and straggler.
    As the paper's code does (``flearn/trainers/fedprox.py``, ``drop_percent``): of the ``K`` selected
    devices, ``round(K (1 - fraction))`` (Python's round) stay active and the others are stragglers, the same
    ones for every method of a seed (a generator seeded by ``(seed, round)``); their epochs are
    ``np.random.randint(low=1, high=E)``, i.e. in [1, E). The round policy's ``policy: drop``
    (``--model.round_policy.policy=drop``) is the paper's FedAvg (the stragglers' work is dropped),
    ``policy: partial`` is FedProx (their partial work is aggregated, weighted by sample count like every
    upload). With ``model.local_steps=K`` instead of epochs a straggler runs
    ``U{1, ..., K - 1}`` steps.

    Time: every device is equally fast (``speed``, ``download_mbps``, ``upload_mbps``); a straggler is busy
    for the whole round at a reduced pace (the paper's "global clock cycle": it does the work that fits), so
    every round lasts as long as its slowest selected device's ``E`` epochs, under either policy.

    Args:
        fraction: Fraction in [0, 1] of each round's selected devices that are stragglers (0, 0.5, 0.9 in
            the paper's Fig. 1).
        speed: Every device's compute speed in training samples per second.
        download_mbps: Every device's download bandwidth in Mbit/s.
        upload_mbps: Every device's upload bandwidth in Mbit/s.
    """

    plans_rounds = True  # each round's stragglers and their epochs are its own plan

    def __init__(
        self,
        fraction: float = 0.5,
        speed: float = 100.0,
        download_mbps: float = 20.0,
        upload_mbps: float = 5.0,
    ) -> None:
        super().__init__()
        f = self.field
        check_number(fraction, f"{f}.fraction", low=0, high=1, hint="(of each round's selected devices)")
        check_number(speed, f"{f}.speed", low=0, low_open=True, hint="(training samples per second)")
        check_number(download_mbps, f"{f}.download_mbps", low=0, low_open=True, hint="(Mbit/s)")
        check_number(upload_mbps, f"{f}.upload_mbps", low=0, low_open=True, hint="(Mbit/s)")
        self.fraction = fraction
        self.speed = speed
        self.download_mbps = download_mbps
        self.upload_mbps = upload_mbps

    def profiles(self, num_clients: int, seed: int) -> Profiles:
        """Equal devices, always online, never dropping out."""
        n = num_clients
        return Profiles(
            (self.speed,) * n, (self.download_mbps,) * n, (self.upload_mbps,) * n, (1.0,) * n, (0.0,) * n
        )

    def bind(self, setup: Setup, round_policy: RoundPolicy | None = None) -> None:
        """As :meth:`SystemModel.bind`; refuses a deadline or over-selection (the rounds are the paper's) and
        work of fewer than two epochs (or steps)."""
        super().bind(setup, round_policy)
        policy = self.round_policy
        for name, unset in (("deadline_s", None), ("over_selection", 0.0)):
            value = getattr(policy, name)
            if value != unset:
                raise ConfigError(
                    f"{policy.field}.{name}={value:g} cannot act with {self.field}=Stragglers, whose rounds "
                    "are the paper's preset (every selected device is waited for); unset it, or use "
                    f"{self.field}=Devices or Trace"
                )
        work = setup.local_steps if setup.local_steps is not None else setup.local_epochs
        if self.fraction > 0 and (work is None or work < 2):
            name = "model.local_steps" if setup.local_steps is not None else "model.local_epochs"
            raise ConfigError(
                f"{self.field}=Stragglers: stragglers run a uniformly random number of local epochs in "
                f"[1, E) (Li et al., Sec. 5.2), which {name}={work} leaves empty; set {name} >= 2"
            )

    def describe(self) -> str:
        p = self.devices
        return (
            f"Stragglers: {self.fraction:.0%} of each round's devices run [1, E) epochs "
            f"({self.round_policy.policy}); "
            f"every device {p.speed[0]:g} samples/s, {p.download_mbps[0]:g}/{p.upload_mbps[0]:g} "
            "Mbit/s down/up"
        )

    def plan(self, round: int, sampled: list[int], cohort: int) -> RoundPlan:
        """Round ``round``: the stragglers among ``sampled`` and their work (module docstring)."""
        s = self.setup
        full = {c: s.full_steps[c] for c in sampled}
        finish = {c: self.client_seconds(c, n) for c, n in full.items()}
        g = torch.Generator().manual_seed(derive_seed(s.seed, STRAGGLER_STREAM, round))
        count = straggler_count(len(sampled), self.fraction)
        order = torch.randperm(len(sampled), generator=g).tolist()
        stragglers = sorted(sampled[i] for i in order[:count])
        high = s.local_steps if s.local_steps is not None else s.local_epochs
        work = dict(zip(stragglers, straggler_work(count, high or 2, g), strict=True)) if count else {}
        steps = dict(full)
        drop = self.round_policy.policy == "drop"
        if drop:
            for c in stragglers:
                del steps[c]
        else:
            for c, w in work.items():
                steps[c] = w if s.local_steps is not None else w * s.steps_per_epoch[c]
        return RoundPlan(
            sampled=list(sampled),
            steps=steps,
            finish_s={c: finish[c] for c in steps},
            late=stragglers if drop else [],
            partial=[] if drop else stragglers,
            duration_s=max(finish.values(), default=0.0),
        )


__all__ = ["STRAGGLER_STREAM", "Stragglers"]
