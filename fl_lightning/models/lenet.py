"""The CNNs of the filter-decomposition paper's experiments (Chen & Qiu, ICML 2025, Sec. 6.1).

The paper names "LeNet (McMahan et al., 2017)" for CIFAR-10/100 and a pre-trained ResNet-18 for
Tiny-ImageNet without layer details; the authors build on the FedRep code, whose CIFAR CNNs are the
defaults here (``../shared/spec/filter-decomposition.md`` §6.1, marked [EXTERNAL] there):

* CIFAR-10 ``CNNCifar``: ``LeNet()`` — 307,842 parameters (239,684 decomposed with ``m_a = 9``).
* CIFAR-100 ``CNNCifar100``: ``LeNet(num_classes=100, widths=(64, 128), hidden=(256, 128))`` —
  1,075,044 parameters (941,350 decomposed).
"""

from __future__ import annotations

from torch import Tensor, nn

from fl_lightning.errors import ConfigError
from fl_lightning.models.registry import register_model


@register_model("lenet")
class LeNet(nn.Module):
    """``conv5 → ReLU → pool2 → conv5 → ReLU → pool2 → fc → ReLU → fc → ReLU → dropout → fc``.

    Args:
        in_channels: Input channels (3 for CIFAR, 1 for digits/MNIST).
        num_classes: Output logits.
        widths: Channels of the two 5×5 convs.
        hidden: Widths of the two hidden fully connected layers.
        dropout: Dropout before the last layer (FedRep: 0.6).
        input_size: Side of the (square) input images, for the flattened feature size.
        padding: Padding of the convs (0 as in FedRep for 32×32 CIFAR; 2 keeps 8×8 digits).
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        widths: tuple[int, int] = (64, 64),
        hidden: tuple[int, int] = (120, 64),
        dropout: float = 0.6,
        input_size: int = 32,
        padding: int = 0,
    ) -> None:
        super().__init__()
        side = input_size
        for _ in range(2):
            side = (side + 2 * padding - 4) // 2
        if side < 1:
            raise ConfigError(
                f"model.client.init_args.net.init_args.input_size={input_size} is too small for two 5x5 "
                f"convs with padding={padding}; use padding: 2 for 8x8 images"
            )
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 5, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(widths[0], widths[1], 5, padding=padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(widths[1] * side * side, hidden[0]),
            nn.ReLU(inplace=True),
            nn.Linear(hidden[0], hidden[1]),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden[1], num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
