"""Federated data: datasets, partitioners, the federated LightningDataModule."""

from fl_lightning.data import fashion_mnist as fashion_mnist  # registers the "fashion_mnist" dataset
from fl_lightning.data import tiny_imagenet as tiny_imagenet  # registers the "tiny_imagenet" dataset
from fl_lightning.data.datasets import DatasetSplits, list_datasets, load_dataset, register_dataset
from fl_lightning.data.federated import ClientData, FederatedDataModule, RoundLoader
from fl_lightning.data.flair import NaturalUsers as NaturalUsers  # registers the "flair" dataset
from fl_lightning.data.partition import (
    IID,
    Dirichlet,
    DirichletWithReplacement,
    Partitioner,
    Pathological,
    PathologicalWithReplacement,
    list_partitioners,
)

__all__ = [
    "IID",
    "ClientData",
    "DatasetSplits",
    "Dirichlet",
    "DirichletWithReplacement",
    "FederatedDataModule",
    "Partitioner",
    "Pathological",
    "PathologicalWithReplacement",
    "RoundLoader",
    "list_datasets",
    "list_partitioners",
    "load_dataset",
    "register_dataset",
]
