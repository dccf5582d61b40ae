import json
from types import SimpleNamespace

import pytest

from fl_lightning.callbacks.communication import CommunicationToTarget
from fl_lightning.errors import ConfigError

from conftest import make_module


def test_bytes_until_the_target_are_those_of_the_rounds_before(fit, tmp_path):
    targets = [i / 200 for i in range(201)]  # 0.0, 0.005, ..., 1.0: some are first reached after round 1
    callbacks = [CommunicationToTarget("global/acc", t) for t in targets]
    never = CommunicationToTarget("global/acc", 2.0)
    module = make_module(width=8, local_steps=10)  # global/acc here: 0.081, 0.092, 0.100
    fit(module, rounds=3, callbacks=[*callbacks, never])
    history = module.history
    acc = [float(r.metrics["global/acc"]) for r in history]
    for target, cb in zip(targets, callbacks):
        first = next((i for i, a in enumerate(acc) if a >= target), None)  # by hand from the history
        if first is None:
            assert cb.result is None, target
            continue
        down = sum(r.bytes_down for r in history[: first + 1])
        up = sum(r.bytes_up for r in history[: first + 1])
        expected = {"round": first + 1, "value": acc[first], "bytes_down": down, "bytes_up": up}
        assert cb.result == {**expected, "bytes_total": down + up}, target
    assert max(cb.result["round"] for cb in callbacks if cb.result) > 1  # the cumulative sums are tested
    assert never.result is None
    # every callback writes target.json in the log folder at the end of fit; the last one is `never`'s
    written = json.loads((tmp_path / "target.json").read_text())
    assert written == {"monitor": "global/acc", "target": 2.0, "reached": False}
    reached = max((cb for cb in callbacks if cb.result), key=lambda cb: cb.result["round"])
    reached.on_fit_end(SimpleNamespace(log_dir=str(tmp_path / "reached")), module)
    written = json.loads((tmp_path / "reached" / "target.json").read_text())
    assert written == {"monitor": "global/acc", "target": reached.target, "reached": True, **reached.result}
    restored = CommunicationToTarget()
    restored.load_state_dict(reached.state_dict())
    assert restored.result == reached.result


def test_empty_monitor_is_a_config_error():
    with pytest.raises(ConfigError, match="monitor"):
        CommunicationToTarget("", 0.5)
