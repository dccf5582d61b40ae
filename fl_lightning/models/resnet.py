"""ResNet-18 with GroupNorm (ResNet-18-GN), the model of the FedSMOO / FedDyn-family experiments."""

from __future__ import annotations

from functools import partial

from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from fl_lightning.errors import ConfigError
from fl_lightning.models.registry import register_model


@register_model("resnet18_gn")
class ResNet18GN(ResNet):
    """torchvision's ResNet-18 with every BatchNorm replaced by ``GroupNorm(groups, C)``.

    FedSMOO paper (Sun et al., 2023), Sec. 5.1: "ResNet-18 ... implemented in PyTorch official
    model-zoo" with Batch Normalization replaced by Group Normalization (Hsieh et al., 2020), so the
    model has no running statistics to aggregate. As in the reference code: the torchvision
    (ImageNet) stem is kept (7×7/2 conv and 3×3/2 max-pool, also on 32×32 CIFAR images), every norm
    layer including ``bn1`` and the three ``downsample[1]`` is ``GroupNorm(2, C)``, random init, and
    the head is ``Linear(512, num_classes)``. It has no buffers (``state_dict`` = parameters) and
    11,181,642 parameters for 10 classes, 11,227,812 for 100 (spec P16). The layer names are
    torchvision's (``conv1``, ``layer1.0.bn1``, ..., ``fc``).

    Args:
        num_classes: Output logits (10 for CIFAR-10, 100 for CIFAR-100).
        in_channels: Input image channels (the stem conv takes them).
        groups: GroupNorm groups of every norm layer (must divide 64).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, groups: int = 2) -> None:
        if groups < 1 or 64 % groups:
            raise ConfigError(
                f"model.client.init_args.net.init_args.groups={groups} must divide 64 (the narrowest "
                "layer); the paper uses 2"
            )
        super().__init__(
            BasicBlock, [2, 2, 2, 2], num_classes=num_classes, norm_layer=partial(nn.GroupNorm, groups)
        )
        if in_channels != 3:
            self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
            nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.groups = groups
