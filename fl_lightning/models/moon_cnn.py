"""The simple CNNs of MOON (Li et al., 2021) as used by FedCOG (Ye et al., 2024, Appendix A.2.1).

Parameter counts (tested): CIFAR-10 ``MoonCNN(3, 10, 32)`` 62,006; Fashion-MNIST ``MoonCNN(1, 10, 28)``
44,426; CIFAR-100 ``MoonCNN100()`` 69,380 (the count FedCOG's Appendix A.4.3 states). No normalisation
layers and no dropout, so they have no buffers and a forward pass is the same in train and eval mode.
"""

from __future__ import annotations

from torch import Tensor, nn

from fl_lightning.errors import ConfigError
from fl_lightning.models.registry import register_model


@register_model("moon_cnn")
class MoonCNN(nn.Module):
    """LeNet-style CNN for Fashion-MNIST and CIFAR-10 (MOON's "simple CNN").

    ``conv5x5(in→6) → ReLU → maxpool2 → conv5x5(6→16) → ReLU → maxpool2 → fc(16·s·s→120) → ReLU
    → fc(120→84) → ReLU → fc(84→classes)`` with ``s = ((input_size - 4) // 2 - 4) // 2`` (5 for 32×32,
    4 for 28×28). The representation used by MOON/FedDecorr is the 84-d input of the last layer.

    Args:
        in_channels: Image channels (1 for Fashion-MNIST, 3 for CIFAR-10).
        num_classes: Output logits.
        input_size: Height = width of the input images (at least 16).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, input_size: int = 32) -> None:
        super().__init__()
        side = ((input_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ConfigError(
                f"model.client.net.input_size={input_size} is too small for MoonCNN (two 5x5 convs and "
                "two pools need >= 16); use SmallCNN for 8x8 digits"
            )
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(84, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


@register_model("moon_cnn100")
class MoonCNN100(nn.Module):
    """FedCOG's CIFAR-100 CNN: three 3×3 conv blocks and two fully connected layers.

    ``conv3x3(in→16) → ReLU → maxpool2 → conv3x3(16→32) → ReLU → maxpool2 → conv3x3(32→64) → ReLU
    → maxpool2 → fc(64·2·2→128) → ReLU → fc(128→classes)`` for 32×32 inputs. The paper's text omits the
    third max-pool; the official code has it, and only with it the count is the stated 69,380.

    Args:
        in_channels: Image channels.
        num_classes: Output logits.
        input_size: Height = width of the input images (at least 22).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 100, input_size: int = 32) -> None:
        super().__init__()
        side = (((input_size - 2) // 2 - 2) // 2 - 2) // 2
        if side < 1:
            raise ConfigError(
                f"model.client.net.input_size={input_size} is too small for MoonCNN100 (needs >= 22)"
            )
        self.in_channels = in_channels
        self.num_classes = num_classes
        layers: list[nn.Module] = []
        prev = in_channels
        for width in (16, 32, 64):
            layers += [nn.Conv2d(prev, width, 3), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            prev = width
        self.features = nn.Sequential(
            *layers, nn.Flatten(), nn.Linear(64 * side * side, 128), nn.ReLU(inplace=True)
        )
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
