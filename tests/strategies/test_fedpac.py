"""FedPAC: heads combined by the QP over the round's clients, features pulled to the global prototypes."""

import pytest
import torch
from personal_helpers import personal_model, record_payloads

from fl_lightning.errors import ConfigError
from fl_lightning.functional.prototypes import collaboration_matrix, global_prototypes, simplex_qp
from fl_lightning.functional.representation import head_names
from fl_lightning.strategies import FedPAC, FedRep
from fl_lightning.strategies.fedpac import HEAD, PROTOS, STATS

from conftest import global_weights, make_module


def _flat(payload_head, names):
    return torch.cat([payload_head[n].reshape(-1) for n in names])


def test_each_clients_head_becomes_the_qp_combination_of_the_rounds_heads(fit):
    strategy = FedPAC(head_epochs=1, body_epochs=2)
    module = make_module(strategy, local_steps=6)
    seen = record_payloads(strategy)
    fit(module, rounds=2)
    names = sorted(head_names(module.client))
    last = [(c, p) for r, c, p in seen.uploads if r == 1]
    ids = [c for c, _ in last]
    heads = torch.stack([_flat(p[HEAD], names) for _, p in last])
    h = torch.stack([p[STATS]["h"] for _, p in last])
    v = torch.stack([p[STATS]["v"] for _, p in last])
    got_ids, A = strategy.last_weights
    assert got_ids == ids and len(ids) == 4
    for i, cid in enumerate(ids):
        alpha = simplex_qp(collaboration_matrix(h[i], h, v))  # the QP solved independently
        assert torch.allclose(A[i], alpha, atol=1e-6)
        assert A[i].min() >= 0 and A[i].sum().item() == pytest.approx(1.0)
        deployed = _flat(personal_model(module, cid), names)
        assert torch.allclose(deployed, A[i] @ heads, atol=1e-6)  # a convex combination of the heads
    assert (A.diagonal() < 1).any()  # some client borrows from others' heads


def test_the_combined_head_comes_back_with_the_next_message(fit):
    strategy = FedPAC(head_epochs=1, body_epochs=1)
    module = make_module(strategy, local_steps=2)
    seen = record_payloads(strategy)
    fit(module, rounds=3)
    names = sorted(head_names(module.client))
    assert all(HEAD not in p for r, _, p in seen.messages if r == 0)
    for r, _c, msg in seen.messages:
        if r == 0:
            continue
        assert PROTOS in msg and HEAD in msg and set(msg[HEAD]) == set(names)
        assert not set(msg["weights"]) & set(names)  # the body message never carries the head


def test_body_averaged_prototypes_from_class_counts(fit):
    strategy = FedPAC(head_epochs=1, body_epochs=1)
    module = make_module(strategy, local_steps=2)
    seen = record_payloads(strategy)
    start = global_weights(module)
    fit(module, rounds=1)
    stats = [p[STATS] for _, _, p in seen.uploads]
    c, total = global_prototypes(
        torch.stack([s["prototypes"] for s in stats]), torch.stack([s["counts"] for s in stats])
    )
    assert torch.allclose(strategy.prototypes, c) and torch.equal(strategy.proto_counts, total)
    assert total.sum().item() == sum(p[STATS]["counts"].sum().item() for _, _, p in seen.uploads)
    head = head_names(module.client)
    end = global_weights(module)
    assert all(torch.equal(start[n], end[n]) for n in head)  # the global model's head is never averaged


def _prototype_spread(lam, fit):
    strategy = FedPAC(lam=lam, head_epochs=1, body_epochs=3, collaborate=False)
    module = make_module(strategy, local_steps=8)
    seen = record_payloads(strategy)
    fit(module, rounds=3)
    dist = []
    for r, c, up in seen.uploads:
        if r != 2:
            continue
        msg = next(p for rr, cc, p in seen.messages if (rr, cc) == (r, c))
        present = (up[STATS]["counts"] > 0) & (msg[PROTOS]["counts"] > 0)
        diff = up[STATS]["prototypes"][present] - msg[PROTOS]["prototypes"][present]
        dist.append(diff.pow(2).sum(1).mean())
    return torch.stack(dist).mean().item()


def test_alignment_pulls_local_features_toward_the_global_prototypes(fit):
    assert _prototype_spread(50.0, fit) < 0.5 * _prototype_spread(0.0, fit)


def test_alignment_term_only_in_the_body_phase_after_round_zero(fit):
    class Recording(FedPAC):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.terms = []

        def local_loss(self, module, ctx, batch, outputs):
            out = super().local_loss(module, ctx, batch, outputs)
            self.terms.append((ctx.round, ctx.step, out is not None))
            return out

    strategy = Recording(head_epochs=1, body_epochs=1)
    fit(make_module(strategy, local_steps=4), rounds=2)
    assert not any(on for r, _, on in strategy.terms if r == 0)
    assert all(on == (s >= 2) for r, s, on in strategy.terms if r == 1)


def test_without_alignment_and_collaboration_it_is_fedrep(fit):
    a = make_module(FedPAC(lam=0.0, collaborate=False, head_epochs=1, body_epochs=2), local_steps=6)
    b = make_module(FedRep(head_epochs=1, body_epochs=2), local_steps=6)
    fit(a, rounds=2)
    fit(b, rounds=2)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="model.strategy.lam"):
        FedPAC(lam=-1.0)
    strategy = FedPAC(head=["net.features.0"])  # a conv: its input is no feature vector
    with pytest.raises(ConfigError, match="model.strategy.head"):
        strategy.setup(make_module().client, 4)
