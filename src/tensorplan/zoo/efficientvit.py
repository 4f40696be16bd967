"""EfficientViT-B1 (MIT Han lab): MBConv stages, then stages of lite multi-scale
ReLU linear attention + MBConv, hardswish activations, classification head."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from tensorplan.zoo._registry import register


def _conv(cin, cout, k=1, s=1, groups=1, bias=False, norm=True, act=True):
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=bias)]
    if norm:
        layers.append(nn.BatchNorm2d(cout))
    if act:
        layers.append(nn.Hardswish())
    return nn.Sequential(*layers)


class _DSConv(nn.Module):
    """Depthwise 3x3 (BN, hardswish) + pointwise 1x1 (BN), residual when shapes match."""

    def __init__(self, cin, cout, s=1):
        super().__init__()
        self.body = nn.Sequential(_conv(cin, cin, 3, s, groups=cin), _conv(cin, cout, act=False))
        self.res = s == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.res else self.body(x)


class _MBConv(nn.Module):
    """Inverted bottleneck: 1x1 expand, depthwise 3x3, 1x1 project (BN, no activation).
    `fewer_norm` (used in the attention stages) drops BN from expand/depthwise and gives them a bias."""

    def __init__(self, cin, cout, s=1, expand=4, fewer_norm=False, residual=True):
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(
            _conv(cin, mid, 1, bias=fewer_norm, norm=not fewer_norm),
            _conv(mid, mid, 3, s, groups=mid, bias=fewer_norm, norm=not fewer_norm),
            _conv(mid, cout, 1, act=False))
        self.res = residual and s == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.res else self.body(x)


class _LiteMLA(nn.Module):
    """Lite multi-scale linear attention: 1x1 qkv, a 5x5 depthwise + grouped 1x1 aggregation for a
    second scale, ReLU kernel linear attention per head (dim 16), 1x1 projection with BN."""

    def __init__(self, c: int, dim: int = 16, scales=(5,), eps: float = 1e-15):
        super().__init__()
        heads = c // dim
        total = heads * dim
        self.dim, self.eps = dim, eps
        self.qkv = _conv(c, 3 * total, norm=False, act=False)
        self.aggreg = nn.ModuleList([
            nn.Sequential(nn.Conv2d(3 * total, 3 * total, k, padding=k // 2, groups=3 * total, bias=False),
                          nn.Conv2d(3 * total, 3 * total, 1, groups=3 * heads, bias=False))
            for k in scales])
        self.proj = _conv(total * (1 + len(scales)), c, act=False)

    def forward(self, x):
        b, _, h, w = x.shape
        qkv = self.qkv(x)
        qkv = torch.cat([qkv] + [op(qkv) for op in self.aggreg], 1)
        qkv = qkv.reshape(b, -1, 3 * self.dim, h * w).transpose(-1, -2)
        d = self.dim
        q, k, v = F.relu(qkv[..., :d]), F.relu(qkv[..., d:2 * d]), qkv[..., 2 * d:]
        v = F.pad(v, (0, 1), value=1.0)  # ones column: the matmul also yields the normaliser
        out = q @ (k.transpose(-1, -2) @ v)
        out = out[..., :-1] / (out[..., -1:] + self.eps)
        out = out.transpose(-1, -2).reshape(b, -1, h, w)
        return self.proj(out)


class _EViTBlock(nn.Module):
    def __init__(self, c: int, dim: int = 16, expand: int = 4):
        super().__init__()
        self.context = _LiteMLA(c, dim)
        self.local = _MBConv(c, c, 1, expand, fewer_norm=True)

    def forward(self, x):
        x = x + self.context(x)
        return self.local(x)  # residual inside


class EfficientViTB1(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        w, depth = [16, 32, 64, 128, 256], [1, 2, 3, 3, 4]
        layers: list[nn.Module] = [_conv(3, w[0], 3, 2)]
        layers += [_DSConv(w[0], w[0]) for _ in range(depth[0])]
        cin = w[0]
        for wi, di in zip(w[1:3], depth[1:3]):  # MBConv stages
            for i in range(di):
                layers.append(_MBConv(cin, wi, 2 if i == 0 else 1, 4))
                cin = wi
        for wi, di in zip(w[3:], depth[3:]):  # attention stages
            layers.append(_MBConv(cin, wi, 2, 4, fewer_norm=True, residual=False))
            cin = wi
            layers += [_EViTBlock(wi) for _ in range(di)]
        self.backbone = nn.Sequential(*layers)
        self.head_conv = _conv(w[-1], 1536)
        self.head_fc = nn.Sequential(nn.Linear(1536, 1600, bias=False), nn.LayerNorm(1600), nn.Hardswish(),
                                     nn.Linear(1600, num_classes))

    def forward(self, x):
        x = self.head_conv(self.backbone(x)).mean(dim=(2, 3))
        return self.head_fc(x)


@register("efficientvit-b1", description="EfficientViT-B1: MBConv stages + lite multi-scale ReLU linear "
          "attention stages, hardswish, classification head (1536/1600)",
          input_shapes={"input": (1, 3, 512, 512)}, tags={"korch", "transformer", "vision"},
          family="transformer",
          source="Cai et al., EfficientViT: Multi-Scale Linear Attention for High-Resolution Dense Prediction, "
                 "ICCV'23 (B1: widths 16-256, depths 1/2/3/3/4, head dim 16); Korch evaluates an EfficientViT "
                 "with the same ReLU linear attention")
def efficientvit_b1() -> nn.Module:
    return EfficientViTB1()
