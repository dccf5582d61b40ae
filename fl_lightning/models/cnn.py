"""Small convolutional networks for the embedded digits data and MNIST-size images."""

from __future__ import annotations

from torch import Tensor, nn

from fl_lightning.models.registry import register_model


@register_model("small_cnn")
class SmallCNN(nn.Module):
    """Two 3×3 conv layers and a two-layer head; the default model of the zero-config run.

    ``conv(in→w) → ReLU → maxpool2 → conv(w→2w) → ReLU → adaptive-avgpool(2×2) → fc(8w→hidden)
    → ReLU → fc(hidden→classes)``. Works for any input size ≥ 4×4 (8×8 digits, 28×28 MNIST,
    32×32 CIFAR); no normalisation layers, so it has no buffers.

    Args:
        in_channels: Input image channels (1 for digits/MNIST, 3 for CIFAR).
        num_classes: Output logits.
        width: Channels of the first conv layer (the second has ``2*width``).
        hidden: Width of the hidden fully connected layer.
    """

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, width: int = 32, hidden: int = 128
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(8 * width, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


@register_model("mlp")
class MLP(nn.Module):
    """A fully connected network on flattened inputs (the classic FL "2NN" family).

    Args:
        in_features: Flattened input size (64 for 8×8 digits, 784 for MNIST).
        num_classes: Output logits.
        hidden: Sizes of the hidden layers.
    """

    def __init__(
        self, in_features: int = 64, num_classes: int = 10, hidden: tuple[int, ...] = (200, 200)
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        prev = in_features
        for h in hidden:
            layers += [nn.Linear(prev, h), nn.ReLU(inplace=True)]
            prev = h
        layers.append(nn.Linear(prev, num_classes))
        self.net = nn.Sequential(*layers)
        self.num_classes = num_classes

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
