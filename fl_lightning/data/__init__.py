"""Federated data: datasets, partitioners, client transforms, the federated LightningDataModule."""

from fl_lightning.data import fashion_mnist as fashion_mnist  # registers the "fashion_mnist" dataset
from fl_lightning.data import flair as flair  # registers the "flair" dataset
from fl_lightning.data import tiny_imagenet as tiny_imagenet  # registers the "tiny_imagenet" dataset
from fl_lightning.data.datasets import DatasetSplits, list_datasets, load_dataset, register_dataset
from fl_lightning.data.federated import ClientData, FederatedDataModule, RoundLoader
from fl_lightning.data.fedprox_synthetic import FedProxSyntheticData  # registers "fedprox_synthetic"
from fl_lightning.data.leaf import LeafData  # registers the "leaf" dataset
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
from fl_lightning.data.shakespeare import ShakespeareData  # registers the "shakespeare" dataset
from fl_lightning.data.transforms import (
    ClientTransform,
    GaussianNoise,
    LabelNoise,
    LabelPermutation,
    Rotation,
    list_transforms,
)

__all__ = [
    "IID",
    "ClientData",
    "ClientTransform",
    "DatasetSplits",
    "Dirichlet",
    "DirichletWithReplacement",
    "FedProxSyntheticData",
    "FederatedDataModule",
    "GaussianNoise",
    "LabelNoise",
    "LabelPermutation",
    "LabelQuantity",
    "LeafData",
    "MixedSkew",
    "NaturalUsers",
    "Partitioner",
    "Pathological",
    "PathologicalWithReplacement",
    "QuantitySkew",
    "Rotation",
    "RoundLoader",
    "ShakespeareData",
    "list_datasets",
    "list_partitioners",
    "list_transforms",
    "load_dataset",
    "register_dataset",
]
