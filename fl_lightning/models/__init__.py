"""Model zoo: plain ``nn.Module`` classes with typed constructor arguments.

A YAML config selects one with ``class_path: fl_lightning.models.SmallCNN`` and ``init_args``. Every
model is imported here explicitly and exported from ``fl_lightning.models``; ``@register_model("name")``
lists it (:func:`list_models`) and :func:`create_model` gives name-based access for scripts and tests.
Adding a model is adding a file and one import line here.
"""

from __future__ import annotations

from fl_lightning.models.alexnet import AlexNetCNN
from fl_lightning.models.cnn import MLP, SmallCNN
from fl_lightning.models.cp import Tensorized
from fl_lightning.models.decomposed import Decomposed
from fl_lightning.models.fedpara import FedPara
from fl_lightning.models.flair_resnet import TorchvisionResNet18
from fl_lightning.models.lenet import LeNet
from fl_lightning.models.linear import LogisticRegression
from fl_lightning.models.lstm import CharLSTM
from fl_lightning.models.moon_cnn import MoonCNN, MoonCNN100
from fl_lightning.models.registry import MODELS, create_model, list_models, register_model
from fl_lightning.models.resnet import ResNet18GN
from fl_lightning.models.sizing import FollowsData, size_to_data
from fl_lightning.models.tdpfed_nets import DNN, VGG8

__all__ = [
    "DNN",
    "MLP",
    "MODELS",
    "VGG8",
    "AlexNetCNN",
    "CharLSTM",
    "Decomposed",
    "FedPara",
    "FollowsData",
    "LeNet",
    "LogisticRegression",
    "MoonCNN",
    "MoonCNN100",
    "ResNet18GN",
    "SmallCNN",
    "Tensorized",
    "TorchvisionResNet18",
    "create_model",
    "list_models",
    "register_model",
    "size_to_data",
]
