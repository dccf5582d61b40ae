"""Fixtures of the sweep tests: each starts in its own folder, with a stand-in parser and ``fit``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sweep_helpers import FAKE_FIT, fake_config

from fl_lightning.sweep import command, runner


@pytest.fixture(autouse=True)
def in_tmp_with_fake_resolver(tmp_path, monkeypatch):
    """Every test starts in ``tmp_path`` (a sweep's default ``out`` is under the current folder), and
    the sweep resolves run arguments with :func:`fake_config` (tests of the real parser restore it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "resolver", lambda root: lambda args, check: fake_config(args))


@pytest.fixture
def fake_fit(tmp_path, monkeypatch):
    """Every process the sweep launches runs :data:`FAKE_FIT` with the sweep's ``fit`` arguments."""
    script = tmp_path / "fake_fit.py"
    script.write_text(FAKE_FIT)
    real = subprocess.Popen

    def popen(cmd, **kw):
        assert cmd[1:4] == ["-m", "fl_lightning", "fit"]
        return real([sys.executable, str(script), *cmd[4:]], **kw)

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    monkeypatch.setattr(command, "machine_cores", lambda: 4)
