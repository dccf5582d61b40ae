"""A ClientApp process kept running beside a SuperNode: Flower's ``process`` isolation, without a process
per message.

Under ``flower-supernode --isolation process`` the SuperNode runs no ClientApp itself: something beside it
takes each message's task from the SuperNode's Runtime API (``--port``, 9094 by default) and runs the
ClientApp. Flower 1.42's own ``flower-superexec`` does it by starting one ``flwr-clientapp`` process per
task, which pulls the message, installs the app, imports it, calls it, pushes the reply and exits (in
``subprocess`` isolation the SuperNode starts that same ``flower-superexec`` itself), so every message
pays a Python start, the app's imports and whatever the app builds (fl_lightning: torch, Lightning and the
node's data).

:class:`ClientAppRunner` (``python -m fl_lightning.flower clientapp``) takes the tasks from the same API
with the same calls, and runs them one after another in its own process: the app is installed and imported
once per app (its FAB hash), and what the app keeps between calls stays (the node's federation: model,
strategy and data, :func:`~fl_lightning.flower.federation.cached_federation`). A message then costs its
transfer and the client's work. Any Flower ClientApp runs under it, fl_lightning's or not.

Each task is run as ``flwr-clientapp`` runs it (Flower 1.42's ``run_clientapp``): the task's input (message,
context, run, FAB) is pulled with the task's token, the app's reply is pushed back, then the task's
outcome and its context (the node's ``context.state``); an exception in the app is an error reply whose
reason is Flower's (``<class 'ValueError'>:<'...'>``), and the runner goes on with the next task. A
heartbeat keeps the task alive while it runs. The app's dependencies are not installed per run (as with
``--disable-runtime-dependency-installation``): they are those of the runner's environment.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from flwr.app import Error, Message
from flwr.cli.install import install_from_fab
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fl_lightning.errors import ConfigError
from fl_lightning.flower.executor import poll_wait

log = logging.getLogger("fl_lightning")

#: Flower's default address of a SuperNode's Runtime API (``flower-supernode --port``).
DEFAULT_RUNTIME_API = "127.0.0.1:9094"
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` names this machine (its traffic never leaves it)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host in LOOPBACK


def runtime_tls(address: str, root_certificates: str | None, insecure: bool) -> tuple[bool, bytes | None]:
    """``(insecure, root certificate bytes)`` for a connection to a SuperNode's Runtime API.

    Plain HTTP is what Flower itself uses between a SuperNode and the ``flower-superexec`` it starts on the
    same machine; for a Runtime API on another machine (``flower-supernode --host 0.0.0.0 --ssl-certfile
    ...``) give its CA certificate, or say ``insecure`` explicitly.

    Raises:
        ConfigError: One line: a CA file that is not there, or a remote address without TLS or ``insecure``.
    """
    if root_certificates:
        path = Path(root_certificates).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"clientapp: --root-certificates {str(path)!r} is not a file; give the PEM CA certificate "
                "that signed the SuperNode's Runtime API certificate (flower-supernode --ssl-ca-certfile)"
            )
        return False, path.read_bytes()
    if insecure or is_loopback(address):
        return True, None
    raise ConfigError(
        f"clientapp: --runtime-api-address {address} is not on this machine: give --root-certificates "
        "(the CA of the SuperNode's --ssl-certfile), or --insecure on a network you trust"
    )


def _heartbeat(client: RuntimeHttpClient) -> Callable[[], bool]:
    """A task heartbeat that never signals this process (Flower's sends SIGINT to a one-task process whose
    task is gone; here the runner goes on, and the task's reply is simply not accepted)."""
    request = SendTaskHeartbeatRequest()

    def beat() -> bool:
        try:
            client.SendTaskHeartbeat(request)
        except httpx.TransportError:
            return False  # retried with back-off
        except httpx.HTTPStatusError as err:
            return err.response.status_code not in (503, 504)
        return True

    return beat


def pull_task_input(client: RuntimeHttpClient) -> tuple[Message, Any, Any, Any]:
    """The task's message, context, run and FAB, as ``flwr-clientapp`` pulls them (Flower 1.42's
    ``pull_task_input``), waiting for the message's parts in steps of 0.05 to 0.5 s instead of 1 to 10 s.

    A task is handed out as soon as the SuperNode has its message's header, while the SuperNode is still
    fetching the message's arrays from the SuperLink: a ``flwr-clientapp`` process, seconds after, finds
    them there; a runner that is already waiting asks again in a short while.
    """
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run, fab = run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("no message received from the SuperNode's Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
        initial_backoff=0.05,
        backoff_cap=0.5,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # the deflated message lacks its own id
    return message, context, run, fab


def flower_reason(err: BaseException) -> str:
    """The error reason ``flwr-clientapp`` replies with for an exception raised by the ClientApp."""
    return str(type(err)) + ":<'" + str(err) + "'>"


@dataclass
class ClientAppRunner:
    """Runs a SuperNode's ClientApp tasks in this process, one after another (see the module's docstring).

    Args:
        runtime_api_address: The SuperNode's Runtime API (``flower-supernode --port``; ``127.0.0.1:9094``).
        root_certificates: PEM CA certificate of a Runtime API served with TLS (``flower-supernode
            --ssl-certfile``); None: plain HTTP, allowed on this machine only (see :func:`runtime_tls`).
        insecure: Plain HTTP to a Runtime API on another machine.
        poll_interval: Seconds between two asks for a task right after one ran (the next message of a
            round often follows within a second).
        max_poll_interval: The longest wait between two asks (Flower's own ``flower-superexec`` asks every
            second). While no task comes, the wait is a twentieth of the time since the last task
            (:func:`~fl_lightning.flower.executor.poll_wait`, as for the ServerApp's asks for replies),
            between the two: a message waits at most 5% longer than the runner was idle, and an idle
            runner and its SuperNode cost almost nothing (0.3 s of CPU per 30 s here; asking every
            0.05 s, 3.5 s).
    """

    runtime_api_address: str = DEFAULT_RUNTIME_API
    root_certificates: str | None = None
    insecure: bool = False
    poll_interval: float = 0.05
    max_poll_interval: float = 1.0
    tasks: int = 0
    _apps: dict[str, ClientApp] = field(default_factory=dict, repr=False)
    _tls: tuple[bool, bytes | None] = field(default=(True, None), repr=False)

    def __post_init__(self) -> None:
        self._tls = runtime_tls(self.runtime_api_address, self.root_certificates, self.insecure)

    def _client(self, *interceptors: Any) -> RuntimeHttpClient:
        insecure, certificates = self._tls
        return RuntimeHttpClient.from_server_address(
            server_address=self.runtime_api_address,
            insecure=insecure,
            root_certificates=certificates,
            interceptors=list(interceptors),
            retry_invoker=make_simple_http_retry_invoker(),
        )

    def serve(self, stop: threading.Event | None = None, max_tasks: int | None = None) -> None:
        """Take and run the SuperNode's ClientApp tasks until ``stop`` is set (or ``max_tasks`` ran).

        While the SuperNode is away (restarting), the asks are retried with back-off, so the runner serves
        it again when it is back.
        """
        stop = stop or threading.Event()
        client = self._client(RuntimeVersionHttpInterceptor(component_name="SuperExec"))
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        log.info("clientapp: serving the ClientApp tasks of the SuperNode at %s", self.runtime_api_address)
        idle_since = time.monotonic()
        try:
            while not stop.is_set() and (max_tasks is None or self.tasks < max_tasks):
                try:
                    res = client.AcquireTask(request)
                except httpx.HTTPError as err:  # the retries gave up: wait, then ask again
                    log.debug("clientapp: no SuperNode at %s (%s)", self.runtime_api_address, err)
                    stop.wait(1.0)
                    continue
                if res.HasField("task") and res.token:
                    self.run_task(res.token)
                    idle_since = time.monotonic()
                else:
                    idle = time.monotonic() - idle_since
                    stop.wait(poll_wait(idle, self.poll_interval, self.max_poll_interval))
        finally:
            client.close()

    def run_task(self, token: str) -> None:
        """Run one task (its ``token`` from ``AcquireTask``) as ``flwr-clientapp`` would, in this process."""
        start = time.perf_counter()
        client = self._client(
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), RuntimeTokenHttpInterceptor(token)
        )
        heartbeat = HeartbeatSender(_heartbeat(client))
        heartbeat.start()
        message: Message | None = None
        context = None
        reply: Message | None = None
        status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            message, context, run, fab = pull_task_input(client)
            app = self._app(run, fab)
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as err:
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = flower_reason(err)
            if isinstance(err, LoadClientAppError):
                code, reason = ErrorCode.LOAD_CLIENT_APP_EXCEPTION, f"cannot load the ClientApp: {err}"
            log.error("clientapp: the ClientApp raised %s: %s", type(err).__name__, err)
            details = reason
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
                push_task_output(client=client, context=context, sub_status=status, details=details)
            except Exception as err:  # the SuperNode went away: its next task is a new one
                log.error("clientapp: could not push the reply to the SuperNode: %s", err)
            heartbeat.stop()
            client.close()
            self.tasks += 1
        kind = message.metadata.message_type if message is not None else "?"
        log.info("clientapp: %s task done in %.2f s (%s)", kind, time.perf_counter() - start, status)

    def _app(self, run: Any, fab: Any) -> ClientApp:
        """The run's ClientApp: installed from its FAB and imported on the first task of that FAB only."""
        app = self._apps.get(fab.hash_str)
        if app is None:
            _forget_apps(Path(install_from_fab(fab.content, skip_prompt=True)).parent)
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            app = load(run.fab_id, run.fab_version, fab.hash_str)
            self._apps[fab.hash_str] = app
        return app


def _forget_apps(apps: Path) -> None:
    """Drop the modules imported from installed apps (``<FLWR_HOME>/apps/*``) and their ``sys.path`` entries,
    so the next app's modules are imported from its own folder, not found under an earlier app's name."""
    root = str(apps.resolve())
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or ""
        if where and str(Path(where).resolve()).startswith(root + os.sep):
            del sys.modules[name]
    sys.path[:] = [p for p in sys.path if not str(Path(p).resolve()).startswith(root + os.sep)]


__all__ = ["DEFAULT_RUNTIME_API", "ClientAppRunner", "flower_reason", "is_loopback", "runtime_tls"]
