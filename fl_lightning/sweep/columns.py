"""The table's columns: how each reads a finished run (summary.json, TensorBoard scalars) and prints."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_lightning.errors import ConfigError
from fl_lightning.runs import read_curves, read_scalars

CUSTOM_KEYS = ("label", "summary", "scalar", "scale", "digits")


@dataclass(frozen=True)
class Column:
    """One table column: how to read a run's value and how to print it."""

    key: str
    label: str  # ``{m}`` is the metric's name, ``{target}`` the target
    digits: int
    legend: str
    read: Callable[[RunData], float | None]
    checked: bool = True  # compared by --check (wall-clock columns are not)


class RunData:
    """A finished run's summary.json and (read on first use) its TensorBoard scalars (its version folder)."""

    def __init__(
        self, folder: Path, summary: dict[str, Any], target: tuple[str | None, float] | None
    ) -> None:
        self.folder = folder  # the run's lightning_logs/version_N
        self.summary = summary
        self.metric = str(summary.get("metric", "acc"))
        self.target = target
        self._scalars: dict[str, list[tuple[int, float]]] | None = None
        self._curves: list[dict[str, float]] | None = None

    @property
    def scalars(self) -> dict[str, list[tuple[int, float]]]:
        if self._scalars is None:
            self._scalars = read_scalars(self.folder)
        return self._scalars

    @property
    def curves(self) -> list[dict[str, float]] | None:
        """The run's ``curves.csv`` (numbers; a blank cell left out), None if it has none."""
        if self._curves is None:
            self._curves = read_curves(self.folder)
        return self._curves or None

    def last_scalar(self, tag: str) -> float | None:
        values = self.scalars.get(tag)
        return values[-1][1] if values else None

    def target_step(self) -> int | None:
        """The first step (rounds done) at which the target tag reached the target value, else None."""
        if self.target is None:
            return None
        tag, value = self.target
        return next((s for s, v in self.scalars.get(tag or f"global/{self.metric}", []) if v >= value), None)

    def target_reached(self) -> tuple[int, float] | None:
        """``(round, bytes)`` when the target tag first reached the target value, else None."""
        if self.target is None:
            return None
        tag, value = self.target
        for step, v in self.scalars.get(tag or f"global/{self.metric}", []):
            if v >= value:
                sent = sum(
                    b
                    for t in ("round/bytes_down", "round/bytes_up")
                    for s, b in self.scalars.get(t, [])
                    if s <= step
                )
                return step, sent
        return None


def _summary_pct(key: str) -> Callable[[RunData], float | None]:
    def read(d: RunData) -> float | None:
        v = d.summary.get(key.format(m=d.metric))
        return None if v is None else 100.0 * float(v)

    return read


def _summary_num(key: str, scale: float = 1.0, per_round: bool = False) -> Callable[[RunData], float | None]:
    def read(d: RunData) -> float | None:
        v = d.summary.get(key)
        if not isinstance(v, int | float) or isinstance(v, bool):
            return None
        rounds = d.summary.get("rounds") or 0
        if per_round:
            return None if not rounds else scale * v / rounds
        return scale * float(v)

    return read


def _run_wall(d: RunData) -> float | None:
    """The run's wall time over all its starts (``run_wall_time_s``; a summary written before it: the
    last start's, ``wall_time_s``)."""
    return _summary_num("run_wall_time_s" if "run_wall_time_s" in d.summary else "wall_time_s")(d)


def client_mean(d: RunData) -> float | None:
    spread = d.summary.get(f"client_{d.metric}")
    return 100.0 * float(spread["mean"]) if isinstance(spread, dict) and "mean" in spread else None


def _personal(d: RunData) -> float | None:
    v = d.last_scalar(f"personal/{d.metric}")
    return None if v is None else 100.0 * v


def _to_target_rounds(d: RunData) -> float | None:
    hit = d.target_reached()
    return None if hit is None else float(hit[0])


