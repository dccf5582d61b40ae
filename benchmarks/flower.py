"""Flower's simulation of a config against fl_lightning's own run and a bare Flower app doing the same work.

    python benchmarks/flower.py                          # recipes/flower's MLP, 10 clients, 6 rounds
    python benchmarks/flower.py --rounds 10 --local-steps 20 --per-round
    python benchmarks/flower.py --only b,c --pairs 3     # a subset of the three runs, 3 pairs of (b), (c)

One config (``recipes/flower/fedavg_digits_mlp.yaml`` with ``--data.num_clients``,
``--trainer.max_steps`` and ``--model.local_steps`` from the arguments) is timed three ways, each in a
fresh process:

(a) ``python -m fl_lightning fit`` (one process, no Flower);
(b) ``python -m fl_lightning.flower``: Flower's simulation (Ray), one virtual SuperNode per client,
    1 CPU each, fl_lightning's ServerApp and ClientApp;
(c) a bare Flower app (``bare_server_app``/``bare_client_app`` below): Flower's own ``FedAvg`` and a
    ClientApp in plain PyTorch that trains the same MLP from the same initial weights with the same
    local steps, batch size and learning rate on the same digits partition (the clients' indices of
    the config's split), samples the same fraction of clients, and, as (b) does each round, evaluates
    the global model on the server and every client's model on its local test split; run by the same
    simulation (same number of SuperNodes, same client resources).

A round is timed from its start to the next round's start (the last one to the end of the run's rounds):
training, aggregation, global and client evaluation; (a) and (b) by a Lightning callback of the Trainer
(the ServerApp of (b) fits the config with one), (c) by Flower's "[ROUND k/R]" log lines. Round 1 of (b)
and (c) also waits for the Ray actors to start (a Python process each, importing the app); "startup" is
process start to round 1. The last round of (a) and (b) also holds the end of fit (final checkpoint,
summary, hyperparameters), and in Flower's simulation a round's messages wait on 0.1 s polling loops
(the grid's replies, the simulation's message queue), so small rounds come in steps of about 0.1 s:
"steady" is the median of rounds 2..R (the mean is printed beside it). Printed: steady seconds per
round, round 1, startup, total wall time, and the ratios (b)/(c) (our part of a Flower round; target <=
1.2x) and (b)/(a). Timings are wall-clock on whatever else the machine runs: compare ratios, not seconds.

Because of that quantisation (and of whatever else runs), one run of (b) against one of (c) decides
little: (b) and (c) run ``--pairs`` times (default 5), alternating (b c, c b, b c, ...), each pair's
ratios are printed, and the MEDIAN of the pairs' ratios (steady round, start-up, total) is the result;
(a) runs once.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECIPE = ROOT / "recipes" / "flower" / "fedavg_digits_mlp.yaml"
_T0 = time.perf_counter()
_ROUND = "[ROUND "


def overrides(args: argparse.Namespace) -> list[str]:
    """The command-line overrides of the recipe that all three runs use."""
    return [
        f"--data.num_clients={args.clients}",
        f"--trainer.max_steps={args.rounds}",
        f"--model.local_steps={args.local_steps}",
    ]


# ---------------------------------------------------------------------------------------- (a) fit
def _fit_callback() -> Any:
    from lightning.pytorch import Callback

    class RoundTimer(Callback):
        """Seconds since process start at the start of each round (one training step) and at the end."""

        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
            self.marks.append(time.perf_counter() - _T0)

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            self.marks.append(time.perf_counter() - _T0)

    return RoundTimer()


def run_fit(args: argparse.Namespace) -> list[float]:
    """``python -m fl_lightning fit --config <recipe> <overrides>`` in this process, with a round timer."""
    from fl_lightning.cli import FederatedCLI

    timer = _fit_callback()

    class TimedCLI(FederatedCLI):
        def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
            return super()._instantiate_trainer(config, [*callbacks, timer])

    sys.argv = sys.argv[:1]  # the CLI reads its arguments from ``args`` only
    with tempfile.TemporaryDirectory() as tmp:
        TimedCLI(
            args=[
                "fit",
                "--config",
                str(RECIPE),
                *overrides(args),
                f"--trainer.default_root_dir={tmp}",
                "--trainer.enable_progress_bar=false",
                "--trainer.accelerator=cpu",
            ]
        )
    return timer.marks


# ------------------------------------------------------------------------- (b) and (c) in Flower
class _RoundMarks(logging.Handler):
    """Seconds since process start at Flower's "[ROUND k/R]" log lines and at the strategy's end."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if _ROUND in msg or "Strategy execution finished" in msg:
            self.marks.append(time.perf_counter() - _T0)


