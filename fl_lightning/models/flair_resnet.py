"""torchvision's ImageNet-style ResNet-18 with a task head (FLAIR: 17 sigmoid outputs, FedCOG Sec. 6.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from torch import Tensor, nn

from fl_lightning.errors import ConfigError
from fl_lightning.models.registry import register_model


@register_model("torchvision_resnet18")
class TorchvisionResNet18(nn.Module):
    """``torchvision.models.resnet18`` (7×7 stem, max-pool, four stages, global pool) with a new head.

    The network FedCOG uses on FLAIR ("ResNet18 from the PyTorch API", 17 outputs trained with a
    sigmoid and binary cross-entropy via ``ClientModule(task="multilabel")``). Its representation (for
    MOON/FedDecorr) is the 512-d input of ``fc``.

    Args:
        num_classes: Outputs of the head (17 for FLAIR's coarse labels).
        in_channels: Input channels (the stem is rebuilt when not 3).
        norm: ``"batch"`` (torchvision's default, as FedCOG; running statistics are buffers and are
            averaged like weights) or ``"group"`` (``GroupNorm(2, C)``, FLAIR's from-scratch and
            differential-privacy setting; no buffers).
        pretrained: Start from torchvision's ImageNet weights (``IMAGENET1K_V1``; needs the weights
            file or network); the head is new either way. FedCOG does not say; its code uses False.
    """

    def __init__(
        self,
        num_classes: int = 17,
        in_channels: int = 3,
        norm: Literal["batch", "group"] = "batch",
        pretrained: bool = False,
    ) -> None:
        super().__init__()
        from torchvision.models import resnet18

        if norm not in ("batch", "group"):
            raise ConfigError(f"model.client.net.norm={norm!r} must be 'batch' or 'group'")
        if pretrained and norm != "batch":
            raise ConfigError(
                "model.client.net.pretrained=true needs norm='batch' (the ImageNet weights use BN)"
            )
        layer = nn.BatchNorm2d if norm == "batch" else (lambda c: nn.GroupNorm(2, c))
        try:
            net = resnet18(weights="IMAGENET1K_V1" if pretrained else None, norm_layer=layer)
        except OSError as err:  # urllib's URLError (offline, proxy, DNS) is an OSError
            raise ConfigError(_weights_error(err)) from err
        if in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        net.fc = nn.Linear(net.fc.in_features, num_classes)
        self.net = net
        self.num_classes = num_classes

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def _weights_error(err: OSError) -> str:
    """One line for ImageNet weights torch.hub could not download: where to put the file, or do without."""
    import torch.hub
    from torchvision.models import ResNet18_Weights

    url = ResNet18_Weights.IMAGENET1K_V1.url
    folder = Path(torch.hub.get_dir()) / "checkpoints"
    reason = " ".join(str(getattr(err, "reason", None) or err).split())
    return (
        f"pretrained=True: torchvision's ImageNet weights could not be downloaded ({reason}); put "
        f"{url.rpartition('/')[2]} (from {url}) in {folder} (torch.hub's folder; set TORCH_HOME to use "
        "another), or set pretrained: false"
    )
