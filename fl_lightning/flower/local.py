"""A Flower federation on this machine (127.0.0.1): a SuperLink, SuperNodes and their ClientApp processes,
as the README's deployment commands start them, for tests, benchmarks and a first try.

    with LocalFederation(folder, nodes=[{"partition-id": 0, "num-partitions": 2}, ...]) as fed:
        fed.start()
        log = fed.run(app_folder, {"num-server-rounds": 2})

By default the federation is secure, as a real one: TLS with a test CA (:mod:`fl_lightning.flower.keys`)
and SuperNode authentication (each node's public key registered with ``flwr supernode register`` before it
starts). Every process runs in its own process group, with its output in ``<folder>/logs/``, and
:meth:`LocalFederation.close` ends the groups (the SuperExec and ClientApp processes Flower starts inside
them included).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fl_lightning.flower.keys import make_keys, node_key_names

#: How a SuperNode runs its ClientApps: ``process`` (``--isolation process`` with
#: ``python -m fl_lightning.flower clientapp`` beside it: one process kept running), ``superexec``
#: (``--isolation process`` with Flower's ``flower-superexec`` beside it: a process per message),
#: ``subprocess`` (Flower's default: the SuperNode starts its own ``flower-superexec``).
ISOLATIONS = ("process", "superexec", "subprocess")
CONNECTION = "local-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    """An executable of this Python's environment (Flower's commands), else whatever ``PATH`` has."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def _config_value(value: Any) -> str:
    """A ``--node-config``/``--run-config`` value as TOML (strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))


def config_args(values: Mapping[str, Any]) -> str:
    """``k1=v1 k2="v2"``: the form of Flower's ``--node-config`` and ``--run-config``."""
    return " ".join(f"{k}={_config_value(v)}" for k, v in values.items())


@dataclass
class _Proc:
    popen: subprocess.Popen
    log: Path
    handle: TextIO