class _WallMarks(_RoundMarks):
    """Wall-clock times (``time.time()``) of Flower's "[ROUND k/R]" lines and of the strategy's end, written
    to ``path`` (JSON) by :meth:`save`: the bare ServerApp's rounds in a deployment (another process)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if _ROUND in msg or "Strategy execution finished" in msg:
            self.marks.append(time.time())

    def save(self) -> None:
        if self.path:
            Path(self.path).write_text(json.dumps(self.marks))


def _deployment_timer() -> Any:
    from lightning.pytorch import Callback

    class DeploymentRoundTimer(Callback):
        """Wall-clock times (``time.time()``) of each round's start and of the end of the rounds, appended
        to ``path`` (one JSON number a line): our ServerApp's rounds in a deployment (set in its YAML)."""

        def __init__(self, path: str) -> None:
            self.path = path

        def _mark(self) -> None:
            with open(self.path, "a") as f:
                f.write(f"{time.time()}\n")

        def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
            self._mark()

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            self._mark()

    return DeploymentRoundTimer


def __getattr__(name: str) -> Any:
    """``flower.DeploymentRoundTimer``, the class a deployed config's ``trainer.callbacks`` names (defined on
    first use, so importing this file does not import Lightning)."""
    if name == "DeploymentRoundTimer":
        globals()[name] = _deployment_timer()
        return globals()[name]
    raise AttributeError(name)


def run_ours(args: argparse.Namespace) -> list[float]:
    """``python -m fl_lightning.flower --config <recipe> <overrides>`` in this process; the ServerApp fits
    the config with a Lightning Trainer, timed by the same round callback as (a)."""
    import importlib

    from fl_lightning.flower.__main__ import main

    server_app = importlib.import_module("fl_lightning.flower.server_app")  # the module, not the function

    timer = _fit_callback()
    load_run = server_app.load_run

    def timed_run(*a: Any, **kw: Any) -> Any:
        cli = load_run(*a, **kw)
        cli.trainer.callbacks.append(timer)
        return cli

    server_app.load_run = timed_run
    with tempfile.TemporaryDirectory() as tmp:
        main(["--config", str(RECIPE), *overrides(args), f"--trainer.default_root_dir={tmp}"])
    return timer.marks


def export_federation(args: argparse.Namespace, path: Path) -> None:
    """The config's partition, initial MLP weights and local settings, for the bare app."""
    import torch

    from fl_lightning.flower.federation import load_federation

    fed = load_federation(RECIPE, overrides(args))
    client, local = fed.module.client, fed.module.engine.config.local
    val = list(fed.data.val_dataloader())
    x0 = fed.data.clients[0].x
    torch.save(
        {
            "x": x0.reshape(len(x0), -1),
            "y": fed.data.clients[0].y,
            "train_idx": [c.train_idx for c in fed.data.clients],
            "test_idx": [c.test_idx for c in fed.data.clients],
            "val_x": torch.cat([b[0] for b in val]).reshape(-1, x0[0].numel()),
            "val_y": torch.cat([b[1] for b in val]),
            "weights": {k.removeprefix("net."): v for k, v in client.net.state_dict().items()},
            "lr": client.lr,
            "momentum": client.momentum,
            "batch_size": fed.data.batch_size,
            "eval_batch_size": fed.data.eval_batch_size,
            "local_steps": local.local_steps,
            "fraction": len(fed.module.engine.sample(0)) / fed.num_clients,
            "num_clients": fed.num_clients,
        },
        path,
    )


_DATA: dict[str, Any] = {}


