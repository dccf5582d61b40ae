"""Devices read from a CSV trace, and every way a trace file can be wrong: one line naming the file, the
line and the column (engine/system/trace.py)."""

import pytest

from fl_lightning.engine.system import RoundPolicy, Setup, Trace
from fl_lightning.errors import ConfigError

HEADER = "client,speed,download_mbps,upload_mbps,availability"


def write(tmp_path, text, name="devices.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_trace_gives_each_client_its_line(tmp_path):
    path = write(tmp_path, f"{HEADER},dropout\n1,35,8.4,1.2,0.6,0.05\n0,120.5,22,6.1,0.9,0\n\n")
    trace = Trace(str(path))
    trace.bind(Setup(2, 0, 10, (5, 5), (5, 5), 1, None, 1000, 1000), RoundPolicy(deadline_s=100.0))
    p = trace.devices
    assert p.speed == (120.5, 35.0) and p.download_mbps == (22.0, 8.4) and p.upload_mbps == (6.1, 1.2)
    assert p.availability == (0.9, 0.6) and p.dropout == (0.0, 0.05) and not p.cycle
    plain = Trace(str(write(tmp_path, f"{HEADER}\n0,10,1,1,1\n", "b.csv")), day_s=10.0, online_fraction=0.5)
    q = plain.profiles(1, 0)
    assert q.dropout == (0.0,) and q.cycle and q.phase == (0.0,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, r"devices\.csv does not exist; give a CSV file with the header client,speed,"),
        ("", r"devices\.csv is empty"),
        ("client,speed\n0,1\n", r"devices\.csv line 1: the header must be client,speed,download_mbps,"),
        (f"{HEADER}\n", r"has a header but no client lines"),
        (f"{HEADER}\n0,10,1,1\n", r"devices\.csv line 2: 4 values, expected 5"),
        (f"{HEADER}\n0,10,1,1,1\n1,fast,1,1,1\n", r"line 3, column 2 \(speed\): 'fast' is not a number"),
        (
            f"{HEADER}\n0,10,1,1,1.5\n",
            r"line 2, column 5 \(availability\): 1\.5 must be a probability in \[0, 1\]",
        ),
        (
            f"{HEADER},dropout\n0,10,1,1,1,-0.1\n",
            r"line 2, column 6 \(dropout\): -0\.1 must be a probability",
        ),
        (f"{HEADER}\n0,10,0,1,1\n", r"line 2, column 3 \(download_mbps\): 0 must be Mbit/s, > 0"),
        (f"{HEADER}\n0.5,10,1,1,1\n", r"line 2, column 1 \(client\): 0\.5 must be an integer client id"),
        (f"{HEADER}\n0,10,1,1,1\n0,10,1,1,1\n", r"line 3, column 1 \(client\): client 0 has two lines"),
    ],
    ids=[
        "missing",
        "empty",
        "header",
        "no-lines",
        "columns",
        "not-a-number",
        "availability",
        "dropout",
        "bandwidth",
        "client-id",
        "duplicate",
    ],
)
def test_a_bad_trace_is_one_line_naming_the_file_line_and_column(tmp_path, text, message):
    path = tmp_path / "devices.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=r"^model\.system\.path: .*" + message) as info:
        Trace(str(path))
    assert "\n" not in str(info.value)


def test_a_folder_is_not_a_trace(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        Trace(str(tmp_path))


def test_a_trace_that_lacks_a_client_names_it(tmp_path):
    trace = Trace(str(write(tmp_path, f"{HEADER}\n0,10,1,1,1\n2,10,1,1,1\n")))
    with pytest.raises(ConfigError) as info:
        trace.bind(Setup(4, 0, 10, (5,) * 4, (5,) * 4, 1, None, 1000, 1000))
    msg = str(info.value)
    assert msg.startswith("model.system.path: ") and "has no line for client 1 (and 1 more)" in msg
    assert "data.num_clients=4 needs a line for each client 0..3" in msg and "\n" not in msg
