"""One-line ConfigErrors for bad numbers: NaN, infinities and out-of-range values of every numeric knob."""

import math

import pytest

from fl_lightning import strategies as S
from fl_lightning.api.client import ClientModule
from fl_lightning.data import (
    FederatedDataModule,
    GaussianNoise,
    LabelNoise,
    LabelPermutation,
    MixedSkew,
    QuantitySkew,
    Rotation,
)
from fl_lightning.engine.runtime import Runtime
from fl_lightning.engine.system import Devices, RoundPolicy, Stragglers
from fl_lightning.errors import ConfigError, check_number
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import CharLSTM, LogisticRegression

NAN, INF = math.nan, math.inf

CASES = [
    (ClientModule, "lr", [NAN, INF, 0.0, -0.1], "model.client.lr"),
    (ClientModule, "momentum", [NAN, -1.0, 1.0], "model.client.momentum"),
    (ClientModule, "weight_decay", [NAN, -1.0, INF], "model.client.weight_decay"),
    (FederatedModule, "participation", [NAN, 0.0, 1.5], "model.participation"),
    (FederatedModule, "lr_decay", [NAN, 0.0, 1.1], "model.lr_decay"),
    (FederatedModule, "grad_clip_norm", [NAN, -1.0, 0.0, INF], "model.grad_clip_norm"),
    (FederatedModule, "seed", [-1], "model.seed"),
    (FederatedModule, "max_failed_rounds", [0], "model.max_failed_rounds"),
    (FederatedDataModule, "eval_batch_size", [0, -1], "data.eval_batch_size"),
    (FederatedDataModule, "seed", [-1], "data.seed"),
    (S.FedAvg, "server_lr", [NAN, 0.0, -1.0, INF], "model.strategy.server_lr"),
    (S.Ditto, "lam", [NAN, -1.0, INF], "model.strategy.lam"),
    (S.FedProx, "mu", [NAN, -1.0, INF], "model.strategy.mu"),
    (S.FedAdam, "eps", [NAN, 0.0], "model.strategy.eps"),
    (S.FedAdam, "betas", [(NAN, 0.9), (0.9, 1.0)], "model.strategy.betas"),
    (S.FedAvgM, "momentum", [NAN, -0.1, 1.0], "model.strategy.momentum"),
    (S.FedCM, "alpha", [NAN, 0.0, 1.5], "model.strategy.alpha"),
    (S.FedDC, "alpha", [NAN, 0.0], "model.strategy.alpha"),
    (S.FedDecorr, "beta", [NAN, -1.0], "model.strategy.beta"),
    (S.FedDyn, "alpha", [NAN, 0.0], "model.strategy.alpha"),
    (S.FedExP, "eps", [NAN, 0.0], "model.strategy.eps"),
    (S.FedSAM, "rho", [NAN, -1.0], "model.strategy.rho"),
    (S.FedSAM, "clip_norm", [NAN, 0.0], "model.strategy.clip_norm"),
    (S.FedGamma, "rho", [NAN], "model.strategy.rho"),
    (S.MoFedSAM, "alpha", [NAN], "model.strategy.alpha"),
    (S.FedSMOO, "beta", [NAN, 0.0], "model.strategy.beta"),
    (S.FedSMOO, "rho", [NAN], "model.strategy.rho"),
    (S.FedSpeed, "beta", [NAN, 0.0], "model.strategy.beta"),
    (S.FedSpeed, "sam_weight", [NAN, 1.5], "model.strategy.sam_weight"),
    (S.FineTune, "lr", [NAN, 0.0], "model.strategy.lr"),
    (S.FineTune, "seed", [-1], "model.strategy.seed"),
    (S.MOON, "mu", [NAN, -1.0], "model.strategy.mu"),
    (S.MOON, "temperature", [NAN, 0.0], "model.strategy.temperature"),
    (S.FedCOG, "gen_lr", [NAN, 0.0], "model.strategy.gen_lr"),
    (S.FedCOG, "lambda_kd", [NAN, -1.0], "model.strategy.lambda_kd"),
    (S.FedCOG, "lambda_dis", [NAN], "model.strategy.lambda_dis"),
    (S.FedCOG, "temperature", [NAN, 0.0], "model.strategy.temperature"),
    (S.PFedMe, "lam", [NAN, -1.0], "model.strategy.lam"),
    (S.PFedMe, "personal_lr", [NAN, 0.0], "model.strategy.personal_lr"),
    (S.PFedMe, "beta", [NAN, 0.0], "model.strategy.beta"),
    (S.PFedMe, "personal_momentum", [NAN, 1.0], "model.strategy.personal_momentum"),
    (S.TDPFed, "lam", [NAN], "model.strategy.lam"),
    (GaussianNoise, "sigma", [NAN, INF, -0.1], "data.client_transform.sigma"),
    (Rotation, "k", [0, -2], "data.client_transform.k"),
    (LabelPermutation, "k", [0], "data.client_transform.k"),
    (LabelNoise, "max_rate", [NAN, -0.1, 1.5], "data.client_transform.max_rate"),
    (LabelNoise, "min_rate", [NAN, -0.1, 0.9], "data.client_transform.min_rate"),
    (LabelNoise, "noisy_fraction", [NAN, 1.5], "data.client_transform.noisy_fraction"),
    (QuantitySkew, "alpha", [NAN, 0.0, -1.0], "data.partition.alpha"),
    (QuantitySkew, "min_size", [0], "data.partition.min_size"),
    (MixedSkew, "alpha", [NAN, 0.0], "data.partition.alpha"),
    (MixedSkew, "classes_per_client", [0], "data.partition.classes_per_client"),
    (CharLSTM, "hidden_size", [0, -1], "model.client.net.hidden_size"),
    (LogisticRegression, "input_dim", [0], "model.client.net.input_dim"),
    (RoundPolicy, "deadline_s", [NAN, 0.0, -1.0, INF], "model.round_policy.deadline_s"),
    (Runtime, "state_memory_mb", [NAN, -1.0], "model.runtime.state_memory_mb"),
    (Runtime, "vectorize_memory_gb", [NAN, 0.0, -1.0], "model.runtime.vectorize_memory_gb"),
    (RoundPolicy, "over_selection", [NAN, -0.5], "model.round_policy.over_selection"),
    (RoundPolicy, "target_accuracy", [NAN, 1.5], "model.round_policy.target_accuracy"),
    (RoundPolicy, "max_sim_time_s", [NAN, 0.0], "model.round_policy.max_sim_time_s"),
    (Devices, "speed", [NAN, 0.0, INF], "model.system.speed"),
    (Devices, "speed_sigma", [NAN, -0.1], "model.system.speed_sigma"),
    (Devices, "download_mbps", [NAN, 0.0], "model.system.download_mbps"),
    (Devices, "upload_mbps", [NAN, -1.0], "model.system.upload_mbps"),
    (Devices, "availability", [NAN, -0.1, 0.0, 1.5], "model.system.availability"),
    (Devices, "dropout", [NAN, -0.1, 1.5], "model.system.dropout"),
    (Devices, "day_s", [NAN, 0.0], "model.system.day_s"),
    (Devices, "online_fraction", [NAN, 0.0, 1.5], "model.system.online_fraction"),
    (Stragglers, "fraction", [NAN, -0.1, 1.1], "model.system.fraction"),
    (Stragglers, "speed", [NAN, 0.0], "model.system.speed"),
    (S.FedBuff, "server_lr", [NAN, 0.0], "model.strategy.server_lr"),
    (S.FedAsync, "alpha", [NAN, 0.0, 1.5], "model.strategy.alpha"),
    (S.FedAsync, "rho", [NAN, -1.0], "model.strategy.rho"),
    (S.FedAsync, "a", [NAN, -1.0], "model.strategy.a"),
]
PARAMS = [(cls, arg, bad, field) for cls, arg, values, field in CASES for bad in values]


@pytest.mark.parametrize(
    ("cls", "arg", "bad", "field"),
    PARAMS,
    ids=[f"{cls.__name__}.{arg}={bad}" for cls, arg, bad, _ in PARAMS],
)
def test_a_bad_number_is_a_one_line_config_error_naming_the_field(cls, arg, bad, field):
    with pytest.raises(ConfigError) as info:
        cls(**{arg: bad})
    msg = str(info.value)
    assert msg.startswith(f"{field}=") and "\n" not in msg


def test_check_number_messages():
    with pytest.raises(ConfigError, match=r"^x=nan must be a finite number > 0; e\.g\. 1$"):
        check_number(NAN, "x", low=0, low_open=True, hint="e.g. 1")
    with pytest.raises(ConfigError, match=r"^x=2 must be in \[0, 1\) \(a fraction\)$"):
        check_number(2, "x", low=0, high=1, high_open=True, hint="(a fraction)")
    with pytest.raises(ConfigError, match=r"^x='a' must be a finite number$"):
        check_number("a", "x")
    with pytest.raises(ConfigError, match=r"^x=True must be a finite number$"):
        check_number(True, "x")
    check_number(0, "x", low=0)
    check_number(1.0, "x", low=0, high=1)
