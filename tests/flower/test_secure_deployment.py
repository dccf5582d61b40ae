"""A secure deployment on 127.0.0.1, started as the README's commands start it: a SuperLink with TLS and
SuperNode authentication, SuperNodes with the test CA and their registered keys, each beside a ClientApp
process kept running (``--isolation process`` + ``python -m fl_lightning.flower clientapp``), and
``flwr run`` of the recipe's app.

Checked: the federation runs the rounds and reaches ``fit``'s global model; a SuperNode whose key is not
registered is refused; a SuperNode without the CA certificate cannot connect; a SuperNode killed in the
middle of a round is a failed client of that round, the run goes on and takes the node back once it is
restarted; nodes that bring their own data (``data-dir``) reach ``fit``'s model on the same samples, and a
node whose data folder is missing is that client's failure, in one line naming the node and its folder.
Every process the tests start is ended, and checked to be gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

import torch
from flower_helpers import RECIPE, fit_weights, max_diff

from fl_lightning.flower.federation import export_node_data
from fl_lightning.flower.keys import make_keys
from fl_lightning.flower.local import LocalFederation, free_port
from fl_lightning.runs import read_scalars

from conftest import run_folder

BIN = Path(sys.executable).parent
REPO = RECIPE.parents[2]
ENV = {
    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
}
#: The recipe with 2 clients, both in every round: one per SuperNode.
TWO_CLIENTS = ["--data.num_clients=2", "--model.participation=1.0"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("flower_processes"),  # one worker runs them in turn (tests/conftest.py)
    pytest.mark.skipif(shutil.which("flower-superlink", path=str(BIN)) is None, reason="no Flower CLI"),
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc"),
]


def two_clients_yaml() -> str:
    text = RECIPE.read_text()
    assert "num_clients: 4" in text and "participation: 0.5" in text
    return text.replace("num_clients: 4", "num_clients: 2").replace(
        "participation: 0.5", "participation: 1.0"
    )


def _closed(fed: LocalFederation) -> None:
    fed.close()
    deadline = time.monotonic() + 30
    while fed.leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not fed.leftovers(), fed.leftovers()


@pytest.fixture(scope="class")
def secure(tmp_path_factory):
    """Two secure SuperNodes (TLS, registered keys), each bringing its own data: one client of the recipe's
    split with 2 clients, written as node files (``data-dir``). Ended after the tests of
    :class:`TestOneSecureFederation` (its idle processes poll, and would share the cores with the tests
    after it)."""
    root = tmp_path_factory.mktemp("secure")
    export_node_data(RECIPE, root / "nodes", TWO_CLIENTS)
    nodes = [
        {"partition-id": i, "num-partitions": 2, "data-dir": str(root / "nodes" / f"client-{i}")}
        for i in range(2)
    ]
    fed = LocalFederation(root / "fed", nodes, env=ENV)
    try:
        fed.start()
        yield fed
    finally:
        _closed(fed)


def _lone_node(fed: LocalFederation, **changes) -> subprocess.CompletedProcess:
    """A third SuperNode (its own Runtime API port) with ``changes`` to node 0's command; its output once it
    exited (a refused node exits by itself)."""
    argv = fed.node_argv(0, port=free_port(), max_retries=1, **changes)
    proc = subprocess.Popen(
        argv,
        env=fed.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


class TestOneSecureFederation:
    """Tests that share one secure federation (:func:`secure`), in this order: the last one changes a node."""

    def test_secure_federation_of_nodes_with_their_own_data_reaches_fit(self, secure, tmp_path):
        """TLS and SuperNode authentication; each node reads its client's samples from its own folder: the
        run equals fit on the same split."""
        saved = tmp_path / "final.pt"
        config = {
            "config": "two.yaml",
            "num-server-rounds": 2,
            "save-path": str(saved),
            "root-dir": str(tmp_path),
        }
        log = secure.run(RECIPE.parent, config, files={"two.yaml": two_clients_yaml()})
        assert "rounds: 2 (this run: 2)" in log, log[-3000:]
        assert "clients [0, 1] train on their nodes' own files (data-dir)" in log, log[-3000:]
        assert "Uvicorn running on https://" in secure.log("superlink")  # TLS
        assert "--insecure" not in " ".join(secure.node_argv(0))
        fit = fit_weights(tmp_path / "fit", overrides=[*TWO_CLIENTS, "--trainer.max_steps=2"])
        assert max_diff(torch.load(saved), fit) <= 1e-6
        assert secure.online() == 2

    def test_a_supernode_whose_key_is_not_registered_is_refused_auth(self, secure, tmp_path):
        other = make_keys(tmp_path / "other", 1)  # a key pair the SuperLink never registered
        out = _lone_node(secure, auth_supernode_private_key=str(other.node_keys[0]))
        assert out.returncode != 0
        assert "Failed to activate SuperNode" in out.stdout, out.stdout[-2000:]
        assert secure.online() == 2

    def test_a_supernode_without_the_ca_certificate_cannot_connect_tls(self, secure):
        out = _lone_node(secure, root_certificates=None)  # Flower then trusts the system's CAs only
        assert out.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in out.stdout, out.stdout[-2000:]
        assert secure.online() == 2

    def test_a_node_whose_data_folder_is_missing_is_that_clients_failure_in_one_line(self, secure, tmp_path):
        """Node 1 restarted with a folder that does not exist: client 1 fails in every round with one line
        naming its node and folder, and client 0's rounds go on."""
        missing = tmp_path / "nowhere"
        secure.stop_node(1, signal.SIGTERM)  # a graceful stop: the SuperLink takes the node back at once
        secure.nodes = [secure.nodes[0], {**secure.nodes[1], "data-dir": str(missing)}]
        secure.start_node(1)
        secure.wait_online(2)
        config = {"config": "two.yaml", "num-server-rounds": 2, "root-dir": str(tmp_path)}
        log = secure.run(RECIPE.parent, config, files={"two.yaml": two_clients_yaml()})
        assert "rounds: 2 (this run: 2)" in log, log[-3000:]
        line = (
            f"client 1 (node {{}}): ConfigError: node partition-id=1: data-dir '{missing}': does not exist; "
            "give the SuperNode the folder that holds its data"
        )
        before, after = line.split("{}")
        assert any(before in ln and after in ln for ln in log.splitlines()), log[-3000:]
        failed = [v for _, v in read_scalars(run_folder(tmp_path))["round/failed_clients"]]
        assert failed == [1, 1]


