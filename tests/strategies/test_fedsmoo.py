"""FedSMOO: reductions (r = 0 is FedDyn, first step is SAM), the mu and s updates, 2x traffic, resume."""

import math

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.errors import ConfigError
from fl_lightning.functional.sharpness import global_norm
from fl_lightning.strategies import FedAvg, FedDyn, FedSAM, FedSMOO
from fl_lightning.strategies.fedsmoo import GROUP, MU

from conftest import global_weights, make_data, make_module, make_trainer

R = 0.05


def traced(cls):
    """``cls`` recording the worker's parameters after every local step, the perturbations ``e``,
    the ``s`` each client received and each client's ``mu`` at the start of its round."""

    class Traced(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.trace, self.offsets, self.received, self.mu_start = [], [], [], []

        def on_client_start(self, module, ctx):
            super().on_client_start(module, ctx)
            self.offsets.append((ctx.round, ctx.client_id, []))
            if GROUP in ctx.message:
                self.received.append({n: t.clone() for n, t in ctx.message[GROUP].items()})
                self.mu_start.append(
                    {k[len(MU) :]: v.clone() for k, v in ctx.state.items() if k.startswith(MU)}
                )

        def on_perturbation(self, module, ctx, names, offsets):
            super().on_perturbation(module, ctx, names, offsets)
            self.offsets[-1][2].append(dict(zip(names, [e.clone() for e in offsets])))

        def on_after_optimizer_step(self, module, optimizer, ctx):
            super().on_after_optimizer_step(module, optimizer, ctx)
            self.trace.append(torch.cat([p.detach().flatten() for p in module.parameters()]))

    return Traced


def _equal_weights(a, b):
    wa, wb = global_weights(a), global_weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_fedsmoo_with_r_zero_is_feddyn_step_for_step(fit):
    dyn = traced(FedDyn)(alpha=0.1)
    smoo = traced(FedSMOO)(beta=10.0, rho=0.0, clip_norm=None)
    a = make_module(dyn, clients_per_round=2, local_steps=3)
    b = make_module(smoo, clients_per_round=2, local_steps=3)
    fit(a, rounds=3)
    fit(b, rounds=3)
    # every local step of every client of every round, bit for bit (same batches, same float ops:
    # the second pass recomputes g exactly at the restored w and the FedDyn terms are added at w)
    assert len(dyn.trace) == len(smoo.trace) == 3 * 2 * 3
    assert all(torch.equal(x, y) for x, y in zip(dyn.trace, smoo.trace))
    assert _equal_weights(a, b)
    assert all(torch.equal(dyn.h[n], smoo.h[n]) for n in dyn.h)
    for cid, state in a.store.state_dict().items():
        other = b.store.get(cid)
        assert all(torch.equal(v, other[k]) for k, v in state.items())
        assert all(v.abs().max() == 0 for k, v in other.items() if k.startswith(MU))  # mu stays 0
    assert all(t.abs().max() == 0 for t in smoo.perturbation.as_dict().values())  # so does s


def test_perturbations_have_global_norm_r_and_the_first_step_is_plain_sam(fit):
    smoo = traced(FedSMOO)(rho=R, clip_norm=None)
    sam = traced(FedSAM)(rho=R, clip_norm=None)
    fit(make_module(smoo, clients_per_round=2, local_steps=3), rounds=2)
    fit(make_module(sam, clients_per_round=2, local_steps=3), rounds=1)
    first_smoo, first_sam = smoo.offsets[0][2][0], sam.offsets[0][2][0]
    assert all(torch.equal(first_smoo[n], first_sam[n]) for n in first_sam)  # mu = s = 0: e = r g/||g||
    assert not all(torch.equal(smoo.offsets[0][2][1][n], sam.offsets[0][2][1][n]) for n in first_sam)
    for _, _, steps in smoo.offsets:
        for e in steps:
            norm = global_norm(e.values()).item()  # ONE norm over all parameters
            assert math.isclose(norm, R, rel_tol=1e-5)
            assert max(t.norm().item() for t in e.values()) < R * (1 - 1e-3)  # no tensor has norm r alone


def test_mu_accumulates_the_perturbations_of_all_local_steps(fit):
    K = 4
    smoo = traced(FedSMOO)(rho=R, clip_norm=None)
    module = make_module(smoo, clients_per_round=2, local_steps=K)
    fit(module, rounds=3)
    later = [i for i, (rnd, _, _) in enumerate(smoo.offsets) if rnd > 0]
    assert later
    for i in later:
        rnd, cid, steps = smoo.offsets[i]
        s, mu0 = smoo.received[i], smoo.mu_start[i]
        assert math.isclose(global_norm(s.values()).item(), R, rel_tol=1e-5)  # s^t has norm r for t >= 1
        mu_end = module.store.get(cid) if rnd == 2 else None
        expected = {n: mu0.get(n, torch.zeros_like(s[n])) for n in s}
        for e in steps:  # mu_i <- mu_i + (s_hat_k - s), Alg. 1 line 9
            expected = {n: expected[n] + (e[n] - s[n]) for n in s}
        # |mu_new - mu_old + K s| = |sum_k s_hat_k| <= K r  (spec P3)
        drift = {n: expected[n] - mu0.get(n, torch.zeros_like(s[n])) + K * s[n] for n in s}
        assert global_norm(drift.values()).item() <= K * R * (1 + 1e-5)
        if mu_end is not None:
            assert all(torch.equal(mu_end[MU + n], expected[n]) for n in s)
    assert smoo.received[0] and all(t.abs().max() == 0 for t in smoo.received[0].values())  # s^0 = 0


@pytest.mark.parametrize("rule", ["paper", "simulator"])
def test_server_perturbation_rules(rule, fit):
    smoo = traced(FedSMOO)(rho=R, s_rule=rule, clip_norm=None)
    module = make_module(smoo, clients_per_round=4, local_steps=3)
    fit(module, rounds=1)
    names = smoo.perturbation.keys()
    per_client = []
    for _, cid, steps in smoo.offsets:
        mu = module.store.get(cid)
        last = steps[-1]
        if rule == "paper":  # s~_i = mu_i - s_hat_{i,K} (Alg. 1 line 13)
            per_client.append([mu[MU + n] - last[n] for n in names])
        else:  # s~_i = mu_i (reference code)
            per_client.append([mu[MU + n] for n in names])
    mean = [sum(t[j] for t in per_client) / len(per_client) for j in range(len(names))]
    norm = global_norm(mean)
    s = smoo.perturbation.as_dict()
    for n, m in zip(names, mean):
        torch.testing.assert_close(s[n], m * (R / (norm + 1e-7)))
    assert math.isclose(global_norm(s.values()).item(), R, rel_tol=1e-5)
    # the two rules differ by the last perturbation: mean_S(s_hat_K) != 0
    last_mean = [sum(steps[-1][n] for _, _, steps in smoo.offsets) for n in names]
    assert global_norm(last_mean).item() > 1e-3


def test_fedsmoo_communicates_two_models_each_way(fit):
    a, b = make_module(FedAvg()), make_module(FedSMOO())
    fit(a, rounds=1)
    fit(b, rounds=1)
    assert b.history[0].bytes_down == 2 * a.history[0].bytes_down
    assert b.history[0].bytes_up == 2 * a.history[0].bytes_up


def test_duals_and_global_perturbation_survive_a_resume(tmp_path):
    def module():
        return make_module(FedSMOO(rho=R), clients_per_round=2, local_steps=2)

    full = module()
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpts", save_top_k=-1, every_n_train_steps=1, filename="{step}"
    )
    make_trainer(tmp_path, rounds=3, callbacks=[ckpt], enable_checkpointing=True).fit(
        full, datamodule=make_data()
    )
    resumed = module()
    trainer = make_trainer(tmp_path / "b", rounds=3)
    trainer.fit(resumed, datamodule=make_data(), ckpt_path=tmp_path / "ckpts" / "step=2.ckpt")
    assert _equal_weights(full, resumed)
    sf, sr = full.strategy.perturbation.as_dict(), resumed.strategy.perturbation.as_dict()
    assert all(torch.equal(sf[n], sr[n]) for n in sf) and global_norm(sf.values()).item() > 0
    for cid, state in full.store.state_dict().items():
        other = resumed.store.get(cid)
        assert sorted(state) == sorted(other) and any(k.startswith(MU) for k in state)
        assert all(torch.equal(v, other[k]) for k, v in state.items())


def test_fedsmoo_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.beta"):
        FedSMOO(beta=0.0)
    with pytest.raises(ConfigError, match="model.strategy.s_rule"):
        FedSMOO(s_rule="average")
    with pytest.raises(ConfigError, match="model.strategy.rho"):
        FedSMOO(rho=-1.0)
