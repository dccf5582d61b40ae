"""``lazy_default`` gives what ``jsonargparse.lazy_instance`` gives, without its stack inspection."""

from __future__ import annotations

import sys
import time

import torch
from jsonargparse import lazy_instance

from fl_lightning.data.partition import Dirichlet
from fl_lightning.defaults import lazy_default
from fl_lightning.models.cnn import SmallCNN


def test_the_same_lazy_instance_as_jsonargparse() -> None:
    ours = lazy_default(Dirichlet, alpha=0.25)
    theirs = lazy_instance(Dirichlet, alpha=0.25)
    assert type(ours) is type(theirs)  # the same class on this module: lazy_instance found the one we made
    assert type(ours).__module__ == __name__ and sys.modules[__name__].LazyInstance_Dirichlet is type(ours)
    assert ours.lazy_get_init_data() == theirs.lazy_get_init_data()
    assert ours._args() == Dirichlet(alpha=0.25)._args()  # __init__ ran at the first method call


def test_a_lazy_network_is_built_at_its_first_method_call() -> None:
    net = lazy_default(SmallCNN, in_channels=1, num_classes=3)
    assert net.lazy_get_init_data().init_args.num_classes == 3
    assert net(torch.zeros(2, 1, 8, 8)).shape == (2, 3)


def test_it_does_not_inspect_the_stack() -> None:
    """lazy_instance reads every frame's source: deep in an import of torch it took 0.7 s a call."""
    start = time.perf_counter()
    for _ in range(20):
        lazy_default(Dirichlet, alpha=0.5)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(20):
        lazy_instance(Dirichlet, alpha=0.5)
    assert ours < time.perf_counter() - start
