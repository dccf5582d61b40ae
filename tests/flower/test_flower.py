"""A Flower simulation (``flwr.simulation.run_simulation``, Ray) of the recipe equals fl_lightning's ``fit``.

Ray's start and its worker processes' imports take most of the time (~25-50 s per run on 2 busy cores), so
each Ray run here checks all it can: SCAFFOLD (client state kept in the nodes' contexts) in this process,
FedAvg through the ``python -m fl_lightning.flower`` command (its printout and its saved model). Both
strategies' rounds through the same ServerApp and ClientApp are also checked without Ray
(``test_executor.py``).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("flwr")
if importlib.util.find_spec("ray") is None:
    pytest.skip("Flower's simulation needs ray: pip install 'fl_lightning[flwr]'", allow_module_level=True)

import torch
from flower_helpers import RECIPE, SCAFFOLD, fit_weights, max_diff
from flwr.simulation import run_simulation

from fl_lightning.flower import client_app, server_app
from fl_lightning.runs import read_scalars

from conftest import run_folder

#: Notices the simulation command printed that were not the user's to act on (Flower's and jsonargparse's
#: deprecations, Ray's future change, Lightning's seed line from every process that builds the run).
NOTICES = [
    "run_simulation` function is deprecated",
    "skip_none parameter was deprecated",
    "Tip: In future versions of Ray",
    "Seed set to",
    "LightningCLI's args parameter",
]

#: Ray's runs take both cores: one worker runs them, one after the other (``tests/conftest.py``).
pytestmark = pytest.mark.xdist_group("flower_processes")

#: One CPU per virtual client, as many SuperNodes as fl_lightning clients (the recipe has 4).
BACKEND = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 2}}


@pytest.mark.slow
def test_flower_simulation_of_scaffold_equals_fit(tmp_path):
    overrides = SCAFFOLD
    out = {}

    def keep(module):
        out["weights"] = {k: v.detach().clone() for k, v in module.client.state_dict().items()}
        out["history"] = module.history

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _simulate(overrides, tmp_path, keep)
    finally:  # Ray installs its own (SIGTERM: sys.exit(15)); later tests expect the process's own
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert [h.failed for h in out["history"]] == [0, 0, 0]
    assert (run_folder(tmp_path) / "summary.json").is_file()
    assert max_diff(out["weights"], fit_weights(tmp_path, overrides=overrides)) <= 1e-5


def _simulate(overrides, tmp_path, keep) -> None:
    run_simulation(
        server_app(RECIPE, [*overrides, f"--trainer.default_root_dir={tmp_path}"], on_end=keep),
        client_app(RECIPE, overrides),
        num_supernodes=4,
        backend_config=BACKEND,
    )


@pytest.mark.slow
def test_the_simulation_command_of_fedavg_equals_fit_and_prints_the_run_and_no_notices(tmp_path):
    root = RECIPE.parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    saved = tmp_path / "final.pt"
    command = [sys.executable, "-m", "fl_lightning.flower", "--config", str(RECIPE), f"--save-path={saved}"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout + proc.stderr
    run = run_folder(tmp_path)
    assert "fl_lightning summary" in proc.stdout and (run / "summary.json").is_file()
    assert [n for n in NOTICES if n in printed] == []
    assert [v for _, v in read_scalars(run)["round/failed_clients"]] == [0, 0, 0]  # the recipe's 3 rounds
    assert max_diff(torch.load(saved), fit_weights(tmp_path / "fit")) <= 1e-5