def _bare_data(path: str) -> dict[str, Any]:
    """The exported federation, loaded once per process (as a Flower app would cache its data)."""
    if path not in _DATA:
        import torch

        _DATA[path] = torch.load(path)
    return _DATA[path]


def _bare_net(data: dict[str, Any]) -> Any:
    """The recipe's MLP (Flatten, Linear, ReLU, ..., Linear) in plain PyTorch, with the initial weights."""
    from torch import nn

    linears = [k for k in data["weights"] if k.endswith(".weight")]
    layers: list[nn.Module] = [nn.Flatten()]
    for i, name in enumerate(linears):
        out_f, in_f = data["weights"][name].shape
        layers.append(nn.Linear(in_f, out_f))
        if i < len(linears) - 1:
            layers.append(nn.ReLU(inplace=True))
    net = nn.Sequential(*layers)
    net.load_state_dict(data["weights"])
    return net


def _bare_eval(net: Any, x: Any, y: Any, batch_size: int) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    net.eval()
    loss = correct = 0.0
    with torch.no_grad():
        for s in range(0, len(y), batch_size):
            out = net(x[s : s + batch_size])
            loss += float(F.cross_entropy(out, y[s : s + batch_size], reduction="sum"))
            correct += float((out.argmax(1) == y[s : s + batch_size]).sum())
    net.train()
    return loss / max(1, len(y)), correct / max(1, len(y))


