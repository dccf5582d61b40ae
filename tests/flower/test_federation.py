"""Building an fl_lightning run from its config for the Flower apps: bad input is one line."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

import torch
from flower_helpers import RECIPE
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

from fl_lightning import Runtime
from fl_lightning.engine.executors import Sequential
from fl_lightning.errors import ConfigError
from fl_lightning.flower import load_federation, require_flwr
from fl_lightning.flower.federation import cached_federation, node_precision


def test_a_missing_config_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_federation(tmp_path / "nope.yaml")
    assert "is not a file" in str(err.value) and "\n" not in str(err.value)


def test_a_relative_config_is_read_from_root():
    fed = load_federation(RECIPE.name, root=RECIPE.parent)
    assert fed.num_clients == 4 and len(fed.data.clients) == 4
    assert fed.module.engine.clients is fed.data.clients


def test_a_bad_value_is_the_cli_one_line_error():
    with pytest.raises(ConfigError) as err:
        load_federation(RECIPE, ["--model.participation=2"])
    assert "model.participation" in str(err.value) and "\n" not in str(err.value)


def test_a_parse_error_is_one_line():
    with pytest.raises(ConfigError) as err:
        load_federation(RECIPE, ["--model.no_such_option=1"])
    assert str(err.value).startswith(str(RECIPE)) and "\n" not in str(err.value)


def test_the_federation_is_built_once_per_process():
    assert cached_federation(RECIPE) is cached_federation(str(RECIPE))


def test_the_initial_model_follows_seed_everything():
    a, b = load_federation(RECIPE), load_federation(RECIPE)
    c = load_federation(RECIPE, ["--seed_everything=1"])
    wa, wb, wc = (f.module.client.state_dict()["net.net.1.weight"] for f in (a, b, c))
    assert wa.equal(wb) and not wa.equal(wc)


def test_a_missing_extra_names_the_install_command():
    with pytest.raises(ModuleNotFoundError) as err:
        require_flwr("flwr>=999")
    assert "pip install 'fl_lightning[flwr]'" in str(err.value) and "\n" not in str(err.value)
    require_flwr()  # installed here


def test_a_node_engine_has_the_run_precision_and_runs_clients_one_at_a_time():
    fed = load_federation(RECIPE, ["--trainer.precision=bf16-mixed", "--model.runtime.vectorize=2"])
    precision = fed.module.engine.precision
    assert isinstance(precision, MixedPrecision) and precision.precision == "bf16-mixed"
    assert type(fed.executor) is Sequential and fed.executor is fed.module.engine.executor
    assert type(load_federation(RECIPE).module.engine.precision) is Precision  # 32-true, as fit's


def test_a_node_reads_the_runtime_in_its_current_and_its_former_spelling():
    """A Flower app's overrides (and its config) may spell the runtime at the model's level, as before
    ``model.runtime``: the node's module runs with the same runtime, its threads included."""
    new = cached_federation(RECIPE, ["--model.runtime.vectorize=2", "--model.runtime.threads_per_process=1"])
    old = cached_federation(RECIPE, ["--model.vectorize=2", "--model.threads_per_process", "1"])
    assert old.module.runtime == new.module.runtime == Runtime(vectorize=2, threads_per_process=1)
    assert old.module.engine.config.local.vectorize == 2


def test_node_precision_is_lightnings_choice_or_one_line():
    assert node_precision("bf16-true", torch.device("cpu")).precision == "bf16-true"
    with pytest.raises(ConfigError) as err:
        node_precision("fp8", torch.device("cpu"))
    assert str(err.value).startswith("flower: trainer.precision='fp8' cannot apply on this node (")
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------ a node's own data
def _node_folder(tmp_path, x, y, **more):
    import numpy as np

    folder = tmp_path / "node"
    folder.mkdir(exist_ok=True)
    np.savez(folder / "data.npz", x=x, y=y, **more)
    return folder


def test_a_node_with_its_own_files_trains_them_with_its_own_test_split(tmp_path):
    import numpy as np

    from fl_lightning.flower.federation import load_node_federation

    x = np.random.default_rng(0).normal(size=(20, 64)).astype(np.float32)
    folder = _node_folder(tmp_path, x, np.arange(20) % 10)
    fed = load_node_federation(RECIPE, folder, client_id=1)
    client = fed.data.clients[1]
    assert fed.files is not None and fed.files.folder == folder
    assert len(client.test_idx) == 4 and len(client.train_idx) == 16  # local_test_fraction 0.2
    assert torch.equal(client.x, torch.from_numpy(x)) and fed.data.num_clients == 4
    again = load_node_federation(RECIPE, folder, client_id=1)
    assert torch.equal(again.data.clients[1].test_idx, client.test_idx)  # seeded by (data.seed, client)


def test_a_node_with_its_own_test_files_uses_them(tmp_path):
    import numpy as np

    from fl_lightning.flower.federation import load_node_federation

    x = np.zeros((5, 64), np.float32)
    folder = _node_folder(tmp_path, x, np.arange(5), x_test=x[:3], y_test=np.array([9, 8, 7]))
    client = load_node_federation(RECIPE, folder, client_id=0).data.clients[0]
    assert len(client.train_idx) == 5 and client.test_y.tolist() == [9, 8, 7]


@pytest.mark.parametrize(
    ("shape", "labels", "expected"),
    [
        ((4, 64), [0, 1, 2, 12], "label 12 of y is outside the model's 10 classes 0..9"),
        ((4, 5), [0, 1, 2, 3], "model.client.net cannot take its inputs of shape (5,)"),
    ],
)
def test_node_files_the_model_cannot_take_are_one_line(tmp_path, shape, labels, expected):
    import numpy as np

    from fl_lightning.flower.federation import load_node_federation

    folder = _node_folder(tmp_path, np.zeros(shape, np.float32), np.array(labels))
    with pytest.raises(ConfigError) as err:
        load_node_federation(RECIPE, folder, client_id=0)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"data-dir '{folder}': ") and expected in msg, msg


def test_exported_node_files_hold_each_clients_split(tmp_path):
    from fl_lightning.flower.federation import export_node_data, load_node_federation

    written = export_node_data(RECIPE, tmp_path / "out")
    assert [p.parent.name for p in written] == [f"client-{c}" for c in range(4)]
    central = load_federation(RECIPE).data.clients[2]
    node = load_node_federation(RECIPE, written[2].parent, client_id=2).data.clients[2]
    assert torch.equal(node.x[node.train_idx], central.x[central.train_idx])
    assert torch.equal(node.test_y[node.test_idx], central.y[central.test_idx])