def _to_target_mib(d: RunData) -> float | None:
    hit = d.target_reached()
    return None if hit is None else hit[1] / 2**20


def _to_target_sim(d: RunData) -> float | None:
    """The simulated clock (``sim/time_s``) at the round that first reached the target."""
    step = d.target_step()
    if step is None:
        return None
    return next((v for s, v in d.scalars.get("sim/time_s", []) if s == step), None)


_MIB, _KIB = 1 / 2**20, 1 / 2**10

#: The spread statistics a sweep column reads from summary.json's ``client_<m>`` (and ``client_global_<m>``).
SPREAD_COLUMNS = {
    "weighted_mean": "mean weighted by test samples",
    "std": "std over clients",
    "worst": "worst client",
    "bottom10": "mean of the worst 10% of clients",
    "top10": "mean of the best 10% of clients",
    "p10": "10th percentile over clients",
    "p50": "median over clients",
    "p90": "90th percentile over clients",
}


def _spread(family: str, stat: str) -> Callable[[RunData], float | None]:
    key = "min" if stat == "worst" else stat

    def read(d: RunData) -> float | None:
        spread = d.summary.get(family.format(m=d.metric))
        v = spread.get(key) if isinstance(spread, dict) else None
        return None if v is None else 100.0 * float(v)

    return read


def _spread_columns() -> list[Column]:
    out = []
    for stat, what in SPREAD_COLUMNS.items():
        out.append(
            Column(
                f"client_{stat}",
                f"client {{m}} {stat} (%)",
                2,
                f"deployed model (personalised, else global), participating clients' test splits: {what}",
                _spread("client_{m}", stat),
            )
        )
        out.append(
            Column(
                f"client_global_{stat}",
                f"client global {{m}} {stat} (%)",
                2,
                f"global model on the participating clients' test splits: {what}",
                _spread("client_global_{m}", stat),
            )
        )
    return out


def spec_alias(name: str) -> str:
    """The column a name means: the spread columns also answer to the metric's spelling
    (``client_acc_p10`` is ``client_p10``, ``client_global_o_f1_worst`` is ``client_global_worst``)."""
    match = re.fullmatch(r"client_(global_)?(?:acc|o_f1)_(\w+)", name)
    if match and match[2] in SPREAD_COLUMNS:
        return f"client_{match[1] or ''}{match[2]}"
    return name


