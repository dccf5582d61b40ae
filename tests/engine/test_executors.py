"""fl_lightning.engine.executors and engine.work: executors run a frozen Work, never an Engine.

Every test here builds its :class:`Work` by hand (data, a model, a strategy, a message and a state function)
and runs an executor on it without an :class:`~fl_lightning.engine.round.Engine`; the round and the executors
import nothing of each other.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from test_layout import PACKAGE, imports

from fl_lightning.api.client import ClientModule
from fl_lightning.api.metrics import TaskMetrics
from fl_lightning.api.types import ClientResult
from fl_lightning.data import IID
from fl_lightning.engine.executors import Sequential, Vectorized, default_executor, run_client
from fl_lightning.engine.local import LocalConfig, evaluate_deployed, train_client
from fl_lightning.engine.work import Executor, Work
from fl_lightning.functional.tensor import load_tensors, shared_state
from fl_lightning.models import SmallCNN
from fl_lightning.strategies import FedAvg, FedPer, Strategy

from conftest import make_data

#: The modules that run clients' work: none may import the round, and the round imports none of them.
EXECUTORS = (
    "engine/executors.py",
    "engine/vectorized.py",
    "engine/local.py",
    "engine/work.py",
    "flower/executor.py",
    "flower/client_app.py",
)


#: The classifier's last layer: FedPer's personal head.
HEAD = "net.classifier.2.weight"


def _module(path: str) -> str:
    return "fl_lightning." + path.removesuffix(".py").replace("/", ".")


def test_the_round_and_the_executors_import_nothing_of_each_other():
    """Both ways, function-local and TYPE_CHECKING imports included: they meet in engine/work.py."""
    round_imports = imports((PACKAGE / "engine" / "round.py").read_text(), "fl_lightning.engine.round")
    assert "fl_lightning.engine.work" in round_imports
    for path in EXECUTORS:
        assert _module(path) not in round_imports or path in ("engine/local.py", "engine/work.py"), path
        found = imports((PACKAGE / path).read_text(), _module(path))
        assert "fl_lightning.engine.round" not in found, path
        assert "fl_lightning.engine" not in found, path  # the package re-exports the Engine
    assert not any(m.startswith("fl_lightning.engine.executors") for m in round_imports)
    assert not any(m.startswith("fl_lightning.engine.vectorized") for m in round_imports)
    assert Path(PACKAGE / "engine" / "work.py").is_file()


def _net() -> ClientModule:
    torch.manual_seed(0)
    return ClientModule(SmallCNN(in_channels=1, num_classes=10, width=4, hidden=16), lr=0.1, momentum=0.0)


def _work(strategy: Strategy | None = None, clients=(0, 2), test_fraction: float = 0.25, **local) -> Work:
    """A round-1 work of ``clients`` over 3 IID digits clients, built without an engine."""
    num_clients = 3
    data = make_data(num_clients=3, partition=IID(), batch_size=8, local_test_fraction=test_fraction)
    data.setup("fit")
    model = _net()
    strategy = strategy or FedAvg()
    strategy.setup(model, num_clients)
    worker = copy.deepcopy(model)
    sent = {"weights": shared_state(model)}
    return Work(
        round=1,
        clients=tuple(clients),
        strategy=strategy,
        model=model,
        data=data.clients,
        message=lambda cid: sent,
        state=lambda cid: {},
        local=LocalConfig(batch_size=8, **{"local_steps": 3, "seed": 0, "vectorize_cpu": "batched", **local}),
        precision=None,
        worker=lambda: worker,
        metrics=lambda: TaskMetrics("multiclass", 10),
        local_metrics=lambda metrics=TaskMetrics("multiclass", 10): metrics,
    )


def test_the_work_is_frozen():
    work = _work()
    with pytest.raises(dataclasses.FrozenInstanceError):
        work.round = 2  # type: ignore[misc]


def test_sequential_trains_each_client_of_the_work_as_train_client_does():
    work = _work()
    done = []
    for cid, message, res in Sequential().train(work):  # consumed in turn: an upload aliases the worker
        done.append(cid)
        assert message is work.message(cid)
        direct = train_client(
            _net(), work.strategy, message, {}, work.data[cid], 1, work.local, None, work.eval_metrics(cid)
        )
        assert res.client_id == cid and res.num_samples == work.data[cid].num_samples
        assert all(torch.equal(res.upload["weights"][k], v) for k, v in direct.upload["weights"].items())
        assert res.metrics == pytest.approx(direct.metrics)
        assert "local_acc" in res.metrics  # evaluated on its local test split (work.local_metrics)
    assert done == [0, 2]


class _Boom(FedAvg):
    def on_client_start(self, module, ctx):
        super().on_client_start(module, ctx)
        if ctx.client_id == 0:
            raise RuntimeError("deliberate")


def test_an_error_in_a_client_is_its_outcome_and_the_next_client_still_trains():
    executor = Sequential()
    (c0, _, err), (c2, _, res) = executor.train(_work(_Boom()))
    assert (c0, c2) == (0, 2) and isinstance(err, RuntimeError) and "deliberate" in str(err)
    assert res.client_id == 2 and executor.counts == {"sequential": 2, "vectorised": 0}


def test_local_metrics_are_made_only_for_clients_with_a_local_test_split():
    """A run without local test splits never makes them (e.g. a 1-output regression has no metrics)."""

    def unmade():
        raise AssertionError("local metrics made for a client without a local test split")

    work = dataclasses.replace(_work(test_fraction=0.0), local_metrics=unmade)
    assert [type(res) for _, _, res in Sequential().train(work)] == [ClientResult, ClientResult]
    assert work.eval_metrics(0) is None and _work().eval_metrics(0) is not None


def test_a_message_is_built_when_its_client_work_starts():
    built: list[int] = []
    work = _work()
    sent = work.message(0)
    work = dataclasses.replace(work, message=lambda cid: built.append(cid) or sent)
    outcomes = Sequential().train(work)
    next(outcomes)
    assert built == [0]
    next(outcomes)
    assert built == [0, 2]


def test_a_client_first_round_starts_its_personal_layers_from_the_global_model():
    """run_client resets the worker's personal entries (the worker last trained another client)."""
    seen: list[torch.Tensor] = []

    class Watch(FedPer):
        def on_client_start(self, module, ctx):
            seen.append(module.state_dict()[HEAD].clone())
            super().on_client_start(module, ctx)

    work = _work(Watch())
    assert HEAD in work.strategy.personal_names(work.model)
    worker = work.worker()
    load_tensors(worker, {HEAD: torch.full_like(worker.state_dict()[HEAD], 9.0)})
    run_client(work, worker, work.personal_initial(), 0)
    assert torch.equal(seen[0], work.model.state_dict()[HEAD])


