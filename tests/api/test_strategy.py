"""The Strategy API's own mechanics: personal entries, extra payload groups, local_step."""

import copy
import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score
from torch import nn

from fl_lightning.api.strategy import (
    CAPABILITIES,
    HOOKS,
    PERSONAL,
    STRATEGIES,
    Strategy,
    StrategyWrapper,
    declaring,
    own_local_step,
)
from fl_lightning.errors import ConfigError
from fl_lightning.strategies import FedAvg, Scaffold, get_strategy
from fl_lightning.strategies.plugins import Median

from conftest import global_weights, make_data, make_module


class PersonalHead(FedAvg):
    """FedAvg with a personal output layer (never communicated)."""

    def __init__(self):
        super().__init__()
        self.uploaded: set[str] = set()

    def personal_names(self, model):
        return {n for n in model.state_dict() if n.startswith("net.classifier.2.")}

    def upload(self, module, ctx):
        up = super().upload(module, ctx)
        self.uploaded |= set(up["weights"])
        return up


def test_personal_entries_stay_on_their_client(fit):
    strategy = PersonalHead()
    module = make_module(strategy, clients_per_round=4)
    start = global_weights(module)
    data = make_data()
    fit(module, rounds=2, data=data)
    assert strategy.uploaded and not any(n.startswith("net.classifier.2.") for n in strategy.uploaded)
    end = global_weights(module)
    for name in ("net.classifier.2.weight", "net.classifier.2.bias"):  # never aggregated
        assert torch.equal(start[name], end[name])
    heads = [module.store.get(c)["personal/net.classifier.2.weight"] for c in range(4)]
    assert all(not torch.equal(heads[0], h) for h in heads[1:])  # one head per client
    assert not torch.equal(heads[0], start["net.classifier.2.weight"])
    # personalised evaluation: each client's metrics are those of the global body with its own head
    per = module.final_client_metrics()
    assert sorted(per) == [0, 1, 2, 3]
    for c in range(4):
        client = data.clients[c]
        idx = client.test_idx if client.test_idx.numel() else client.train_idx
        x, y = client.x[idx], client.y[idx]
        own, shared = copy.deepcopy(module.client), copy.deepcopy(module.client)
        state = module.store.get(c)
        own.load_state_dict({**end, **{n: state[PERSONAL + n] for n in strategy.personal_names(own)}})
        with torch.no_grad():
            logits, logits_shared = own(x), shared(x)
        assert per[c]["acc"] == pytest.approx(accuracy_score(y.numpy(), logits.argmax(-1).numpy()), abs=1e-6)
        assert per[c]["loss"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
        assert per[c]["loss"] != pytest.approx(float(F.cross_entropy(logits_shared, y)), rel=1e-3)


class DoubleStep(FedAvg):
    """Overrides local_step: two optimizer steps per batch (e.g. an inner loop)."""

    def local_step(self, module, optimizer, ctx, batch, closure):
        optimizer.step(closure)
        optimizer.step(closure)
        ctx.scratch["steps"] = ctx.scratch.get("steps", 0) + 2

    def upload(self, module, ctx):
        ctx.state["steps"] = torch.tensor(ctx.scratch["steps"])
        return {**super().upload(module, ctx), "extra": {"count": torch.ones(3)}}


def test_local_step_override_and_extra_payload_groups(fit):
    module = make_module(DoubleStep(), local_steps=3)
    fit(module, rounds=1)
    assert int(module.store.get(0)["steps"]) == 6
    model_bytes = sum(p.numel() * 4 for p in module.client.parameters())
    assert module.history[0].bytes_up == 4 * (model_bytes + 12)
    assert module.history[0].bytes_down == 4 * model_bytes


def test_a_wrapper_that_adds_nothing_is_bit_identical_to_its_base(fit):
    from fl_lightning.strategies import StrategyWrapper

    a = make_module(FedAvg())
    b = make_module(StrategyWrapper(FedAvg()))
    fit(a, rounds=2)
    fit(b, rounds=2)
    wa, wb = global_weights(a), global_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------------ StrategyWrapper
def _hooks() -> list[str]:
    """Every public method of Strategy that is not nn.Module's own."""
    return sorted(
        n
        for n, _ in inspect.getmembers(Strategy, inspect.isfunction)
        if not n.startswith("_") and not hasattr(nn.Module, n)
    )


def _recording_strategy(hooks: list[str]) -> Strategy:
    """A Strategy whose every hook records its name and arguments and returns a fresh sentinel."""

    def make(name):
        def hook(self, *args, **kwargs):
            result = SimpleNamespace(name=name)
            self.calls.append((name, args, result))
            return result

        return hook

    base = type("Recording", (Strategy,), {n: make(n) for n in hooks})()
    base.calls = []
    return base


def test_the_hook_list_is_every_public_method_of_strategy():
    assert sorted(HOOKS) == _hooks()
    assert {"select_clients", "aggregator", "process_upload", "process_aggregate"} <= set(HOOKS)
    for gone in ("shared_names", "server_receive", "weighting", "cannot_vectorize", "vector_scratch"):
        assert not hasattr(Strategy, gone)  # one aggregation declaration, one vectorisation declaration


def test_every_hook_is_overridden_by_a_registered_strategy():
    """A hook no strategy needs goes: each one is overridden by some registered strategy (its docstring
    names them)."""
    for name in HOOKS:
        users = [
            cls.__name__
            for cls in STRATEGIES.values()
            if getattr(cls, name)
            is not getattr(StrategyWrapper if issubclass(cls, StrategyWrapper) else Strategy, name)
        ]
        assert users, f"no registered strategy overrides Strategy.{name}"


def test_the_wrapper_forwarding_is_made_from_the_hook_list_and_keeps_each_signature():
    for name in HOOKS:
        forward, hook = getattr(StrategyWrapper, name), getattr(Strategy, name)
        assert inspect.signature(forward) == inspect.signature(hook)
        assert forward.__doc__ == hook.__doc__ or name == "setup"


def test_a_wrapper_checkpoints_its_base_state():
    model = nn.Linear(2, 1)
    base = Scaffold()
    wrapper = StrategyWrapper(base)
    wrapper.setup(model, 3)
    assert wrapper.num_clients == 3 and base.num_clients == 3
    state = wrapper.state_dict()
    assert set(state) == {f"base.{k}" for k in base.state_dict()} and state
    other = StrategyWrapper(Scaffold())
    other.setup(model, 3)
    other.load_state_dict({k: v + 1 for k, v in state.items()})
    assert all(torch.equal(other.base.state_dict()[k], v + 1) for k, v in base.state_dict().items())


@pytest.mark.parametrize("name", _hooks())
def test_strategy_wrapper_forwards_every_hook(name):
    assert name in vars(StrategyWrapper), f"StrategyWrapper does not override Strategy.{name}"
    base = _recording_strategy(_hooks())
    wrapper = StrategyWrapper(base)
    signature = inspect.signature(getattr(Strategy, name))
    args = tuple(SimpleNamespace(arg=p) for p in signature.parameters if p != "self")
    out = getattr(wrapper, name)(*args)
    assert [c[0] for c in base.calls] == [name]
    _, seen, result = base.calls[0]
    assert seen == args  # the base got the wrapper's arguments, in order
    if signature.return_annotation != "None":
        assert out is result  # and its result comes back


# ------------------------------------------------------------------------------ user strategies by name
USER_MODULE = """
from fl_lightning.api import Strategy, register_strategy


@register_strategy
class UserProx(Strategy):
    name = "user_prox"

    def __init__(self, mu: float = 0.01, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        self.mu = mu
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module outside the package that registers ``UserProx`` (on the path, not imported yet); the
    registry and the class are gone again after the test."""
    import gc
    import sys

    import fl_lightning.api.strategy as strategy_module

    (tmp_path / "my_user_strategies.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(strategy_module, "STRATEGIES", dict(strategy_module.STRATEGIES))
    yield "my_user_strategies"
    sys.modules.pop("my_user_strategies", None)
    gc.collect()  # Strategy.__subclasses__() forgets UserProx


def _print_config(args, capsys):
    from fl_lightning.__main__ import main

    with pytest.raises(SystemExit) as exit:
        main(["fit", *args, "--print_config"])
    out, err = capsys.readouterr()
    return exit.value.code, out, err


def test_a_user_strategy_is_named_by_its_class_name_once_its_module_is_imported(user_module, capsys):
    import importlib

    from fl_lightning.api.strategy import get_strategy, list_strategies

    # never imported: one error line naming the class-path form
    code, _, err = _print_config(["--model.strategy=UserProx"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "'UserProx' is not a known strategy" in err
    assert "--model.strategy=my_package.my_module.UserProx" in err
    with pytest.raises(ConfigError, match="named by its class path, e.g. my_package.my_module.MyProx"):
        get_strategy("UserProx")
    # imported before the command line parses (or once by its class path): its class name resolves
    importlib.import_module(user_module)
    code, out, _ = _print_config(["--model.strategy=UserProx", "--model.strategy.mu=0.5"], capsys)
    assert code == 0 and "class_path: my_user_strategies.UserProx" in out and "mu: 0.5" in out
    assert "UserProx" in list_strategies() and get_strategy("userprox", mu=0.2).mu == 0.2
    assert type(get_strategy("my_user_strategies.UserProx")).__name__ == "UserProx"  # by class path too


# ------------------------------------------------------------------------------ the vectorisation declaration
def test_vectorisation_is_one_declaration_per_class_read_along_the_wrapper_chain():
    from fl_lightning.api.strategy import Vectorizable, cannot_vectorize, vector_scratch
    from fl_lightning.strategies import FedCOG, FedDC, FedGamma, FedNova, FedPer, FedSMOO, Median

    net = nn.Linear(2, 1)

    class Inherits(Scaffold):  # adds nothing, but must say so itself
        pass

    class Declares(Scaffold):
        vectorizable = Vectorizable(scratch=("mine",))

    class Refuses(StrategyWrapper):
        vectorizable = Vectorizable(unless=lambda strategy, module: "not today")

    assert cannot_vectorize(Scaffold(), net) is None
    assert cannot_vectorize(Inherits(), net) == "Inherits does not declare vectorizable local terms"
    assert cannot_vectorize(Median(Inherits()), net) == "Inherits does not declare vectorizable local terms"
    assert cannot_vectorize(Refuses(Scaffold()), net) == "not today"
    assert "FedCOG generates" in cannot_vectorize(FedCOG(FedAvg()), net)
    assert cannot_vectorize(FedPer(), net) == "FedPer does not declare vectorizable local terms"
    # scratch keys: a class's own and its parents' (their uploads read them), and the wrapped strategies'
    grad_sum = ("scaffold/grad_sum", "scaffold/grad_steps")
    assert vector_scratch(Scaffold()) == vector_scratch(FedDC()) == vector_scratch(FedGamma()) == grad_sum
    assert vector_scratch(Declares()) == (*grad_sum, "mine")
    assert vector_scratch(Median(FedSMOO())) == ("fedsmoo/last_offsets",)
    assert vector_scratch(FedNova()) == ("fednova/steps", "fednova/momentum")


# ------------------------------------------------------------------------------ declared capabilities
def _library_strategies() -> list[type[Strategy]]:
    import importlib
    import pkgutil

    import fl_lightning

    for info in pkgutil.walk_packages(fl_lightning.__path__, "fl_lightning."):
        importlib.import_module(info.name)
    found, todo = [], [Strategy]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("fl_lightning."):
                found.append(sub)
    return found


def test_every_strategy_of_the_package_declares_its_capabilities():
    """The engine reads declarations; the package's own classes never rely on the fallback."""
    classes = _library_strategies()
    assert len(classes) > 40 and Scaffold in classes
    assert [(c.__name__, c.undeclared) for c in classes if c.undeclared] == []
    assert Scaffold.changes_gradients and Scaffold.prepares_clients and not Scaffold.steps_itself
    assert not any(getattr(FedAvg, c) for c in CAPABILITIES)


def test_an_undeclared_override_gets_the_safe_fallback_and_says_so():
    class MyProx(FedAvg):
        def local_loss(self, module, ctx, batch, outputs):
            return None

    class Declared(FedAvg):
        changes_gradients = False

        def local_loss(self, module, ctx, batch, outputs):
            return None

    class Child(MyProx):
        def local_loss(self, module, ctx, batch, outputs):
            return None

    assert MyProx.changes_gradients and MyProx.undeclared == ("changes_gradients",)
    assert not MyProx.steps_itself and not MyProx.prepares_clients
    assert not Declared.changes_gradients and Declared.undeclared == ()
    assert Child.changes_gradients and Child.undeclared == ()  # inherited, declared by its parent
    assert declaring(Median(MyProx()), "changes_gradients") == "MyProx"
    assert declaring(Median(Declared()), "changes_gradients") is None


def test_declaring_reads_the_wrapper_chain_outermost_first():
    from fl_lightning.strategies import FineTune

    assert declaring(FineTune(Scaffold()), "changes_gradients") == "Scaffold"
    assert declaring(FineTune(Scaffold()), "deploys_personal_model") == "FineTune"
    assert declaring(FedAvg(), "deploys_personal_model") is None
    assert own_local_step(FineTune(get_strategy("Ditto"))) == "Ditto"
    with pytest.raises(ValueError, match="unknown capability 'gradients'"):
        declaring(FedAvg(), "gradients")


def test_a_client_module_that_changes_a_stacked_method_is_not_stackable_unless_declared():
    from fl_lightning.api.client import ClientModule

    class Logged(ClientModule):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx)

    class Declared(ClientModule):
        stackable = True  # its forward is the same computation

        def forward(self, x):
            return super().forward(x)

    class Plain(ClientModule):
        def validation_step(self, batch, batch_idx):
            return None

    assert ClientModule.stackable and not Logged.stackable and Declared.stackable and Plain.stackable