#: ``<tag>@<clock>=<budget>`` (the metric when the budget was spent) and ``<clock>_to@<target>`` (the clock
#: when the global metric first reached the target), read from each run's curves.csv.
CLOCK_COLUMN = re.compile(
    r"^(?:(?P<tag>[A-Za-z_][\w/]*)@(?P<clock>sim|bytes|round)=(?P<budget>[0-9.]+(?:e[0-9]+)?)(?P<unit>[A-Za-z]*)"
    r"|(?P<to>sim|bytes|round)_to@(?P<target>[0-9.]+))$"
)
_CLOCKS = {"sim": "sim_time_s", "bytes": "bytes_total", "round": "round"}
_UNITS = {
    "sim": {"": 1.0, "s": 1.0, "min": 60.0, "h": 3600.0},
    "bytes": {"": 1.0, "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30},
    "round": {"": 1.0},
}


def clock_column(spec: str, where: str) -> Column | None:
    """The column ``spec`` names if it is a clock column (None: it is not one).

    ``acc@sim=100s``: the global metric (``acc`` or ``o_f1`` mean ``global/<m>``; any curves.csv column
    such as ``personal/acc`` may be named) at its last evaluation within 100 simulated seconds (units ``s``,
    ``min``, ``h``); ``acc@bytes=10MB`` within 10 MB down + up (``B``, ``KB``, ``MB``, ``GB``: powers of 10;
    ``KiB``, ``MiB``, ``GiB``); ``acc@round=50``. ``sim_to@0.8``: the simulated seconds until ``global/<m>``
    first reached 0.8; ``bytes_to@0.8`` in MiB; ``round_to@0.8`` in rounds.
    """
    match = CLOCK_COLUMN.match(spec)
    if match is None:
        return None
    if match["to"]:
        clock, target = match["to"], float(match["target"])
        scale = _MIB if clock == "bytes" else 1.0
        unit = {"sim": "sim s", "bytes": "MiB", "round": "rounds"}[clock]

        def read_to(d: RunData) -> float | None:
            rows = d.curves or []
            tag = f"global/{d.metric}"
            hit = next((r for r in rows if r.get(tag, -math.inf) >= target), None)
            v = None if hit is None else hit.get(_CLOCKS[clock])
            return None if v is None else scale * v

        return Column(
            spec,
            f"{unit} to {target:g}",
            2 if clock == "bytes" else 1,
            f"{_CLOCKS[clock]} (curves.csv) when global/{{m}} first reached {target:g}",
            read_to,
        )
    clock, tag, unit = match["clock"], match["tag"], match["unit"]
    units = _UNITS[clock]
    if unit not in units:
        raise ConfigError(
            f"{where}: unit {unit!r} of {spec!r} must be one of {', '.join(u for u in units if u)}"
        )
    budget = float(match["budget"]) * units[unit]

    def read_at(d: RunData) -> float | None:
        name = tag if "/" in tag else f"global/{tag}"
        within = [r for r in d.curves or [] if name in r and r.get(_CLOCKS[clock], math.inf) <= budget]
        return None if not within else 100.0 * within[-1][name]

    shown = f"{match['budget']}{unit}"
    return Column(
        spec,
        f"{tag} @ {clock} {shown} (%)",
        2,
        f"{tag} at its last evaluation within {clock} {shown} (curves.csv)",
        read_at,
    )


COLUMNS: dict[str, Column] = {
    c.key: c
    for c in [
        Column(
            "final", "final {m} (%)", 2, "global model after the last round", _summary_pct("final_global_{m}")
        ),
        Column(
            "best",
            "best-round {m}, val or test* (%)",
            2,
            "global model at its best round on the split global/{m} evaluates: validation "
            "(data.val_fraction > 0), else *the test split: optimistic, the round is chosen on the numbers "
            "it reports (best_val and best_test name the split)",
            _summary_pct("best_global_{m}"),
        ),
        Column(
            "best_val",
            "best-on-val {m} (%)",
            2,
            "global model at its best round on the validation split (data.val_fraction > 0)",
            _summary_pct("best_val_global_{m}"),
        ),
        Column(
            "best_test",
            "best-on-test {m} (%, optimistic)",
            2,
            "global model at its best round on the test split: optimistic, the round is chosen on the test "
            "numbers themselves",
            _summary_pct("best_test_global_{m}"),
        ),
        Column(
            "last_k_mean",
            "last-k mean {m} (%)",
            2,
            "global model, mean of its last k evaluations (summary.json last_k, at most 5)",
            _summary_pct("last_k_mean_global_{m}"),
        ),
        Column("best_round", "best round", 1, "round of the best global value", _summary_num("best_round")),
        Column(
            "unseen",
            "unseen {m} (%)",
            2,
            "global model, mean over the clients never sampled (data.unseen_clients)",
            _summary_pct("unseen_global_{m}"),
        ),
        Column(
            "participation_gap",
            "participation gap (pts)",
            2,
            "participating minus unseen clients, global model on their test data (Yuan et al., ICLR 2022)",
            _summary_pct("participation_gap"),
        ),
        Column(
            "participation_gap_personal",
            "personalised participation gap (pts)",
            2,
            "as participation_gap for the deployed models (the unseen after the strategy's own adaptation)",
            _summary_pct("participation_gap_personal"),
        ),
        Column(
            "out_of_sample_gap",
            "out-of-sample gap (pts)",
            2,
            "participating clients, global model: train minus test data (Yuan et al., ICLR 2022)",
            _summary_pct("out_of_sample_gap"),
        ),
        *_spread_columns(),
        Column(
            "client",
            "client {m} (%)",
            2,
            "mean over clients of the deployed model (the personalised one for personalised strategies, "
            "else the global model) on each client's local test split",
            client_mean,
        ),
        Column(
            "personal",
            "personal {m} (%)",
            2,
            "every client's deployed model on its local test split, merged over clients (last personal/{m})",
            _personal,
        ),
        Column("rounds", "rounds", 1, "rounds done", _summary_num("rounds")),
        Column(
            "rounds_to_target",
            "rounds to {target}",
            1,
            "first round whose {tag} reached the target (mean over the seeds that reached it)",
            _to_target_rounds,
        ),
        Column("mib_to_target", "MiB to {target}", 2, "bytes down + up until then", _to_target_mib),
        Column(
            "sim_s",
            "sim time (s)",
            1,
            "simulated time of the run (model.system: the clients' download, computation and upload)",
            _summary_num("sim_time_s"),
        ),
        Column(
            "sim_s_to_target",
            "sim s to {target}",
            1,
            "simulated time (sim/time_s) at the first round whose {tag} reached the target",
            _to_target_sim,
        ),
        Column("wall_s", "wall (s)", 1, "wall time of the run (all its starts)", _run_wall, False),
        Column("s_per_round", "s/round", 3, "mean time per round", _summary_num("mean_round_s"), False),
        Column("mib", "MiB", 2, "bytes down + up, all rounds", _summary_num("bytes_total", _MIB)),
        Column("mib_down", "MiB down", 2, "bytes to the clients", _summary_num("bytes_down", _MIB)),
        Column("mib_up", "MiB up", 2, "bytes from the clients", _summary_num("bytes_up", _MIB)),
        Column(
            "mib_per_round",
            "MiB/round",
            3,
            "bytes down + up per round",
            _summary_num("bytes_total", _MIB, True),
        ),
        Column(
            "kib_per_round",
            "KiB/round",
            1,
            "bytes down + up per round",
            _summary_num("bytes_total", _KIB, True),
        ),
        Column("kib_down_per_round", "KiB down/round", 1, "", _summary_num("bytes_down", _KIB, True)),
        Column("kib_up_per_round", "KiB up/round", 1, "", _summary_num("bytes_up", _KIB, True)),
    ]
}


DEFAULT_COLUMNS = ("final", "best", "client", "rounds_to_target", "wall_s", "mib")


def custom_column(spec: dict[str, Any], where: str) -> Column:
    """A column read from any summary.json number or last TensorBoard scalar (``spec``'s keys checked)."""
    label = spec.get("label")
    if not isinstance(label, str) or not label:
        raise ConfigError(
            f"{where}.label: give the column's header, e.g. {{label: eps, summary: privacy/epsilon}}"
        )
    sources = [k for k in ("summary", "scalar") if k in spec]
    if len(sources) != 1 or not isinstance(spec[sources[0]], str):
        raise ConfigError(f"{where}: give one of summary: <summary.json key> or scalar: <TensorBoard tag>")
    scale = spec.get("scale", 1.0)
    digits = spec.get("digits", 2)
    if not isinstance(scale, int | float) or isinstance(scale, bool):
        raise ConfigError(f"{where}.scale={scale!r} must be a number, e.g. 100 for a fraction in %")
    if not isinstance(digits, int) or isinstance(digits, bool) or not 0 <= digits <= 8:
        raise ConfigError(f"{where}.digits={digits!r} must be an integer in [0, 8]")
    source = spec[sources[0]]
    if sources[0] == "summary":
        read = _summary_num(source, float(scale))
    else:

        def read(d: RunData, tag: str = source, s: float = float(scale)) -> float | None:
            v = d.last_scalar(tag)
            return None if v is None else s * v

    key = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower() or "value"
    label = label.replace("{", "{{").replace("}", "}}")  # headers are formatted with {m} and {target}
    return Column(key, label, digits, f"{sources[0]} {source}", read)
