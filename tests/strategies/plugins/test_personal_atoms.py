"""PersonalAtoms: local atoms stay on the client, train with the received model fixed, and are deployed."""

import logging

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.api.client import ClientModule
from fl_lightning.callbacks import FederatedCallback
from fl_lightning.engine.local import evaluate
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import Decomposed, LeNet, SmallCNN
from fl_lightning.models.decomposed import atom_names, coefficient_names
from fl_lightning.strategies import FedAvg, FedProx, PersonalAtoms
from fl_lightning.strategies.plugins.personal_atoms import LOCAL_ATOMS, _LocalAtoms

from conftest import global_weights, make_data, make_module


class Recorder(FederatedCallback):
    """Copies of every upload and of every client's local atoms after each round."""

    def __init__(self):
        self.uploads = []  # (round, client, {group: {name: tensor}})
        self.local = []  # per round: {client: {name: tensor}}

    def on_client_end(self, trainer, pl_module, round, index, total, result):
        up = {g: {n: t.detach().clone() for n, t in ts.items()} for g, ts in result.upload.items()}
        self.uploads.append((round, result.client_id, up))

    def on_round_end(self, trainer, pl_module, round, record):
        states = {c: pl_module.store.get(c) for c in range(pl_module.datamodule.num_clients)}
        self.local.append(
            {c: {k: v.clone() for k, v in s.items() if k.startswith(LOCAL_ATOMS)} for c, s in states.items()}
        )


def _module(strategy, dropout: bool = False, **kw):
    torch.manual_seed(0)
    net = (
        LeNet(in_channels=1, widths=(4, 8), hidden=(16, 16), input_size=8, padding=2, dropout=0.5)
        if dropout
        else SmallCNN(width=4, hidden=16)
    )
    kw.setdefault("local_steps", 2)
    return FederatedModule(
        client=ClientModule(Decomposed(net, num_atoms=4), lr=0.1, momentum=0.0), strategy=strategy, **kw
    )


def test_local_atoms_never_appear_in_an_upload(fit):
    rec = Recorder()
    module = _module(PersonalAtoms())
    fit(module, rounds=2, callbacks=[rec])
    shared = set(global_weights(module))
    assert len(rec.uploads) == 8
    for _, _, up in rec.uploads:
        assert set(up) == {"weights"} and set(up["weights"]) <= shared
        assert not any(LOCAL_ATOMS in n for n in up["weights"])
    for local in rec.local[-1].values():
        assert set(local) == {LOCAL_ATOMS + n for n in atom_names(module.client)}
        for d in local.values():  # no uploaded tensor carries the local atoms' values
            assert not any(torch.equal(d, t) for _, _, up in rec.uploads for t in up["weights"].values())


@pytest.mark.parametrize("base", [FedAvg, lambda: FedProx(mu=0.1)])
def test_global_training_is_bit_identical_to_the_base_strategy(base, fit):
    plain, personal = _module(base(), dropout=True), _module(PersonalAtoms(base()), dropout=True)
    fit(plain, rounds=2)
    fit(personal, rounds=2)
    a, b = global_weights(plain), global_weights(personal)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith(LOCAL_ATOMS) for k in personal.store.get(0))


def test_local_atom_step_uses_the_received_coefficients_and_head():
    torch.manual_seed(0)
    module = ClientModule(Decomposed(SmallCNN(width=4, hidden=16), num_atoms=4), lr=0.1, momentum=0.0)
    reference = ClientModule(Decomposed(SmallCNN(width=4, hidden=16), num_atoms=4), lr=0.1, momentum=0.0)
    received = {n: t.detach().clone() for n, t in module.named_parameters()}
    reference.load_state_dict(received)
    names = atom_names(module)
    local = _LocalAtoms(received, {n: received[n].clone().requires_grad_() for n in names})
    with torch.no_grad():  # local training has moved the module away from what it received
        for p in module.parameters():
            p.add_(0.5)
    moved = {n: t.detach().clone() for n, t in module.named_parameters()}
    x, y = torch.randn(5, 1, 8, 8), torch.randint(0, 10, (5,))
    local.step(module, (x, y), lr=0.3)
    F.cross_entropy(reference(x), y).backward()
    ref = dict(reference.named_parameters())
    for n in names:
        torch.testing.assert_close(
            local.atoms[n].detach(), received[n] - 0.3 * ref[n].grad, rtol=1e-5, atol=1e-6
        )
    assert all(torch.equal(moved[n], t) for n, t in module.named_parameters())  # the module is untouched
    assert all(p.grad is None for p in module.parameters())


