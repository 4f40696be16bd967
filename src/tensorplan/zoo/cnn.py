"""Classic CNNs in plain PyTorch (no torchvision on this machine): ResNet-50,
MobileNetV2, VGG-16 and PoseNet (MobileNetV1 backbone)."""
from __future__ import annotations

import torch
from torch import nn

from tensorplan.zoo._registry import register


def conv_bn(cin: int, cout: int, k: int, s: int = 1, groups: int = 1, act: type | None = nn.ReLU,
            p: int | None = None) -> nn.Sequential:
    """Conv (no bias) + BatchNorm + optional activation; BN folds into the conv at export."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, s, k // 2 if p is None else p, groups=groups,
                                         bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- ResNet-50
class _Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride, "v1.5"), 1x1 expand, projection shortcut when shapes change."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                  conv_bn(width, cout, 1, act=None))
        self.short = (conv_bn(cin, cout, 1, stride, act=None)
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class ResNet50(nn.Module):
    def __init__(self):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(_Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.features = nn.Sequential(*layers)

    def forward(self, x):
        return self.features(x).mean(dim=(2, 3))


@register("resnet-50", description="ResNet-50 v1.5 trunk + global average pool (2048 features, no classifier)",
          input_shapes={"input": (1, 3, 224, 224)}, tags={"cnn", "baseline"}, family="cnn",
          source="He et al., Deep Residual Learning, CVPR'16 (stride on 3x3 as in torchvision/HF ResNetModel); "
                 "headless like transformers.ResNetModel, matching the 23.51M-parameter baseline")
def resnet50() -> nn.Module:
    return ResNet50()


# --------------------------------------------------------------------------- MobileNetV2
class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int):
        super().__init__()
        hid = cin * t
        layers: list[nn.Module] = [] if t == 1 else [conv_bn(cin, hid, 1, act=nn.ReLU6)]
        layers += [conv_bn(hid, hid, 3, stride, groups=hid, act=nn.ReLU6), conv_bn(hid, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.res = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.res else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                           (6, 160, 3, 2), (6, 320, 1, 1)):
            for i in range(n):
                layers.append(_InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(2, 3)))


@register("mobilenet-v2", description="MobileNetV2 1.0 with the 1000-class classifier",
          input_shapes={"input": (1, 3, 224, 224)}, tags={"cnn", "baseline", "mobile"}, family="cnn",
          source="Sandler et al., MobileNetV2, CVPR'18 (torchvision layout)")
def mobilenet_v2() -> nn.Module:
    return MobileNetV2()


# --------------------------------------------------------------------------- VGG-16
class VGG16(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU()]
                cin = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                                        nn.ReLU(), nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


@register("vgg-16", description="VGG-16 (configuration D) with its three fully connected layers",
          input_shapes={"input": (1, 3, 224, 224)}, tags={"cnn", "codl"}, family="cnn",
          source="Simonyan & Zisserman, Very Deep Convolutional Networks, ICLR'15; CoDL evaluation model")
def vgg16() -> nn.Module:
    return VGG16()


# --------------------------------------------------------------------------- PoseNet
class PoseNet(nn.Module):
    """MobileNetV1 1.0 (output stride 32) with PoseNet's four 1x1 heads: 17 keypoint heatmaps,
    34 offsets, 32 forward and 32 backward displacements (16 skeleton edges x 2)."""

    def __init__(self):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for cout, s in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1),
                        (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)):
            layers += [conv_bn(cin, cin, 3, s, groups=cin, act=nn.ReLU6), conv_bn(cin, cout, 1, act=nn.ReLU6)]
            cin = cout
        self.backbone = nn.Sequential(*layers)
        self.heatmaps = nn.Conv2d(1024, 17, 1)
        self.offsets = nn.Conv2d(1024, 34, 1)
        self.disp_fwd = nn.Conv2d(1024, 32, 1)
        self.disp_bwd = nn.Conv2d(1024, 32, 1)

    def forward(self, x):
        f = self.backbone(x)
        return self.heatmaps(f), self.offsets(f), self.disp_fwd(f), self.disp_bwd(f)


@register("posenet", description="PoseNet: MobileNetV1 1.0 backbone (stride 32) + heatmap/offset/displacement heads",
          input_shapes={"input": (1, 3, 257, 257)}, tags={"cnn", "codl", "mobile"}, family="pose",
          source="Papandreou et al., PersonLab, ECCV'18 as shipped in TFLite/TF.js PoseNet "
                 "(posenet_mobilenet_v1_100_257x257_multi_kpt): 27 backbone convs + 4 heads = the 31 conv "
                 "shapes CoDL lists for PoseNet",
          output_names=("heatmaps", "offsets", "displacement_fwd", "displacement_bwd"))
def posenet() -> nn.Module:
    return PoseNet()
