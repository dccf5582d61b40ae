"""Devices drawn from seeded distributions: heavy-tailed speed and bandwidth, availability, dropout."""

from __future__ import annotations

import math

import torch

from fl_lightning.engine.system.base import DEVICE_STREAM, SystemModel, check_probability
from fl_lightning.engine.system.profiles import Profiles
from fl_lightning.errors import check_number
from fl_lightning.functional.tensor import derive_seed


class Devices(SystemModel):
    """Every client's device drawn from seeded distributions (``--model.system=Devices``).

    Client ``k``'s compute speed ``v_k`` (training samples per second) and its download and upload bandwidth
    ``d_k``, ``u_k`` (Mbit/s) are lognormal,

    .. math:: v_k = v_{50} e^{\\sigma_v z_1}, \\quad d_k = d_{50} e^{\\sigma_b z_2}, \\quad
              u_k = u_{50} e^{\\sigma_b z_3}, \\qquad z_i \\sim \\mathcal N(0, 1)

    (medians ``v_50``, ``d_50``, ``u_50``): the heavy-tailed shape of FedScale's device traces (Lai et al.,
    ICML 2022, Sec. 3: compute speeds from AI Benchmark, bandwidth from MobiPerf's measurements of mobile
    networks), where the slowest devices are several times slower than the median; the default scales are
    round numbers for a phone-class device, not a fit to those traces (give your own, or a
    :class:`~fl_lightning.engine.system.trace.Trace`). The draws of client ``k`` come from a generator
    seeded by ``(run seed, k)``, so a client keeps its device when the federation grows.

    Availability: each time a round samples, client ``k`` is online with probability ``availability``
    (FLGo's homogeneous availability, Wang et al. 2023); with ``day_s`` set it also follows a day/night cycle,
    online for the first ``online_fraction`` of every period of ``day_s`` simulated seconds shifted by its own
    phase ``U[0, 1)`` (time zones; the diurnal availability FLASH measured on 136k phones, Yang et al., WWW
    2021). A sampled client drops out in the middle of its work with probability ``dropout`` (a failed client
    of the round).

    Args:
        speed: Median compute speed ``v_50`` in training samples per second.
        speed_sigma: ``sigma_v >= 0``, the standard deviation of ``log v_k`` (0: every device equally fast).
        download_mbps: Median download bandwidth ``d_50`` in Mbit/s.
        upload_mbps: Median upload bandwidth ``u_50`` in Mbit/s.
        bandwidth_sigma: ``sigma_b >= 0``, the standard deviation of ``log d_k`` and ``log u_k``.
        availability: Probability in [0, 1] that a client is online when a round samples.
        day_s: Period of the day/night cycle in simulated seconds (None: no cycle).
        online_fraction: Share of each period a client is online, in (0, 1] (with ``day_s``).
        dropout: Probability in [0, 1] that a sampled client drops out in the middle of its work.
    """

    def __init__(
        self,
        speed: float = 100.0,
        speed_sigma: float = 0.7,
        download_mbps: float = 20.0,
        upload_mbps: float = 5.0,
        bandwidth_sigma: float = 0.8,
        availability: float = 1.0,
        day_s: float | None = None,
        online_fraction: float = 0.5,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        f = self.field
        check_number(speed, f"{f}.speed", low=0, low_open=True, hint="(training samples per second)")
        check_number(speed_sigma, f"{f}.speed_sigma", low=0, hint="(0: every device equally fast)")
        check_number(download_mbps, f"{f}.download_mbps", low=0, low_open=True, hint="(Mbit/s)")
        check_number(upload_mbps, f"{f}.upload_mbps", low=0, low_open=True, hint="(Mbit/s)")
        check_number(bandwidth_sigma, f"{f}.bandwidth_sigma", low=0, hint="(0: equal bandwidth)")
        check_probability(availability, f"{f}.availability")
        check_probability(dropout, f"{f}.dropout")
        if day_s is not None:
            check_number(day_s, f"{f}.day_s", low=0, low_open=True, hint="(simulated seconds, e.g. 86400)")
        check_number(online_fraction, f"{f}.online_fraction", low=0, high=1, low_open=True)
        if availability == 0:
            check_number(
                availability, f"{f}.availability", low=0, high=1, low_open=True, hint="(0: never online)"
            )
        self.speed = speed
        self.speed_sigma = speed_sigma
        self.download_mbps = download_mbps
        self.upload_mbps = upload_mbps
        self.bandwidth_sigma = bandwidth_sigma
        self.availability = availability
        self.day_s = day_s
        self.online_fraction = online_fraction
        self.dropout = dropout

    def profiles(self, num_clients: int, seed: int) -> Profiles:
        """Client ``k``'s device from a generator seeded by ``(seed, k)``: ``z_1, z_2, z_3 ~ N(0, 1)`` and its
        phase ``U[0, 1)``."""
        speed, down, up, phase = [], [], [], []
        for k in range(num_clients):
            g = torch.Generator().manual_seed(derive_seed(seed, DEVICE_STREAM, k))
            z = torch.randn(3, generator=g, dtype=torch.float64).tolist()
            speed.append(self.speed * math.exp(self.speed_sigma * z[0]))
            down.append(self.download_mbps * math.exp(self.bandwidth_sigma * z[1]))
            up.append(self.upload_mbps * math.exp(self.bandwidth_sigma * z[2]))
            phase.append(float(torch.rand(1, generator=g, dtype=torch.float64)))
        cycle = self.day_s is not None
        return Profiles(
            speed=tuple(speed),
            download_mbps=tuple(down),
            upload_mbps=tuple(up),
            availability=(self.availability,) * num_clients,
            dropout=(self.dropout,) * num_clients,
            phase=tuple(phase) if cycle else (),
            day_s=self.day_s if cycle else 86400.0,
            online_fraction=self.online_fraction if cycle else 1.0,
        )


__all__ = ["Devices"]
