"""Fast style transfer ("candy"): the TransformerNet behind the ONNX-zoo candy-9 model."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from tensorplan.zoo._registry import register


class _ConvLayer(nn.Module):
    """Reflection pad by k//2, then a conv: keeps borders free of zero-padding artefacts."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, upsample: int | None = None):
        super().__init__()
        self.upsample = upsample
        self.pad = nn.ReflectionPad2d(k // 2)
        self.conv = nn.Conv2d(cin, cout, k, stride)

    def forward(self, x):
        if self.upsample:
            x = F.interpolate(x, scale_factor=self.upsample, mode="nearest")
        return self.conv(self.pad(x))


class _Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.c1, self.in1 = _ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True)
        self.c2, self.in2 = _ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True)

    def forward(self, x):
        return x + self.in2(self.c2(F.relu(self.in1(self.c1(x)))))


class TransformerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.ModuleList([_ConvLayer(3, 32, 9), _ConvLayer(32, 64, 3, 2), _ConvLayer(64, 128, 3, 2)])
        self.down_norm = nn.ModuleList([nn.InstanceNorm2d(c, affine=True) for c in (32, 64, 128)])
        self.res = nn.Sequential(*[_Residual(128) for _ in range(5)])
        self.up = nn.ModuleList([_ConvLayer(128, 64, 3, upsample=2), _ConvLayer(64, 32, 3, upsample=2)])
        self.up_norm = nn.ModuleList([nn.InstanceNorm2d(c, affine=True) for c in (64, 32)])
        self.out = _ConvLayer(32, 3, 9)

    def forward(self, x):
        for conv, norm in zip(self.down, self.down_norm):
            x = F.relu(norm(conv(x)))
        x = self.res(x)
        for conv, norm in zip(self.up, self.up_norm):
            x = F.relu(norm(conv(x)))
        return self.out(x)


def _randomize_affine(m: nn.Module) -> nn.Module:
    """Fresh InstanceNorm affine params are 1/0; randomize so the scale/shift is not a no-op."""
    for mod in m.modules():
        if isinstance(mod, nn.InstanceNorm2d) and mod.affine:
            with torch.no_grad():
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0, 0.1)
    return m


@register("candy", description="fast style transfer TransformerNet: reflection pads, 3 down convs + "
          "InstanceNorm, 5 residual blocks, 2 nearest-upsample convs + InstanceNorm, 9x9 output conv",
          input_shapes={"input": (1, 3, 224, 224)}, tags={"korch", "codl", "style", "baseline"},
          family="style",
          source="Johnson et al., Perceptual Losses, ECCV'16 with InstanceNorm (Ulyanov et al.), as in "
                 "pytorch/examples fast_neural_style and the ONNX-zoo candy-9 model (Korch's Candy, CoDL's FST)")
def candy() -> nn.Module:
    return _randomize_affine(TransformerNet())