@dataclass
class LocalFederation:
    """A SuperLink and one SuperNode per entry of ``nodes`` (its ``--node-config``) on 127.0.0.1.

    Args:
        folder: Where the keys, Flower's home (``FLWR_HOME``: its ``config.toml``, installed apps) and the
            processes' logs go.
        nodes: Each SuperNode's node config (``partition-id``, ``num-partitions``, ``data-dir``, ...).
        secure: TLS and SuperNode authentication (the README's commands); False: ``--insecure``.
        isolation: How the SuperNodes run their ClientApps (:data:`ISOLATIONS`).
        env: Extra environment of every process (e.g. ``PYTHONPATH``).
    """

    folder: Path
    nodes: Sequence[Mapping[str, Any]]
    secure: bool = True
    isolation: str = "process"
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    node_ports: list[int] = field(default_factory=list)
    _procs: dict[str, _Proc] = field(default_factory=dict, repr=False)
    groups: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation={self.isolation!r}: one of {ISOLATIONS}")
        self.folder = Path(self.folder)
        self.home = self.folder / "flwr-home"
        self.keys = self.folder / "keys"
        self.logs = self.folder / "logs"

    # ------------------------------------------------------------------------------ processes
    @property
    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env, "FLWR_HOME": str(self.home)}

    def _start(self, name: str, argv: list[str]) -> _Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        handle = open(log, "a")  # noqa: SIM115 (closed by close())
        popen = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=self.environ,
            cwd=self.folder,
            start_new_session=True,
        )
        proc = _Proc(popen, log, handle)
        self._procs[name] = proc
        self.groups.add(popen.pid)  # its own session: the process group of everything it starts
        return proc

    def leftovers(self) -> dict[int, str]:
        """Processes (not zombies) still alive in a process group this federation started: pid -> command
        (read from ``/proc``; empty where there is none)."""
        out = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                state, _, pgid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError):
                continue
            if int(pgid) in self.groups and state != "Z":
                out[int(entry.name)] = cmd.strip()
        return out

    def log(self, name: str) -> str:
        """The output of process ``name`` so far (``superlink``, ``node-<i>``, ``clientapp-<i>``)."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def alive(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.popen.poll() is None

    def stop(self, name: str, sig: int = signal.SIGTERM, wait: float = 20.0) -> None:
        """End process ``name`` and its process group (``SIGKILL`` if it outlives ``wait``)."""
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        for s in (sig, signal.SIGKILL):
            try:
                os.killpg(proc.popen.pid, s)
            except ProcessLookupError:
                break
            try:
                proc.popen.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # the group's others (a ClientApp child), leader gone
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.handle.close()

    def close(self) -> None:
        """End every process this federation started (nodes first, then the SuperLink)."""
        for name in sorted(self._procs, key=lambda n: n == "superlink"):
            self.stop(name, wait=10.0)

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the federation
    def start(self, wait: float = 120.0) -> None:
        """Keys (if secure), the SuperLink, the node registrations, the SuperNodes and their ClientApp
        processes; returns when every SuperNode is online."""
        self.port = self.port or free_port()
        self.node_ports = [free_port() for _ in self.nodes]
        self.home.mkdir(parents=True, exist_ok=True)
        if self.secure and not (self.keys / "ca.pem").exists():
            make_keys(self.keys, len(self.nodes))
        tls = (
            [
                "--ssl-ca-certfile",
                str(self.keys / "ca.pem"),
                "--ssl-certfile",
                str(self.keys / "superlink.pem"),
                "--ssl-keyfile",
                str(self.keys / "superlink.key"),
                "--enable-supernode-auth",
            ]
            if self.secure
            else ["--insecure"]
        )
        self.write_connection()
        self._start(
            "superlink",
            [
                _bin("flower-superlink"),
                *tls,
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
        )
        self._wait_port(self.port, wait)
        if self.secure:
            for i in range(len(self.nodes)):
                self.flwr(["supernode", "register", str(self.keys / node_key_names(i)[1]), CONNECTION])
        for i in range(len(self.nodes)):
            self.start_node(i)
        self.wait_online(len(self.nodes), wait)

    def write_connection(self) -> None:
        """Flower's ``config.toml`` with this federation's SuperLink as connection :data:`CONNECTION`."""
        lines = [
            "[superlink]",
            f'default = "{CONNECTION}"',
            "",
            f"[superlink.{CONNECTION}]",
            f'address = "127.0.0.1:{self.port}"',
        ]
        lines.append(f'root-certificates = "{self.keys / "ca.pem"}"' if self.secure else "insecure = true")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def node_argv(self, i: int, **changes: Any) -> list[str]:
        """The ``flower-supernode`` command of node ``i`` (``changes``: ``key=None`` drops ``--key``)."""
        args: dict[str, Any] = {
            "superlink": f"127.0.0.1:{self.port}",
            "node-config": config_args(self.nodes[i]),
            "port": str(self.node_ports[i]),
            "isolation": "subprocess" if self.isolation == "subprocess" else "process",
        }
        if self.secure:
            args["root-certificates"] = str(self.keys / "ca.pem")
            args["auth-supernode-private-key"] = str(self.keys / node_key_names(i)[0])
        else:
            args["insecure"] = True
        args.update({k.replace("_", "-"): v for k, v in changes.items()})
        argv = [_bin("flower-supernode")]
        for key, value in args.items():
            if value is None or value is False:
                continue
            argv += [f"--{key}"] if value is True else [f"--{key}", str(value)]
        return argv

    def start_node(self, i: int, **changes: Any) -> None:
        """Start SuperNode ``i`` (and its ClientApp process under ``process``/``superexec`` isolation)."""
        self._start(f"node-{i}", self.node_argv(i, **changes))
        runtime = f"127.0.0.1:{self.node_ports[i]}"
        if self.isolation == "process":
            argv = [
                sys.executable,
                "-m",
                "fl_lightning.flower",
                "clientapp",
                "--runtime-api-address",
                runtime,
            ]
            self._start(f"clientapp-{i}", [*argv, "--verbose"])
        elif self.isolation == "superexec":
            argv = [_bin("flower-superexec"), "--runtime-api-address", runtime, "--insecure"]
            self._start(f"clientapp-{i}", argv)

    def stop_node(self, i: int, sig: int = signal.SIGKILL) -> None:
        """End SuperNode ``i`` (``SIGKILL``: as a crash) and its ClientApp process."""
        self.stop(f"node-{i}", sig)
        self.stop(f"clientapp-{i}", sig)

    def flwr(self, args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess:
        """``flwr <args>`` against this federation (its ``FLWR_HOME``); raises on a non-zero exit."""
        out = subprocess.run(
            [_bin("flwr"), *args],
            env=self.environ,
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"flwr {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
            )
        return out

    def online(self) -> int:
        """How many SuperNodes the SuperLink sees online.

        Asked in this process, as ``flwr supernode list`` asks it (the Control API's ``ListNodes``, with
        the CLI's headers), without a ``flwr`` process (about 2 s of CPU each).
        """
        from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
        from flwr.proto.control_pb2 import ListNodesRequest
        from flwr.supercore.control import ControlHttpClient
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

        client = ControlHttpClient.from_server_address(
            server_address=f"127.0.0.1:{self.port}",
            insecure=not self.secure,
            root_certificates=(self.keys / "ca.pem").read_bytes() if self.secure else None,
            interceptors=[
                CliClientHttpInterceptor(),
                RuntimeVersionHttpInterceptor(component_name="flwr CLI"),
            ],
        )
        try:
            nodes = client.ListNodes(ListNodesRequest()).nodes_info
        finally:
            client.close()
        return sum(1 for n in nodes if n.status.lower() == "online")

    def wait_online(self, count: int, wait: float = 120.0, at_most: bool = False) -> None:
        """Wait until ``count`` SuperNodes (``at_most``: no more than ``count``) are online.

        A node whose process died stays online for the SuperLink until it misses its heartbeats (Flower
        1.42: 2 x 30 s), and until then the SuperLink refuses the same node key (a restarted node exits
        with Flower's exit code 305): wait for ``at_most`` before restarting a crashed node.
        """
        deadline = time.monotonic() + wait
        while (self.online() > count) if at_most else (self.online() < count):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not {count} SuperNodes online after {wait:.0f} s; see {self.logs}")
            time.sleep(1.0)

    def _wait_port(self, port: int, wait: float) -> None:
        deadline = time.monotonic() + wait
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if time.monotonic() > deadline or not self.alive("superlink"):
                raise TimeoutError(f"the SuperLink did not listen on {port}: {self.log('superlink')[-2000:]}")
            time.sleep(0.2)

    def run(
        self,
        app: Path,
        run_config: Mapping[str, Any] | None = None,
        timeout: float = 600.0,
        files: Mapping[str, str] | None = None,
    ) -> str:
        """``flwr run <app> --stream`` with ``run_config``: the run's log (raises if ``flwr`` fails).

        Flower writes into the app folder it submits (a build of it), so the app folder is copied into
        this federation's folder first, with ``files`` (name: text) added to the copy (e.g. another YAML).
        """
        copy = self.folder / "app" / Path(app).name
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(app, copy, ignore=shutil.ignore_patterns("__pycache__", "*.fab"))
        for name, text in (files or {}).items():
            (copy / name).write_text(text)
        args = ["run", str(copy), CONNECTION, "--stream"]
        if run_config:
            args += ["--run-config", config_args(run_config)]
        out = self.flwr(args, timeout=timeout)
        return out.stdout + out.stderr


__all__ = ["CONNECTION", "ISOLATIONS", "LocalFederation", "config_args", "free_port"]