def bare_client_app(path: str | None = None) -> Any:
    """A ClientApp in plain PyTorch: ``local_steps`` SGD steps on the node's partition, test-split eval
    (``path``: the exported federation; None: the run config's ``bare-data``, as deployed)."""
    import torch
    import torch.nn.functional as F
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        data = _bare_data(path or str(context.run_config["bare-data"]))
        cid = int(context.node_config["partition-id"])
        net = _bare_net(data)
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(net.parameters(), lr=data["lr"], momentum=data["momentum"])
        idx_all, bs = data["train_idx"][cid], data["batch_size"]
        gen = torch.Generator().manual_seed(int(msg.content["config"]["server-round"]) * 1000 + cid)
        steps, seen, loss_sum, correct = 0, 0, 0.0, 0.0
        while steps < data["local_steps"]:
            order = idx_all[torch.randperm(len(idx_all), generator=gen)]
            for s in range(0, len(order), bs):
                idx = order[s : s + bs]
                opt.zero_grad(set_to_none=True)
                out = net(data["x"][idx])
                loss = F.cross_entropy(out, data["y"][idx])
                loss.backward()
                opt.step()
                loss_sum += float(loss) * len(idx)
                correct += float((out.argmax(1) == data["y"][idx]).sum())
                seen += len(idx)
                steps += 1
                if steps == data["local_steps"]:
                    break
        metrics = {"train_loss": loss_sum / seen, "train_acc": correct / seen, "num-examples": len(idx_all)}
        content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord(metrics)})
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        data = _bare_data(path or str(context.run_config["bare-data"]))
        cid = int(context.node_config["partition-id"])
        net = _bare_net(data)
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        idx = data["test_idx"][cid] if len(data["test_idx"][cid]) else data["train_idx"][cid]
        loss, acc = _bare_eval(net, data["x"][idx], data["y"][idx], data["eval_batch_size"])
        metrics = MetricRecord({"loss": loss, "acc": acc, "num-examples": len(idx)})
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def bare_server_app(path: str | None = None, rounds: int | None = None) -> Any:
    """A ServerApp with Flower's FedAvg: the recipe's sampled fraction, every client evaluated each round,
    the global model evaluated on the config's global validation/test split after each round. None: the
    run config's ``bare-data`` and ``num-server-rounds``, and the rounds' times go to its ``marks`` file
    (as deployed)."""
    from flwr.app import ArrayRecord, Context, MetricRecord
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        data = _bare_data(path or str(context.run_config["bare-data"]))
        net = _bare_net(data)
        n = data["num_clients"]
        marks = _WallMarks(str(context.run_config.get("marks", "")))
        logging.getLogger("flwr").addHandler(marks)

        def global_eval(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            net.load_state_dict(arrays.to_torch_state_dict())
            loss, acc = _bare_eval(net, data["val_x"], data["val_y"], data["eval_batch_size"])
            return MetricRecord({"global/loss": loss, "global/acc": acc})

        strategy = FedAvg(
            fraction_train=data["fraction"],
            fraction_evaluate=1.0,
            min_train_nodes=1,
            min_evaluate_nodes=n,
            min_available_nodes=n,
        )
        num_rounds = rounds or int(context.run_config["num-server-rounds"])
        strategy.start(grid, ArrayRecord(net.state_dict()), num_rounds=num_rounds, evaluate_fn=global_eval)
        marks.save()

    return app


def run_bare(args: argparse.Namespace) -> list[float]:
    """The bare app in Flower's simulation, with the resources ``python -m fl_lightning.flower`` gives."""
    # the apps from this file imported as a module (benchmarks/ is on the actors' PYTHONPATH): Ray
    # pickles functions of ``__main__`` by value, with a copy of their globals, so the data cache
    # would be empty in every message
    from flower import bare_client_app as client
    from flower import bare_server_app as server
    from flwr.simulation import run_simulation

    marks = _RoundMarks()
    logging.getLogger("flwr").addHandler(marks)
    run_simulation(
        server(args._data, args.rounds),
        client(args._data),
        num_supernodes=args.clients,
        backend_config={"client_resources": {"num_cpus": 1.0, "num_gpus": 0.0}},
    )
    return marks.marks


# ---------------------------------------------------------------------------------- deployment
BARE_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "bare-flower-app"
version = "0.1.0"
description = "The benchmark's bare Flower app: the recipe's MLP and data in plain PyTorch"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fl-lightning-benchmarks"

[tool.flwr.app.components]
serverapp = "bare_app:serverapp"
clientapp = "bare_app:clientapp"

[tool.flwr.app.config]
num-server-rounds = 3
bare-data = ""
marks = ""
"""
BARE_APP = """# The benchmark's bare Flower app (benchmarks/flower.py on the processes' PYTHONPATH).
from flower import bare_client_app, bare_server_app

serverapp = bare_server_app()
clientapp = bare_client_app()
"""
#: How a SuperNode runs its ClientApps in the deployment benchmark (fl_lightning.flower.local.ISOLATIONS).
MODES = {
    "process": "process isolation + python -m fl_lightning.flower clientapp (kept running; recommended)",
    "subprocess": "subprocess isolation (Flower's default: a flwr-clientapp process per message)",
    "superexec": "process isolation + Flower's flower-superexec (a flwr-clientapp process per message)",
}


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def our_deployed_yaml(args: argparse.Namespace, marks: Path) -> str:
    """The recipe with the benchmark's sizes, and a callback writing the rounds' wall-clock times."""
    import yaml

    config = yaml.safe_load(RECIPE.read_text())
    config["trainer"]["max_steps"] = args.rounds
    config["trainer"]["callbacks"] = [
        {"class_path": "flower.DeploymentRoundTimer", "init_args": {"path": str(marks)}}
    ]
    config["data"]["num_clients"] = args.clients
    config["model"]["local_steps"] = args.local_steps
    return yaml.safe_dump(config, sort_keys=False)


def run_deployed(app: str, mode: str, args: argparse.Namespace, data: Path, folder: Path) -> dict[str, Any]:
    """One deployed run on 127.0.0.1 (a SuperLink and ``args.clients`` SuperNodes with TLS and node
    authentication, started and idle before the run is submitted): its rounds from the ServerApp's marks.

    ``startup`` is from ``flwr run`` to the end of round 1 (the ServerApp's start, imports and set-up, the
    nodes' first messages with their ClientApps' start, one round); ``steady`` the median of rounds 2..R.
    """
    from fl_lightning.flower.local import LocalFederation

    nodes = [{"partition-id": i, "num-partitions": args.clients} for i in range(args.clients)]
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    marks = folder / "marks.json"
    with LocalFederation(folder / "fed", nodes, isolation=mode, env=env) as fed:
        fed.start()
        if app == "ours":
            files = {"bench.yaml": our_deployed_yaml(args, marks)}
            config = {
                "config": "bench.yaml",
                "num-server-rounds": args.rounds,
                "root-dir": str(folder / "runs"),
            }
            start = time.time()
            log = fed.run(RECIPE.parent, config, timeout=args.timeout, files=files)
            times = [float(t) for t in marks.read_text().split()] if marks.exists() else []
        else:
            bare = folder / "bare-app"
            bare.mkdir(exist_ok=True)
            (bare / "pyproject.toml").write_text(BARE_PYPROJECT)
            (bare / "bare_app.py").write_text(BARE_APP)
            config = {"bare-data": str(data), "num-server-rounds": args.rounds, "marks": str(marks)}
            start = time.time()
            log = fed.run(bare, config, timeout=args.timeout)
            times = json.loads(marks.read_text()) if marks.exists() else []
    if len(times) != args.rounds + 1:
        raise RuntimeError(
            f"{app} ({mode}): {len(times)} round marks for {args.rounds} rounds:\n{log[-3000:]}"
        )
    rounds = [b - a for a, b in itertools.pairwise(times)]
    return {
        "startup": times[1] - start,
        "steady": statistics.median(rounds[1:]),
        "rounds": rounds,
        "total": times[-1] - start,
    }


def _timed_python(code: str) -> float:
    """Seconds of ``python -c code`` in a fresh process (its start included)."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])},
    )
    return time.perf_counter() - start


