import json

import pytest

from fl_lightning.callbacks.communication import CommunicationToTarget
from fl_lightning.errors import ConfigError

from conftest import make_module


def test_bytes_until_the_target_are_those_of_the_rounds_before(fit, tmp_path):
    reached, never = CommunicationToTarget("global/acc", 0.0), CommunicationToTarget("global/acc", 2.0)
    module = make_module()
    fit(module, rounds=3, callbacks=[reached, never])
    first = module.history[0]
    assert reached.result == {
        "round": 1,
        "value": reached.result["value"],
        "bytes_down": first["bytes_down"],
        "bytes_up": first["bytes_up"],
        "bytes_total": first["bytes_down"] + first["bytes_up"],
    }
    assert never.result is None
    written = json.loads((tmp_path / "target.json").read_text())
    assert written["monitor"] == "global/acc" and "reached" in written
    restored = CommunicationToTarget()
    restored.load_state_dict(reached.state_dict())
    assert restored.result == reached.result


def test_empty_monitor_is_a_config_error():
    with pytest.raises(ConfigError, match="monitor"):
        CommunicationToTarget("", 0.5)
