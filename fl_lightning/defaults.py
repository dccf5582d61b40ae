"""Constructor defaults that ``--print_config`` shows as classes: jsonargparse lazy instances, made cheaply.

``jsonargparse.lazy_instance`` finds its caller's module with ``inspect.stack()``, which reads the source
line of every frame on the stack and, for each frame of a frozen import module, searches all of
``sys.modules``: under an import of torch and Lightning (thousands of modules, a deep stack of import
frames) the package's four defaults cost about 1.2 s of every ``import fl_lightning`` (``import
fl_lightning.flower.client_app``: 7.0-8.4 s before, 6.2-7.0 s after, three runs each on the benchmarks'
machine): the start of every ``fit``, and of every message under a Flower node's ``subprocess`` isolation.
:func:`lazy_default` builds the same lazy instance (jsonargparse's lazy class, named and attached to the
caller's module as ``lazy_instance`` does) with the caller's module taken from its frame. It relies on
jsonargparse's ``_LazyInitBaseClass`` (the base of ``lazy_instance``'s classes; pyproject.toml pins
jsonargparse below 5); ``tests/test_defaults.py`` checks it against ``lazy_instance``.
"""

from __future__ import annotations

import inspect
import sys
from typing import TypeVar

from jsonargparse.typing import _LazyInitBaseClass

T = TypeVar("T")


def lazy_default(class_type: type[T], **kwargs: object) -> T:
    """What ``jsonargparse.lazy_instance(class_type, **kwargs)`` returns: an instance of ``class_type`` whose
    ``__init__`` runs at its first method call and whose ``lazy_get_init_data()`` gives the config."""
    caller = inspect.currentframe().f_back  # type: ignore[union-attr]
    module = sys.modules[caller.f_globals["__name__"]]  # type: ignore[union-attr]
    name = f"LazyInstance_{class_type.__name__}"
    lazy_class = getattr(module, name, None)
    if lazy_class is None:
        lazy_class = type(
            name,
            (_LazyInitBaseClass, class_type),
            {"__doc__": f"Class for lazy instances of {class_type}", "__module__": module.__name__},
        )
        setattr(module, name, lazy_class)
    return lazy_class(class_type, kwargs)
