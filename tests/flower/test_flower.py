"""A Flower simulation (``flwr.simulation.run_simulation``, Ray) of the recipe equals fl_lightning's ``fit``.

Ray's start and its worker processes' imports take most of the time (~25-50 s per run on 2 busy cores), so
the one Ray run here checks all it can: the ``python -m fl_lightning.flower`` command (its printout and its
saved model) of the recipe with SCAFFOLD, whose client state lives in the SuperNodes' contexts between
rounds (lost state would not reach ``fit``'s model). FedAvg's and SCAFFOLD's rounds through the same
ServerApp and ClientApp are also checked without Ray (``test_executor.py``); FedAvg through Ray by ``flwr
run`` (``test_flwr_run.py``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytest.importorskip("flwr")
if importlib.util.find_spec("ray") is None:
    pytest.skip("Flower's simulation needs ray: pip install 'fl_lightning[flwr]'", allow_module_level=True)

import torch
from flower_helpers import RECIPE, SCAFFOLD, fit_weights, max_diff

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


@pytest.mark.slow
def test_the_simulation_command_of_scaffold_equals_fit_and_prints_the_run_and_no_notices(tmp_path):
    root = RECIPE.parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    saved = tmp_path / "final.pt"
    command = [
        sys.executable,
        "-m",
        "fl_lightning.flower",
        "--config",
        str(RECIPE),
        f"--save-path={saved}",
        *SCAFFOLD,
    ]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout + proc.stderr
    run = run_folder(tmp_path)
    assert "fl_lightning summary" in proc.stdout and (run / "summary.json").is_file()
    assert [n for n in NOTICES if n in printed] == []
    assert [v for _, v in read_scalars(run)["round/failed_clients"]] == [0, 0, 0]  # the recipe's 3 rounds
    assert max_diff(torch.load(saved), fit_weights(tmp_path / "fit", overrides=SCAFFOLD)) <= 1e-5
