"""The global model on the clients' training data (callbacks/global_train.py), against a direct evaluation."""

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from fl_lightning.callbacks import GlobalTrainMetrics
from fl_lightning.errors import ConfigError
from fl_lightning.runs import read_scalars

from conftest import make_data, make_module, make_trainer


def test_the_global_training_loss_is_the_global_model_on_every_training_sample(tmp_path):
    module = make_module()
    data = make_data()
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    trainer = make_trainer(tmp_path, rounds=2, logger=logger, callbacks=[GlobalTrainMetrics(batch_size=7)])
    trainer.fit(module, datamodule=data)
    assert [s for s, _ in read_scalars(trainer.log_dir)["global_train/loss"]] == [1, 2]
    x = torch.cat([c.x[c.train_idx] for c in data.clients])
    y = torch.cat([c.y[c.train_idx] for c in data.clients])
    module.client.eval()
    with torch.no_grad():
        out = module.client(x)
    loss = torch.nn.functional.cross_entropy(out, y)
    acc = (out.argmax(1) == y).float().mean()
    assert module.history[-1].metrics["global_train/loss"] == pytest.approx(float(loss), rel=1e-5)
    assert module.history[-1].metrics["global_train/acc"] == pytest.approx(float(acc), rel=1e-6)


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match=r"GlobalTrainMetrics\.every_n_rounds=0 must be an integer >= 1"):
        GlobalTrainMetrics(every_n_rounds=0)