def test_one_local_step_gives_the_same_atoms_as_the_one_client_global_model(fit):
    module = _module(PersonalAtoms(), local_steps=1)
    fit(module, rounds=1, data=make_data(num_clients=1), limit_val_batches=0)
    glob, state = global_weights(module), module.store.get(0)
    for n in atom_names(module.client):  # same gradient at the same received point
        torch.testing.assert_close(state[LOCAL_ATOMS + n], glob[n], rtol=0, atol=1e-6)


def test_unselected_clients_keep_their_local_atoms(fit):
    rec = Recorder()
    module = _module(PersonalAtoms(), clients_per_round=2)
    fit(module, rounds=4, callbacks=[rec])
    for r in range(1, 4):
        sampled = module.engine.sample(r)
        for c in range(4):
            before, after = rec.local[r - 1][c], rec.local[r][c]
            if c in sampled:
                assert before.keys() <= after.keys() and after
            else:
                assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_deployed_model_is_global_coefficients_with_the_clients_local_atoms(fit):
    module = _module(PersonalAtoms())
    fit(module, rounds=2)
    glob = global_weights(module)
    worker = module.worker
    worker.load_state_dict(glob)
    state = module.store.get(1)
    module.strategy.personalize(worker, 1, state)
    deployed = worker.state_dict()
    for n in atom_names(module.client):
        assert torch.equal(deployed[n], state[LOCAL_ATOMS + n]) and not torch.equal(deployed[n], glob[n])
    for n in coefficient_names(module.client):
        assert torch.equal(deployed[n], glob[n])
    assert "acc" in module.client_eval[1]


def test_without_decomposed_layers_it_warns_and_runs_as_its_base(fit, caplog):
    with caplog.at_level(logging.WARNING):
        a, b = make_module(FedAvg()), make_module(PersonalAtoms())
        fit(a, rounds=1)
        fit(b, rounds=1)
    assert "no DecomposedConv2d" in caplog.text
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_reported_client_metrics_are_those_of_the_deployed_model_on_the_local_test_split(fit):
    """``z_client/<id>/*`` (summary's ``client_acc``): ``(alpha^T, D_l, theta_h^T)`` on the test split."""
    module = _module(PersonalAtoms(), local_steps=6)
    data = make_data(local_test_fraction=0.3)
    fit(module, data=data, rounds=3)
    glob, names = global_weights(module), atom_names(module.client)

    def metrics_of(weights, client):
        module.worker.load_state_dict(weights)
        metrics = module.engine.metrics()
        evaluate(module.worker, client.eval_batches(data.eval_batch_size), metrics)
        return {k: float(v) for k, v in metrics.compute().items()}

    differs = False
    for client in data.clients:
        assert client.test_idx.numel() > 0
        assert not set(client.test_idx.tolist()) & set(client.train_idx.tolist())
        state = module.store.get(client.client_id)
        personal = metrics_of({**glob, **{n: state[LOCAL_ATOMS + n] for n in names}}, client)
        reported = {k: float(v) for k, v in module.client_eval[client.client_id].items()}
        assert reported == pytest.approx(personal, abs=1e-6), client.client_id
        differs |= reported != pytest.approx(metrics_of(glob, client), abs=1e-6)
    assert differs  # an evaluation of the global model instead would fail the check above
