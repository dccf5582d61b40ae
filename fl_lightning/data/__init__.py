"""Federated data: dataset classes, partitioners, client transforms, the federated LightningDataModule."""

from fl_lightning.data.datasets import (
    CIFAR10,
    CIFAR100,
    MNIST,
    DatasetSource,
    DatasetSplits,
    Digits,
    Synthetic,
    get_dataset,
    list_datasets,
    load_dataset,
    register_dataset,
)
from fl_lightning.data.fashion_mnist import FashionMNIST
from fl_lightning.data.fcube import FCUBE
from fl_lightning.data.federated import ClientData, FederatedDataModule, RoundLoader
from fl_lightning.data.fedprox_synthetic import FedProxSynthetic
from fl_lightning.data.flair import Flair
from fl_lightning.data.leaf import Leaf
from fl_lightning.data.partition import (
    IID,
    Dirichlet,
    DirichletWithReplacement,
    LabelQuantity,
    MixedSkew,
    NaturalUsers,
    Partitioner,
    Pathological,
    PathologicalWithReplacement,
    QuantitySkew,
    list_partitioners,
)
from fl_lightning.data.shakespeare import Shakespeare
from fl_lightning.data.tiny_imagenet import TinyImageNet
from fl_lightning.data.transforms import (
    ClientTransform,
    GaussianNoise,
    LabelNoise,
    LabelPermutation,
    Rotation,
    list_transforms,
)

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "FCUBE",
    "IID",
    "MNIST",
    "ClientData",
    "ClientTransform",
    "DatasetSource",
    "DatasetSplits",
    "Digits",
    "Dirichlet",
    "DirichletWithReplacement",
    "FashionMNIST",
    "FedProxSynthetic",
    "FederatedDataModule",
    "Flair",
    "GaussianNoise",
    "LabelNoise",
    "LabelPermutation",
    "LabelQuantity",
    "Leaf",
    "MixedSkew",
    "NaturalUsers",
    "Partitioner",
    "Pathological",
    "PathologicalWithReplacement",
    "QuantitySkew",
    "Rotation",
    "RoundLoader",
    "Shakespeare",
    "Synthetic",
    "TinyImageNet",
    "get_dataset",
    "list_datasets",
    "list_partitioners",
    "list_transforms",
    "load_dataset",
    "register_dataset",
]
