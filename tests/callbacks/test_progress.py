import logging

from lightning.pytorch.loggers import TensorBoardLogger

from fl_lightning.callbacks import FederatedProgressBar
from fl_lightning.callbacks import progress as progress_module

from conftest import make_data, make_module, make_trainer


def test_on_a_terminal_the_bar_counts_rounds_not_epochs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "interactive", lambda stream: True)
    bar = FederatedProgressBar()
    logger = TensorBoardLogger(tmp_path)
    trainer = make_trainer(tmp_path, rounds=3, enable_progress_bar=True, callbacks=[bar], logger=logger)
    trainer.fit(make_module(), datamodule=make_data())
    main = bar.train_progress_bar
    assert (main.desc, main.n, main.total) == ("round", 3, 3)
    assert "clients=4/4" in main.postfix and "global/acc" in main.postfix
    drawn = capsys.readouterr().out
    assert "round: 100%" in drawn and "v_num" not in drawn and "Epoch" not in drawn
    assert "Validation" not in drawn  # the per-round evaluation draws no bar of its own


def test_without_a_terminal_a_line_per_tenth_of_the_run_and_every_round_at_debug(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(progress_module, "interactive", lambda stream: False)
    monkeypatch.setattr(progress_module, "LINES", 2)  # a line every ceil(4 / 2) = 2 rounds
    bar = FederatedProgressBar()
    trainer = make_trainer(tmp_path, rounds=4, enable_progress_bar=True, callbacks=[bar])
    with caplog.at_level(logging.DEBUG, logger="fl_lightning"):
        trainer.fit(make_module(), datamodule=make_data())
    lines = [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records if r.name == "fl_lightning"]
    lines = [line for line in lines if line[1].startswith("round ")]
    info, debug = logging.INFO, logging.DEBUG
    assert lines == [(debug, "round 1/4"), (info, "round 2/4"), (debug, "round 3/4"), (info, "round 4/4")]
    assert bar.train_progress_bar.disable and bar.train_progress_bar.n == 4
    last = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("round 4/4"))
    assert "global/acc" in last and "train/loss" in last


def _round_lines(tmp_path, caplog, **kw) -> list[str]:
    caplog.clear()
    trainer = make_trainer(
        tmp_path, rounds=4, enable_progress_bar=True, callbacks=[FederatedProgressBar()], **kw
    )
    with caplog.at_level(logging.DEBUG, logger="fl_lightning"):
        trainer.fit(make_module(), datamodule=make_data())
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]


def test_a_round_without_validation_is_said_with_its_own_metrics(tmp_path, monkeypatch, caplog):
    """Validation after the last round only: each round's line (said when the next round ends) holds its
    own training metrics, as where every round is validated, not the next round's."""
    monkeypatch.setattr(progress_module, "interactive", lambda stream: False)
    every = _round_lines(tmp_path / "every", caplog)
    last = _round_lines(tmp_path / "last", caplog, val_check_interval=4)
    assert [line.split(":")[0] for line in last] == [f"round {i}/4" for i in range(1, 5)]

    def losses(lines: list[str]) -> list[str]:
        return [line.split("train/loss ")[1].split(",")[0] for line in lines]

    assert losses(last) == losses(every) and len(set(losses(last))) == 4
    assert "global/acc" in last[-1] and "global/acc" not in last[0]