def message_start(args: argparse.Namespace, data: Path, repeats: int) -> dict[str, float]:
    """What a ClientApp process started for one message pays before the client's work, fastest of
    ``repeats`` (alternating ours and bare): its imports, and building the node's data."""
    ours_import = "import fl_lightning.flower.client_app"
    bare_import = "import torch, flwr.app, flwr.clientapp"
    # what our client's own imports need from libraries: its module is a LightningModule, its metrics
    # torchmetrics (whose import loads torchvision's models and scipy), its config jsonargparse's
    libs_import = bare_import + ", lightning.pytorch, lightning.pytorch.cli, torchmetrics, jsonargparse"
    ours_data = (
        "import time, fl_lightning.flower.federation as f; t = time.perf_counter(); "
        f"f.load_federation({str(RECIPE)!r}, {overrides(args)!r}); print(time.perf_counter() - t)"
    )
    load = f"torch.load({str(data)!r})"
    bare_data = f"import time, torch; t = time.perf_counter(); {load}; print(time.perf_counter() - t)"
    out: dict[str, list[float]] = {
        "ours_import": [],
        "bare_import": [],
        "libs_import": [],
        "ours_data": [],
        "bare_data": [],
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]), "OMP_NUM_THREADS": "1"}
    for _ in range(repeats):
        out["ours_import"].append(_timed_python(ours_import))
        out["bare_import"].append(_timed_python(bare_import))
        out["libs_import"].append(_timed_python(libs_import))
        for key, code in (("ours_data", ours_data), ("bare_data", bare_data)):
            res = subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env
            )
            out[key].append(float(res.stdout.strip().splitlines()[-1]))
    return {k: min(v) for k, v in out.items()}


