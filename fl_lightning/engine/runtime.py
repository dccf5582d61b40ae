"""How a run executes (``model.runtime``): knobs that change its speed and memory, never what it trains.

A :class:`Runtime` is one object apart from the federated algorithm's arguments (strategy, participation,
local work, ...), given to ``FederatedModule(runtime=...)``::

    --model.runtime.vectorize=auto --model.runtime.threads_per_process=1
    model: {runtime: {vectorize: auto, threads_per_process: 1}}

Vectorised or compiled clients give the results of one eager client at a time within float tolerance; the
state store's budget and folder and the CPU threads give the same results exactly.

Before the runtime was its own object its fields were arguments of the module itself
(``--model.vectorize=auto``, ``model: {vectorize: auto}`` in a config file, a run's ``config.yaml`` or a
checkpoint's saved arguments); :func:`upgrade_model` and :func:`upgrade_flat` read those spellings as this
one (the command line's and config files' through :mod:`fl_lightning.config.legacy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fl_lightning.engine.calibrate import CPU_MODES
from fl_lightning.errors import ConfigError, as_fields_object, check_number
from fl_lightning.hparams import move_flat_fields

#: The ``torch.compile`` modes ``compile`` takes besides true/false.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class Runtime:
    """How the clients' work executes: memory, threads, compilation, vectorisation (not what it computes).

    Args:
        state_memory_mb: Memory budget of the per-client state store in MiB; states of the least
            recently trained clients beyond it are kept on disk (None: all in memory).
        state_dir: Folder for spilled client states (default: a temporary folder).
        threads_per_process: Intra-op threads of each CPU process. None sets 1 when several CPU
            processes share the machine (``--trainer.devices N`` on CPU) or when the model is small
            (fewer than 1M parameters: with two threads the zero-config run's rounds took 9x longer
            than with one while other work kept the cores busy, and were 13% shorter on an idle
            machine), and leaves torch's default otherwise. See benchmarks/scaling.py.
        compile: Compile the clients' network with ``torch.compile`` (once per run; the strategy
            hooks and the optimizer stay eager). ``true``: mode ``reduce-overhead`` on a GPU (CUDA
            graphs, for the launch-bound small-batch steps of federated clients) and ``default`` on
            CPU; or a mode name. Results equal eager training within float tolerance. With
            ``vectorize`` > 1 the vectorised group's forward (vmap over the stacked parameters) is
            compiled instead.
        vectorize: Train up to this many of a round's clients together as one batched computation
            (``torch.func.vmap`` over stacked parameters, or a batched linear chain; each process its own
            share under DDP): the same results as one at a time within float tolerance, faster where a
            client's small-batch step is launch-bound (GPUs) or overhead-bound (small clients on a CPU).
            1 (default): one client at a time. ``auto``: all of the round's clients, as many as the memory
            budget allows. Strategies or models that cannot be vectorised (see README, "Vectorised
            clients") train one at a time with a one-line notice.
        vectorize_memory_gb: Device memory budget in GiB of a vectorised group; the group size is
            ``vectorize`` or fewer clients to fit (an estimate from the model size and one forward's
            saved activations). None: 80% of the free memory of a CUDA device, half the host's available
            memory on the CPU.
        vectorize_cpu: On a CPU, ``measure`` (default): the first round times clients one at a time and
            batched, and the run goes on the faster way (logged, and in ``summary.json`` as
            ``vectorize/*``; a reading against batching is taken twice); a network that would batch
            under vmap (not a linear chain) trains one at a time unmeasured; ``batched`` or
            ``one_at_a_time`` pins the choice.
    """

    state_memory_mb: float | None = None
    state_dir: str | None = None
    threads_per_process: int | None = None
    compile: bool | Literal["default", "reduce-overhead", "max-autotune"] = False
    vectorize: int | Literal["auto"] = 1
    vectorize_memory_gb: float | None = None
    vectorize_cpu: Literal["measure", "batched", "one_at_a_time"] = "measure"

    #: How the config spells this object (messages name ``model.runtime.<field>``).
    field: ClassVar[str] = "model.runtime"

    def __post_init__(self) -> None:
        """Refuse a bad value with one line naming its ``model.runtime.<field>``."""
        f = self.field
        if self.state_memory_mb is not None:
            check_number(self.state_memory_mb, f"{f}.state_memory_mb", low=0, hint="or null for no limit")
        t = self.threads_per_process
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ConfigError(f"{f}.threads_per_process={t!r} must be >= 1 (or null)")
        if self.compile not in (False, True, *COMPILE_MODES):
            raise ConfigError(
                f"{f}.compile={self.compile!r} must be true, false or a torch.compile mode "
                f"({', '.join(COMPILE_MODES)})"
            )
        v = self.vectorize
        if v != "auto" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(
                f"{f}.vectorize={v!r} must be an integer >= 1 (1: one client at a time) or auto"
            )
        if self.vectorize_memory_gb is not None:
            hint = "or null: automatic"
            check_number(
                self.vectorize_memory_gb, f"{f}.vectorize_memory_gb", low=0, low_open=True, hint=hint
            )
        if self.vectorize_cpu not in CPU_MODES:
            raise ConfigError(
                f"{f}.vectorize_cpu={self.vectorize_cpu!r} must be one of {', '.join(CPU_MODES)}"
            )

    @property
    def state_budget_bytes(self) -> int | None:
        """``state_memory_mb`` in bytes (None: no limit)."""
        return None if self.state_memory_mb is None else int(self.state_memory_mb * 2**20)


#: The runtime's fields, which were arguments of ``FederatedModule`` itself before the runtime was one object.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Runtime))


def as_runtime(value: Runtime | Mapping[str, Any] | None) -> Runtime:
    """``value`` as a :class:`Runtime`: itself, the default for None, or built from a mapping (the command
    line's saved config of it, a checkpoint's).

    Raises:
        ConfigError: one line for a field it does not have, or a value that is not a runtime.
    """
    return as_fields_object(Runtime, value, Runtime.field, "runtime", "Runtime(vectorize='auto')")


def upgrade_model(model: Mapping[str, Any]) -> dict[str, Any]:
    """A ``model`` config section (a config file's, a run's ``config.yaml``, a checkpoint's saved arguments)
    with the runtime's fields given at its own level (``model: {vectorize: auto}``, the spelling from before
    the runtime was its own object) moved to ``runtime``; fields that ``runtime`` sets itself win. A section
    without them is returned as it is."""
    moved = {k: model[k] for k in FIELDS if k in model}
    if not moved:
        return dict(model)
    current = model.get("runtime")
    current = dict(current) if isinstance(current, Mapping) else {}
    rest = {k: v for k, v in model.items() if k not in FIELDS}
    return {**rest, "runtime": {**moved, **current}}


def upgrade_flat(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Flat ``{"model.vectorize": 4, ...}`` hyperparameters (a checkpoint's, for the resume's "changed
    hyperparameters" line) with the runtime's fields under ``model.runtime``."""
    return move_flat_fields(hparams, "model", FIELDS, Runtime.field)


__all__ = ["FIELDS", "Runtime", "as_runtime", "upgrade_flat", "upgrade_model"]
