"""The model registry: names for scripts and tests (``create_model("small_cnn")``), listed by the CLI."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from fl_lightning.errors import ConfigError

MODELS: dict[str, type[nn.Module]] = {}


def register_model(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator registering a model class under ``name`` (listed by :func:`list_models`)."""

    def wrap(cls: type[nn.Module]) -> type[nn.Module]:
        MODELS[name] = cls
        return cls

    return wrap


def list_models() -> list[str]:
    """Names of all registered models."""
    return sorted(MODELS)


def create_model(name: str, **kwargs: object) -> nn.Module:
    """Instantiate a registered model by name."""
    if name not in MODELS:
        raise ConfigError(f"model name {name!r} is not registered; choose one of {', '.join(list_models())}")
    return MODELS[name](**kwargs)