def test_vectorized_gives_the_sequential_outcomes_of_the_same_work():
    work = _work(clients=(0, 1, 2))

    def uploads(executor: Executor) -> dict[int, dict[str, torch.Tensor]]:
        return {c: {k: v.clone() for k, v in r.upload["weights"].items()} for c, _, r in executor.train(work)}

    seq = uploads(Sequential())
    executor = Vectorized(4)
    vec = uploads(executor)
    assert executor.counts["vectorised"] == 3 and not executor.notices
    assert list(vec) == list(seq) == [0, 1, 2]
    for cid, weights in seq.items():
        for k, v in weights.items():
            torch.testing.assert_close(vec[cid][k], v, rtol=0, atol=1e-5)


def test_vectorized_falls_back_with_one_notice_per_run(caplog):
    executor = Vectorized(4)
    work = _work(FedPer(), clients=(0, 1, 2))
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        list(executor.train(work))
        list(executor.train(dataclasses.replace(work, round=2)))
    notices = [r.getMessage() for r in caplog.records if "model.runtime.vectorize=4" in r.getMessage()]
    assert len(notices) == 1 and "FedPer does not declare vectorizable local terms" in notices[0]
    assert executor.counts == {"sequential": 6, "vectorised": 0} and len(executor.notices) == 1


def test_evaluate_merges_the_deployed_models_of_the_work_clients():
    work = _work(clients=(0, 1))
    per, merged = Sequential().evaluate(work)
    assert sorted(per) == [0, 1]
    weights = {k: v for k, v in work.model.state_dict().items() if v.is_floating_point()}
    expected = work.metrics()
    for cid in (0, 1):
        metrics = work.metrics()
        evaluate_deployed(_net(), weights, work.strategy, work.data[cid], {}, LocalConfig(8), metrics)
        assert per[cid] == pytest.approx(metrics.compute())
        expected.merge(metrics)
    assert merged.compute() == pytest.approx(expected.compute())


def test_the_default_executor_follows_model_vectorize():
    assert type(default_executor(LocalConfig(8))) is Sequential
    executor = default_executor(LocalConfig(8, vectorize=3))
    assert type(executor) is Vectorized and executor.size == 3
    assert isinstance(executor, Executor)
    assert executor.share(_work()) == [0, 2]  # one process trains every client
    assert executor.gather(_work(), None, None) == {}  # type: ignore[arg-type]
