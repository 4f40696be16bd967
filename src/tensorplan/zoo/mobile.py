"""More mobile CNNs in plain PyTorch: MobileNetV3-Large and ShuffleNetV2 1.0x.

Why: they bring kernel kinds the other zoo networks lack or have few of (hardswish/hardsigmoid
squeeze-excite, 5x5 depthwise convolutions, channel split + shuffle = reshape/transpose/concat),
so the CDMPP dataset covers more of what unseen mobile networks contain.
"""
from __future__ import annotations

import torch
from torch import nn

from tensorplan.zoo._registry import register
from tensorplan.zoo.cnn import conv_bn


def _divisible(v: float, d: int = 8) -> int:
    """Round channels to a multiple of d, never more than 10% below v (MobileNet rule)."""
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


# --------------------------------------------------------------------------- MobileNetV3
class _SqueezeExcite(nn.Module):
    """Global pool, 1x1 reduce + ReLU, 1x1 expand + hardsigmoid, channel scale."""

    def __init__(self, c: int):
        super().__init__()
        mid = _divisible(c / 4)
        self.fc1, self.fc2 = nn.Conv2d(c, mid, 1), nn.Conv2d(mid, c, 1)

    def forward(self, x):
        s = x.mean(dim=(2, 3), keepdim=True)
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


class _V3Block(nn.Module):
    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, hs: bool, s: int):
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = [] if exp == cin else [conv_bn(cin, exp, 1, act=act)]
        layers.append(conv_bn(exp, exp, k, s, groups=exp, act=act))
        if se:
            layers.append(_SqueezeExcite(exp))
        layers.append(conv_bn(exp, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.res = s == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.res else self.body(x)


# (kernel, expansion, out, squeeze-excite, hardswish, stride): Howard et al. Table 1.
_V3_LARGE = ((3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2), (3, 72, 24, False, False, 1),
             (5, 72, 40, True, False, 2), (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
             (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1), (3, 184, 80, False, True, 1),
             (3, 184, 80, False, True, 1), (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
             (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1), (5, 960, 160, True, True, 1))


class MobileNetV3Large(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)]
        cin = 16
        for k, exp, cout, se, hs, s in _V3_LARGE:
            layers.append(_V3Block(cin, k, exp, cout, se, hs, s))
            cin = cout
        layers.append(conv_bn(cin, 960, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(), nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(2, 3)))


@register("mobilenet-v3-large", description="MobileNetV3-Large 1.0 with the 1000-class classifier "
          "(hardswish, hardsigmoid squeeze-excite, 3x3/5x5 depthwise)",
          input_shapes={"input": (1, 3, 224, 224)}, tags={"cnn", "mobile"}, family="cnn",
          source="Howard et al., Searching for MobileNetV3, ICCV'19 (Table 1, torchvision layout)")
def mobilenet_v3_large() -> nn.Module:
    return MobileNetV3Large()


# --------------------------------------------------------------------------- ShuffleNetV2
def _shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.reshape(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class _ShuffleUnit(nn.Module):
    """Stride 1: split channels, transform one half, concat, shuffle. Stride 2: two branches."""

    def __init__(self, cin: int, cout: int, s: int):
        super().__init__()
        half = cout // 2
        self.s = s
        bin_ = cin if s == 2 else half
        self.main = nn.Sequential(conv_bn(bin_, half, 1), conv_bn(half, half, 3, s, groups=half, act=None),
                                  conv_bn(half, half, 1))
        self.side = (nn.Sequential(conv_bn(cin, cin, 3, s, groups=cin, act=None), conv_bn(cin, half, 1))
                     if s == 2 else None)

    def forward(self, x):
        if self.side is None:
            a, b = x.chunk(2, dim=1)
            out = torch.cat([a, self.main(b)], dim=1)
        else:
            out = torch.cat([self.side(x), self.main(x)], dim=1)
        return _shuffle(out)


class ShuffleNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, widths=(116, 232, 464), repeats=(4, 8, 4)):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)]
        cin = 24
        for c, n in zip(widths, repeats):
            for i in range(n):
                layers.append(_ShuffleUnit(cin, c, 2 if i == 0 else 1))
                cin = c
        layers.append(conv_bn(cin, 1024, 1))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


@register("shufflenet-v2", description="ShuffleNetV2 1.0x with the 1000-class classifier "
          "(channel split, concat, reshape/transpose channel shuffle)",
          input_shapes={"input": (1, 3, 224, 224)}, tags={"cnn", "mobile"}, family="cnn",
          source="Ma et al., ShuffleNet V2, ECCV'18 (Table 5 1.0x, torchvision layout)")
def shufflenet_v2() -> nn.Module:
    return ShuffleNetV2()
