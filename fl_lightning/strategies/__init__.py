"""Federated strategies: one file and one small class each, registered by name.

Every algorithm is imported here explicitly and exported from ``fl_lightning.strategies``, so a YAML
config can say ``class_path: fl_lightning.strategies.FedProx`` or just ``FedProx``. Plug-ins that wrap
any strategy live in :mod:`fl_lightning.strategies.plugins`, mixins that change the local step (SAM,
the Moreau envelope) in :mod:`fl_lightning.strategies.mixins`. Adding a strategy is adding a file and
one import line here; ``@register_strategy`` lists it (:func:`list_strategies`).
"""

from __future__ import annotations

from fl_lightning.api import (
    STRATEGIES,
    ClientContext,
    RoundInfo,
    Strategy,
    StrategyWrapper,
    get_strategy,
    list_strategies,
    register_strategy,
)
from fl_lightning.strategies.apfl import APFL
from fl_lightning.strategies.cfl import CFL
from fl_lightning.strategies.ditto import Ditto
from fl_lightning.strategies.fedadam import FedAdam
from fl_lightning.strategies.fedala import FedALA
from fl_lightning.strategies.fedasync import FedAsync
from fl_lightning.strategies.fedavg import FedAvg
from fl_lightning.strategies.fedavg_sar import FedAvgSAR
from fl_lightning.strategies.fedavgm import FedAvgM
from fl_lightning.strategies.fedbabu import FedBABU
from fl_lightning.strategies.fedbuff import FedBuff
from fl_lightning.strategies.fedcm import FedCM
from fl_lightning.strategies.feddc import FedDC
from fl_lightning.strategies.feddecorr import FedDecorr
from fl_lightning.strategies.feddyn import FedDyn
from fl_lightning.strategies.fedexp import FedExP
from fl_lightning.strategies.fedgamma import FedGamma
from fl_lightning.strategies.fedgen import FedGen
from fl_lightning.strategies.fednova import FedNova
from fl_lightning.strategies.fedpac import FedPAC
from fl_lightning.strategies.fedper import FedPer
from fl_lightning.strategies.fedprox import FedProx
from fl_lightning.strategies.fedreg import FedReg
from fl_lightning.strategies.fedrep import FedRep
from fl_lightning.strategies.fedrod import FedRoD
from fl_lightning.strategies.fedsam import FedSAM
from fl_lightning.strategies.fedsmoo import FedSMOO
from fl_lightning.strategies.fedspeed import FedSpeed
from fl_lightning.strategies.ifca import IFCA
from fl_lightning.strategies.lg_fedavg import LGFedAvg
from fl_lightning.strategies.local import Local
from fl_lightning.strategies.mofedsam import MoFedSAM
from fl_lightning.strategies.moon import MOON
from fl_lightning.strategies.per_fedavg import PerFedAvg
from fl_lightning.strategies.pfedme import PFedMe
from fl_lightning.strategies.plugins.dp import DP
from fl_lightning.strategies.plugins.fast_slow import FastSlow
from fl_lightning.strategies.plugins.fedcog import FedCOG
from fl_lightning.strategies.plugins.finetune import FineTune
from fl_lightning.strategies.plugins.personal_atoms import PersonalAtoms
from fl_lightning.strategies.plugins.robust import Attack, Krum, Median, NormBounded, TrimmedMean
from fl_lightning.strategies.scaffold import Scaffold
from fl_lightning.strategies.tdpfed import TDPFed
from fl_lightning.strategies.vhl import VHL

__all__ = [
    "APFL",
    "CFL",
    "DP",
    "IFCA",
    "MOON",
    "STRATEGIES",
    "VHL",
    "Attack",
    "ClientContext",
    "Ditto",
    "FastSlow",
    "FedALA",
    "FedAdam",
    "FedAsync",
    "FedAvg",
    "FedAvgM",
    "FedAvgSAR",
    "FedBABU",
    "FedBuff",
    "FedCM",
    "FedCOG",
    "FedDC",
    "FedDecorr",
    "FedDyn",
    "FedExP",
    "FedGamma",
    "FedGen",
    "FedNova",
    "FedPAC",
    "FedPer",
    "FedProx",
    "FedReg",
    "FedRep",
    "FedRoD",
    "FedSAM",
    "FedSMOO",
    "FedSpeed",
    "FineTune",
    "Krum",
    "LGFedAvg",
    "Local",
    "Median",
    "MoFedSAM",
    "NormBounded",
    "PFedMe",
    "PerFedAvg",
    "PersonalAtoms",
    "RoundInfo",
    "Scaffold",
    "Strategy",
    "StrategyWrapper",
    "TDPFed",
    "TrimmedMean",
    "get_strategy",
    "list_strategies",
    "register_strategy",
]
