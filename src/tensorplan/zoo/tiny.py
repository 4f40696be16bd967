"""Tiny models for tests: each exports and runs in well under a second, and together
they cover the operators of the big models (conv/BN/pool/Gemm, attention with
LayerNorm/Softmax/GELU, depthwise conv + channels-last LayerNorm, reflection pad +
InstanceNorm + nearest upsample, SiLU/hardswish/ReLU linear attention)."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from tensorplan.zoo._registry import register

_TEST = {"test", "tiny"}


@register("tiny-cnn", description="conv-BN-ReLU x2, max-pool, global average pool, Gemm",
          input_shapes={"input": (1, 3, 32, 32)}, tags=_TEST, family="cnn",
          source="tensorplan test model")
def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


@register("tiny-mlp", description="Gemm-ReLU-Gemm-Sigmoid-Gemm-Softmax on a batch of 4",
          input_shapes={"input": (4, 64)}, tags=_TEST, family="mlp", source="tensorplan test model")
def tiny_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.Sigmoid(),
                         nn.Linear(128, 10), nn.Softmax(dim=-1))


class _Block(nn.Module):
    """Pre-norm transformer block: LayerNorm, multi-head attention, LayerNorm, GELU MLP."""

    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads
        qkv = self.qkv(self.ln1(x)).reshape(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-2, -1) * (d // h) ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


@register("tiny-attention", description="one pre-norm transformer block (LayerNorm, MatMul, Softmax, GELU)",
          input_shapes={"input": (1, 16, 32)}, tags=_TEST | {"transformer"}, family="transformer",
          source="tensorplan test model (ViT-style block)")
def tiny_attention() -> nn.Module:
    return _Block(32, 4, 64)


class _ConvNeXtish(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, stride=4)
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.ln(y)))).permute(0, 3, 1, 2)
        return x + y


@register("tiny-convnext-ish", description="depthwise 7x7 conv, channels-last LayerNorm, GELU MLP, residual",
          input_shapes={"input": (1, 3, 32, 32)}, tags=_TEST | {"transformer"}, family="cnn",
          source="tensorplan test model (ConvNeXt block, Liu et al. CVPR'22)")
def tiny_convnext() -> nn.Module:
    return _ConvNeXtish()


class _Style(nn.Module):
    def __init__(self):
        super().__init__()
        self.pad = nn.ReflectionPad2d(1)
        self.c1 = nn.Conv2d(3, 8, 3)
        self.in1 = nn.InstanceNorm2d(8, affine=True)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.c3 = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x):
        a = F.relu(self.in1(self.c1(self.pad(x))))
        b = F.interpolate(F.relu(self.c2(a)), scale_factor=2, mode="nearest")
        return self.c3(torch.cat([a, b], dim=1))


@register("tiny-style", description="reflection pad, conv, InstanceNorm, nearest upsample, concat",
          input_shapes={"input": (1, 3, 32, 32)}, tags=_TEST, family="style",
          source="tensorplan test model (fast-style-transfer operators)")
def tiny_style() -> nn.Module:
    return _Style()


class _LinAttn(nn.Module):
    """Hardswish conv stem, SiLU, and ReLU linear attention with the ones-padding trick."""

    def __init__(self, c: int = 16, d: int = 8):
        super().__init__()
        self.d = d
        self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)

    def forward(self, x):
        x = F.hardswish(self.stem(x))
        b, c, h, w = x.shape
        qkv = self.qkv(x).reshape(b, -1, 3 * self.d, h * w).transpose(-1, -2)
        q, k, v = F.relu(qkv[..., :self.d]), F.relu(qkv[..., self.d:2 * self.d]), qkv[..., 2 * self.d:]
        v = F.pad(v, (0, 1), value=1.0)
        out = q @ (k.transpose(-1, -2) @ v)
        out = out[..., :-1] / (out[..., -1:] + 1e-15)
        out = out.transpose(-1, -2).reshape(b, c, h, w)
        return x + F.silu(self.proj(out))


@register("tiny-linear-attention", description="hardswish, ReLU linear attention (EfficientViT-style), SiLU",
          input_shapes={"input": (1, 3, 32, 32)}, tags=_TEST, family="transformer",
          source="tensorplan test model (EfficientViT LiteMLA, Cai et al. ICCV'23)")
def tiny_linear_attention() -> nn.Module:
    return _LinAttn()
