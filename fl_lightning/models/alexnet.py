"""The AlexNet-like CNN of the filter-decomposition paper's earlier version (Chen & Qiu, [001] Sec. 6.1).

"3 convolution layers, and the channel sizes are 64, 256, and 256, respectively. It is then followed by
two fully connected layers with ReLU activation, and the number of hidden units is 256 and 128." Its
personalised-FL numbers (Tables 2/3 of both versions) come from this network. Kernel sizes, pooling and
the classifier layer are not given; here (ours): 3×3 convs with padding 1, each followed by ReLU and 2×2
max-pooling, adaptive average pooling to ``pool × pool`` before the fully connected layers, and a last
linear layer to the classes.
"""

from __future__ import annotations

from torch import Tensor, nn

from fl_lightning.models.registry import register_model


@register_model("alexnet_cnn")
class AlexNetCNN(nn.Module):
    """``[conv3 → ReLU → pool2] × 3 → adaptive pool → fc → ReLU → fc → ReLU → fc``.

    Args:
        in_channels: Input channels (3 for CIFAR / Tiny-ImageNet, 1 for digits).
        num_classes: Output logits (200 for Tiny-ImageNet).
        widths: Channels of the three convs (paper: 64, 256, 256).
        hidden: Widths of the two hidden fully connected layers (paper: 256, 128).
        pool: Side of the adaptive average pooling before the fully connected layers (2: 4 positions).
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 200,
        widths: tuple[int, int, int] = (64, 256, 256),
        hidden: tuple[int, int] = (256, 128),
        pool: int = 2,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        layers: list[nn.Module] = []
        channels = in_channels
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(pool), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(channels * pool * pool, hidden[0]),
            nn.ReLU(inplace=True),
            nn.Linear(hidden[0], hidden[1]),
            nn.ReLU(inplace=True),
            nn.Linear(hidden[1], num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