def test_secure_federation_goes_on_when_a_node_dies_and_takes_it_back(tmp_path):
    """Node 1 (client 1) is killed while it holds round 2's training message: client 1 fails in that
    round (no reply within the round-timeout, 15 s) and in the rounds while it is down (the SuperLink sees
    its node offline), the other client's rounds go on, and once restarted (after the SuperLink marked it
    offline: until then it refuses the same key) node 1 trains again."""
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    fed = LocalFederation(tmp_path / "fed", nodes, env=ENV)
    try:
        fed.start()
        out: dict[str, str] = {}
        config = {
            "config": "two.yaml",
            "num-server-rounds": 8,
            "round-timeout": 15,
            "root-dir": str(tmp_path),
        }

        def run() -> None:
            try:
                out["log"] = fed.run(RECIPE.parent, config, files={"two.yaml": two_clients_yaml()})
            except Exception as err:  # reported by the assertions below
                out["error"] = str(err)

        runner = threading.Thread(target=run)
        runner.start()
        deadline = time.monotonic() + 300
        while fed.log("node-1").count("Receiving: train message") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        fed.stop_node(1, signal.SIGKILL)  # a crash in the middle of round 2
        fed.wait_online(1, wait=150, at_most=True)
        fed.start_node(1)
        runner.join(timeout=600)
        assert not runner.is_alive() and "error" not in out, out.get("error", "")[-3000:]
        assert "rounds: 8 (this run: 8)" in out["log"], out["log"][-3000:]
        assert "client 1 excluded from the aggregate: client 1 (node" in out["log"]
        failed = [v for _, v in read_scalars(run_folder(tmp_path))["round/failed_clients"]]
        assert failed[0] == 0 and failed[1] == 1 and failed[-1] == 0, failed  # back by the last round
    finally:
        _closed(fed)
