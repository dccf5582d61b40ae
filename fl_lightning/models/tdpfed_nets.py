"""The networks of TDPFed's experiments (Wang et al., Sec. VII-A, Table I), dense or CP-factored.

``DNN``: fc 784x100 -> ReLU -> fc 100x10 (MNIST). ``VGG8``: five 3x3 convs 3->32->64->128->256->256 and
three fc layers 256->256->256->10 (CIFAR-10). With ``ratio`` (1.5 or 2.0) every layer is CP-factored at
the Table I rank ``round(prod I_n / (ratio * sum I_n))``; the factor counts are then exactly the
paper's (DNN 52,816 / 39,446; VGG8 740,276 / 555,487; biases, 110 / 1,258, kept dense and not counted).
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.models.cp import tensorize
from fl_lightning.models.registry import register_model


@register_model("dnn")
class DNN(nn.Module):
    """TDPFed's MNIST network: ``flatten -> fc1 (in x hidden) -> ReLU -> fc2 (hidden x classes)``.

    PyTorch's default initialisation (the paper does not give one).

    Args:
        in_features: Flattened input size (784 for MNIST, 64 for the 8x8 digits).
        hidden: Hidden units (100 in the paper).
        num_classes: Output logits.
        ratio: CP compression ratio of every layer (1.5 or 2.0 in Table I); None: dense.
        ranks: Per-layer CP ranks (``{"fc1": 44, "fc2": 5}``), overriding ``ratio``.
        init: Factor initialisation, ``"random"`` or ``"als"`` (:func:`~fl_lightning.models.cp.tensorize`).
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden: int = 100,
        num_classes: int = 10,
        ratio: float | None = None,
        ranks: dict[str, int] | None = None,
        init: Literal["random", "als"] = "random",
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(in_features, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, num_classes)
        tensorize(self, ratio, ranks, init, field="model.client.init_args.net.init_args")

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.relu(self.fc1(self.flatten(x))))


@register_model("vgg8")
class VGG8(nn.Module):
    """TDPFed's CIFAR-10 network: five 3x3 convs (padding 1, ReLU, 2x2 max-pool) and three fc layers.

    The paper gives only the layer sizes (Table I); the rest is this implementation's choice
    (spec §5): padding 1, a 2x2 max-pool after each conv while the feature map is larger than 1x1
    (32 -> 16 -> 8 -> 4 -> 2 -> 1, so fc1 takes ``widths[-1]`` features), ReLU, no BatchNorm or dropout,
    Kaiming-normal (fan-in, ReLU) weights and zero biases.

    Args:
        in_channels: Input channels (3 for CIFAR-10).
        num_classes: Output logits.
        widths: Output channels of the five convs.
        hidden: Width of the two hidden fc layers.
        input_size: Input height/width (32 for CIFAR-10, 8 for the digits).
        ratio: CP compression ratio of every layer (1.5 or 2.0); None: dense.
        ranks: Per-layer CP ranks by name (``conv1..conv5``, ``fc1..fc3``), overriding ``ratio``.
        init: Factor initialisation, ``"random"`` or ``"als"``.
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        widths: tuple[int, int, int, int, int] = (32, 64, 128, 256, 256),
        hidden: int = 256,
        input_size: int = 32,
        ratio: float | None = None,
        ranks: dict[str, int] | None = None,
        init: Literal["random", "als"] = "random",
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.pools: list[bool] = []
        size, prev = input_size, in_channels
        for i, w in enumerate(widths, start=1):
            self.add_module(f"conv{i}", nn.Conv2d(prev, w, 3, padding=1))
            self.pools.append(size > 1)
            size = size // 2 if size > 1 else size
            prev = w
        self.fc1 = nn.Linear(prev * size * size, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
        tensorize(self, ratio, ranks, init, field="model.client.init_args.net.init_args")

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for i, pool in enumerate(self.pools, start=1):
            h = F.relu(getattr(self, f"conv{i}")(h))
            if pool:
                h = F.max_pool2d(h, 2)
        h = h.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(h)))))
