import json

import pytest
from torch.utils.tensorboard import SummaryWriter

from fl_lightning.runs import last_scalars, latest_run, read_scalars, read_summary


def test_latest_run_orders_versions_numerically_and_can_require_a_summary(tmp_path):
    for n in (2, 10, 11):
        (tmp_path / "lightning_logs" / f"version_{n}").mkdir(parents=True)
    for n in (2, 10):
        (tmp_path / "lightning_logs" / f"version_{n}" / "summary.json").write_text(json.dumps({"rounds": n}))
    assert latest_run(tmp_path).name == "version_11"  # 11 > 10 > 2, not string order
    finished = latest_run(tmp_path, with_summary=True)
    assert finished.name == "version_10" and read_summary(finished) == {"rounds": 10}
    with pytest.raises(FileNotFoundError, match="no run under"):
        latest_run(tmp_path / "empty")


def test_last_scalars_reads_the_last_value_and_none_for_missing_tags(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for step, value in enumerate([0.1, 0.5, 0.25]):
        writer.add_scalar("global/acc", value, step)
    writer.close()
    assert last_scalars(tmp_path, ["global/acc", "personal/acc"]) == {
        "global/acc": 0.25,
        "personal/acc": None,
    }


def test_read_scalars_gives_every_tag_with_its_steps(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for step, value in [(1, 0.5), (2, 0.75)]:
        writer.add_scalar("global/acc", value, step)
    writer.add_scalar("round/clients", 4.0, 1)
    writer.close()
    assert read_scalars(tmp_path) == {"global/acc": [(1, 0.5), (2, 0.75)], "round/clients": [(1, 4.0)]}


def test_labelled_run_folders_count_by_their_number(tmp_path):
    from fl_lightning.runs import run_number

    for name in ("version_2-fedavg-iid", "version_10-fedbuff-dirichlet-devices", "version_9", "versions"):
        (tmp_path / "lightning_logs" / name).mkdir(parents=True)
    assert latest_run(tmp_path).name == "version_10-fedbuff-dirichlet-devices"
    assert [run_number(p) for p in ("version_3", "version_3-my-run", "version_x", "other")] == [
        3,
        3,
        None,
        None,
    ]
