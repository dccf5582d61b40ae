"""``flwr run .`` in ``recipes/flower`` with Flower's default local connection runs the recipe's rounds.

Flower's CLI starts a managed local SuperLink (simulation runtime) on first use, submits the app and,
with ``--stream``, prints the run's log until it ends; the SuperLink keeps running in the background by
design (Flower 1.42 has no command to stop it). The test gives Flower its own home and ports, checks
the run (exit status, the rounds in the log, the saved global model equals ``fit``'s), that nothing but
that SuperLink and its SuperExec is left once the run ended, and that stopping the SuperLink leaves no
process of the run behind.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")
if importlib.util.find_spec("ray") is None:
    pytest.skip("Flower's simulation needs ray: pip install 'fl_lightning[flwr]'", allow_module_level=True)

import torch
from flower_helpers import RECIPE, fit_weights, max_diff

from conftest import run_folder

BIN = Path(sys.executable).parent
APP = RECIPE.parent
REPO = APP.parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes() -> dict[int, tuple[int, str, str]]:
    """Every process: pid -> (parent pid, state letter, command line), read from /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # exited while being read
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        out[int(entry.name)] = (int(ppid), state, cmd)
    return out


def _alive_tree(root: int) -> dict[int, str]:
    """``root`` and its descendants that are alive (zombies excluded): pid -> command line."""
    procs = _processes()
    tree, frontier = set(), {root}
    while frontier:
        tree |= frontier
        frontier = {p for p, (ppid, _, _) in procs.items() if ppid in frontier} - tree
    return {p: procs[p][2] for p in tree if p in procs and procs[p][1] != "Z"}


def _superlinks(home: Path) -> list[int]:
    """The managed local SuperLinks of this Flower home (their --log-file lies under it)."""
    return [
        p
        for p, (_, state, cmd) in _processes().items()
        if state != "Z" and "flower-superlink" in cmd and str(home) in cmd
    ]


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return condition()


@pytest.mark.slow
@pytest.mark.xdist_group("flower_processes")  # one worker runs the tests that start Flower's processes
@pytest.mark.skipif(shutil.which("flwr", path=str(BIN)) is None, reason="the flwr CLI is not installed")
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
def test_flwr_run_in_the_recipe_folder_runs_the_rounds(tmp_path):
    home, saved = tmp_path / "flwr-home", tmp_path / "final.pt"
    port = _free_port()
    env = {
        **os.environ,
        "FLWR_HOME": str(home),  # Flower's config, apps and the local SuperLink's state and log
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # flwr starts flower-superlink by name
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    # Flower's default local federation: 2 SuperNodes, each hosting 2 of the config's 4 clients
    config = f'save-path="{saved}" root-dir="{tmp_path / "runs"}"'
    cmd = [str(BIN / "flwr"), "run", ".", "--run-config", config, "--stream"]
    try:
        proc = subprocess.run(cmd, cwd=APP, env=env, capture_output=True, text=True, timeout=600)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]
        assert "rounds: 3 (this run: 3)" in log and "Exit Code" not in log, log[-3000:]  # the summary
        assert max_diff(torch.load(saved), fit_weights(tmp_path / "fit")) <= 1e-5
        assert (run_folder(tmp_path / "runs") / "summary.json").is_file()

        links = _superlinks(home)
        assert len(links) == 1, links  # Flower's managed SuperLink, kept running by design
        # once the run ended, only the SuperLink and its SuperExec remain (no simulation, no Ray)
        assert _wait(
            lambda: (
                sorted(c.split()[1].rsplit("/", 1)[-1] for c in _alive_tree(links[0]).values())
                == ["flower-superexec", "flower-superlink"]
            ),
            timeout=60,
        ), _alive_tree(links[0])
        tree = _alive_tree(links[0])
        os.kill(links[0], signal.SIGTERM)  # what Flower's docs say to do; its SuperExec follows
        assert _wait(lambda: not any(p in _alive_tree(links[0]) for p in tree), timeout=60), tree
    finally:
        for pid in _superlinks(home):  # a failed assertion above must not leave Flower running
            for child in _alive_tree(pid):
                os.kill(child, signal.SIGKILL)