def deployment(args: argparse.Namespace) -> None:
    """The deployment benchmark: ours and the bare app, alternately, in each mode; fastest of repeats.

    ``SIGTERM`` (e.g. ``timeout``) ends it as an exception would: each federation's processes are ended."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    print(
        f"deployment on 127.0.0.1: {args.clients} SuperNodes (TLS + node authentication), "
        f"{args.clients} clients, {args.rounds} rounds, {args.local_steps} local steps, "
        f"{args.repeats} repeat(s) (fastest kept); "
        f"load average {_loadavg()}",
        flush=True,
    )
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    best: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "federation.pt"
        export_federation(args, data)
        for r in range(args.repeats):
            for mode in modes:
                for app in ("ours", "bare"):
                    folder = Path(tmp) / f"{mode}-{app}-{r}"
                    folder.mkdir()
                    res = run_deployed(app, mode, args, data, folder)
                    key = (mode, app)
                    for k in ("steady", "startup"):
                        best.setdefault(key, {})[k] = min(best.get(key, {}).get(k, float("inf")), res[k])
                    if args.per_round:
                        rounds = " ".join(f"{t:.2f}" for t in res["rounds"])
                        print(
                            f"    [{mode}, {app}, repeat {r + 1}] rounds: {rounds} (load {_loadavg()})",
                            flush=True,
                        )
        start = message_start(args, data, max(2, args.repeats)) if "subprocess" in modes else None
    targets = {"process": (1.3, 1.5)}
    for mode in modes:
        ours, bare = best[(mode, "ours")], best[(mode, "bare")]
        steady_t, start_t = targets.get(mode, (None, None))
        print(f"  {MODES[mode]}:")
        ratio = ours["steady"] / bare["steady"]
        note = f" (target <= {steady_t}x)" if steady_t else ""
        print(
            f"    steady round: ours {ours['steady']:.2f} s, bare {bare['steady']:.2f} s: {ratio:.2f}x{note}"
        )
        ratio = ours["startup"] / bare["startup"]
        note = f" (target <= {start_t}x)" if start_t else ""
        print(
            f"    start-up (flwr run to the end of round 1): ours {ours['startup']:.2f} s, "
            f"bare {bare['startup']:.2f} s: {ratio:.2f}x{note}"
        )
        if mode == "subprocess" and start is not None:
            print(
                "    per-message start (a fresh process each): imports "
                f"ours {start['ours_import']:.2f} s (import fl_lightning.flower.client_app), "
                f"bare {start['bare_import']:.2f} s (import torch, flwr); the libraries ours builds on "
                f"{start['libs_import']:.2f} s (torch, flwr, Lightning, torchmetrics, jsonargparse); "
                f"data ours {start['ours_data']:.2f} s (the config's run and the node's split), "
                f"bare {start['bare_data']:.2f} s (torch.load)"
            )
    print(f"load average at the end: {_loadavg()}")


# -------------------------------------------------------------------------------------- driver
RUNS = {
    "a": ("fit (one process)", run_fit),
    "b": ("python -m fl_lightning.flower", run_ours),
    "c": ("bare Flower app (FedAvg)", run_bare),
}


def measure(key: str, args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Run ``key`` in a fresh process; its round marks as seconds per round, startup and total."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "marks.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_run", key, "--_out", str(out)]
        cmd += [f"--clients={args.clients}", f"--rounds={args.rounds}", f"--local-steps={args.local_steps}"]
        cmd += ["--_data", str(data)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"run {key} took over --timeout={args.timeout:g} s") from None
        total = time.perf_counter() - start
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"run {key} failed:\n{proc.stderr[-3000:]}")
        marks = json.loads(out.read_text())
    if len(marks) != args.rounds + 1:
        raise RuntimeError(f"run {key}: {len(marks)} round marks for {args.rounds} rounds")
    rounds = [b - a for a, b in itertools.pairwise(marks)]
    return {
        "startup": marks[0],
        "to_round1_end": marks[1],
        "first": rounds[0],
        "steady": statistics.median(rounds[1:]),
        "mean": statistics.mean(rounds[1:]),
        "total": total,
        "rounds": rounds,
    }


def _print_row(key: str, r: dict[str, Any], per_round: bool) -> None:
    print(
        f"  ({key}) {RUNS[key][0]:30s} steady {r['steady']:7.3f} s/round (mean {r['mean']:.3f})   "
        f"round 1 {r['first']:7.2f} s   "
        f"startup {r['startup']:6.2f} s (to the end of round 1 {r['to_round1_end']:6.2f} s)   "
        f"total {r['total']:6.2f} s",
        flush=True,
    )
    if per_round:
        print("      rounds: " + " ".join(f"{t:.3f}" for t in r["rounds"]), flush=True)


def _median_ratio(pairs: list[dict[str, dict[str, Any]]], key: str) -> float:
    return statistics.median(p["b"][key] / p["c"][key] for p in pairs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--only", default="a,b,c", help="comma-separated subset of a (fit), b (ours), c (bare)")
    p.add_argument(
        "--pairs",
        type=int,
        default=5,
        help="runs of (b) and (c), alternating (b c, c b, b c, ...); the ratios' medians are reported",
    )
    p.add_argument("--per-round", action="store_true", help="also print every round's seconds")
    p.add_argument(
        "--deployment",
        action="store_true",
        help="a SuperLink and SuperNodes on 127.0.0.1 (TLS, node auth), ours vs the bare app, per --modes",
    )
    p.add_argument("--modes", default="process,subprocess", help=f"deployment modes: {', '.join(MODES)}")
    p.add_argument("--repeats", type=int, default=1, help="deployment runs per app and mode (fastest kept)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take")
    p.add_argument("--_run", choices=list(RUNS), help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    p.add_argument("--_data", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._run:
        marks = RUNS[args._run][1](args)
        Path(args._out).write_text(json.dumps(marks))
        return
    if args.rounds < 2:
        p.error("--rounds must be >= 2 (round 1 includes the actors' start-up)")
    if args.pairs < 1:
        p.error("--pairs must be >= 1")
    if args.deployment:
        deployment(args)
        return
    only = [k for k in args.only.split(",") if k]
    flower = [k for k in ("b", "c") if k in only]
    print(
        f"{RECIPE.name}: {args.clients} clients, {args.rounds} rounds, {args.local_steps} local steps, "
        f"{args.pairs} pair(s) of (b) and (c) alternating (seconds; steady = median of rounds "
        f"2..{args.rounds}); load average {_loadavg()}"
    )
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)  # "Seed set to 0"
    pairs: list[dict[str, dict[str, Any]]] = []
    fit = None
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "federation.pt"
        export_federation(args, data)  # the bare app's partition and initial weights, not timed
        if "a" in only:
            fit = measure("a", args, data)
            _print_row("a", fit, args.per_round)
        for i in range(args.pairs if flower else 0):
            pair: dict[str, dict[str, Any]] = {}
            try:
                for key in flower if i % 2 == 0 else flower[::-1]:  # b c, c b, ...: drift hits both alike
                    pair[key] = measure(key, args, data)
                    _print_row(key, pair[key], args.per_round)
            except RuntimeError as err:  # e.g. Ray's raylet died on a busy machine: that pair is left out
                print(f"  pair {i + 1} left out: {str(err).splitlines()[0]}", flush=True)
                continue
            pairs.append(pair)
            if len(pair) == 2:
                b, c = pair["b"], pair["c"]
                print(
                    f"  pair {i + 1}: (b)/(c) steady round {b['steady'] / c['steady']:.2f}x, start-up "
                    f"(to the end of round 1) {b['to_round1_end'] / c['to_round1_end']:.2f}x, total "
                    f"{b['total'] / c['total']:.2f}x; load average {_loadavg()}",
                    flush=True,
                )
    if len(flower) == 2 and pairs:
        steady = [pr["b"]["steady"] / pr["c"]["steady"] for pr in pairs]
        print(
            f"(b)/(c), steady round: median {_median_ratio(pairs, 'steady'):.2f}x of "
            f"{' '.join(f'{r:.2f}' for r in steady)}  (target <= 1.2x)"
        )
        print(f"(b)/(c), round 1:      median {_median_ratio(pairs, 'first'):.2f}x")
        print(f"(b)/(c), startup:      median {_median_ratio(pairs, 'startup'):.2f}x (to round 1's start)")
        print(
            f"(b)/(c), start-up:     median {_median_ratio(pairs, 'to_round1_end'):.2f}x (to the end of "
            "round 1: the actors' start included)"
        )
        print(f"(b)/(c), total:        median {_median_ratio(pairs, 'total'):.2f}x")
    if fit is not None and "b" in flower and pairs:
        ours = statistics.median(pr["b"]["steady"] for pr in pairs)
        print(f"(b)/(a), steady round: {ours / fit['steady']:.2f}x (the median of (b)'s steady rounds)")
        total = statistics.median(pr["b"]["total"] for pr in pairs)
        print(f"(b)/(a), total:        {total / fit['total']:.2f}x")
    print(f"load average at the end: {_loadavg()}")


if __name__ == "__main__":
    main()
