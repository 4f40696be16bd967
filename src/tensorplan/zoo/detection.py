"""Detectors: YOLOX-nano and YOLOv4 (Korch), YOLOv2 and RetinaFace (CoDL).

All written from the papers' architecture descriptions in plain PyTorch; heads
stop at tensors with static shapes (no NMS).
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from tensorplan.zoo._registry import register


class SiLU(nn.Module):
    """x * sigmoid(x), written out as Korch's export script does (Sigmoid, Mul)."""

    def forward(self, x):
        return x * torch.sigmoid(x)


class Mish(nn.Module):
    """x * tanh(softplus(x)): exports as Softplus -> Tanh -> Mul at every opset."""

    def forward(self, x):
        return x * torch.tanh(F.softplus(x))


class LeakyReLU(nn.LeakyReLU):
    def __init__(self):
        super().__init__(0.1)


def cba(cin: int, cout: int, k: int, s: int = 1, act: type = SiLU, groups: int = 1) -> nn.Sequential:
    """Conv (no bias) + BatchNorm + activation with "same" padding."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act())


# =========================================================================== YOLOX-nano
def _dw(cin: int, cout: int, k: int, s: int = 1) -> nn.Sequential:
    """Depthwise k x k + pointwise 1x1, each conv-BN-SiLU."""
    return nn.Sequential(cba(cin, cin, k, s, groups=cin), cba(cin, cout, 1))


class _XBottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool):
        super().__init__()
        self.conv1, self.conv2 = cba(c, c, 1), _dw(c, c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.conv2(self.conv1(x))
        return x + y if self.add else y


class _CSP(nn.Module):
    """CSP layer: two 1x1 branches, n bottlenecks on one, concat, 1x1 fuse."""

    def __init__(self, cin: int, cout: int, n: int, shortcut: bool = True):
        super().__init__()
        hid = cout // 2
        self.conv1, self.conv2, self.conv3 = cba(cin, hid, 1), cba(cin, hid, 1), cba(2 * hid, cout, 1)
        self.m = nn.Sequential(*[_XBottleneck(hid, shortcut) for _ in range(n)])

    def forward(self, x):
        return self.conv3(torch.cat([self.m(self.conv1(x)), self.conv2(x)], 1))


class _SPP(nn.Module):
    def __init__(self, cin: int, cout: int, act: type = SiLU, ks=(5, 9, 13)):
        super().__init__()
        hid = cin // 2
        self.conv1 = cba(cin, hid, 1, act=act)
        self.pools = nn.ModuleList([nn.MaxPool2d(k, 1, k // 2) for k in ks])
        self.conv2 = cba(hid * (len(ks) + 1), cout, 1, act=act)

    def forward(self, x):
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [p(x) for p in self.pools], 1))


class _Focus(nn.Module):
    """Space-to-depth by strided slicing (4 phases), then a 3x3 conv."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = cba(4 * cin, cout, 3)

    def forward(self, x):
        return self.conv(torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2],
                                    x[..., 1::2, 1::2]], 1))


class YOLOXNano(nn.Module):
    """Depth 0.33, width 0.25, depthwise convs; 80 classes; raw (undecoded) predictions."""

    def __init__(self, num_classes: int = 80):
        super().__init__()
        c = 16  # int(64 * 0.25)
        self.stem = _Focus(3, c)
        self.dark2 = nn.Sequential(_dw(c, 2 * c, 3, 2), _CSP(2 * c, 2 * c, 1))
        self.dark3 = nn.Sequential(_dw(2 * c, 4 * c, 3, 2), _CSP(4 * c, 4 * c, 3))
        self.dark4 = nn.Sequential(_dw(4 * c, 8 * c, 3, 2), _CSP(8 * c, 8 * c, 3))
        self.dark5 = nn.Sequential(_dw(8 * c, 16 * c, 3, 2), _SPP(16 * c, 16 * c), _CSP(16 * c, 16 * c, 1, False))
        # PAFPN on (dark3, dark4, dark5) = (64, 128, 256) channels
        self.lateral_conv0 = cba(256, 128, 1)
        self.c3_p4 = _CSP(256, 128, 1, False)
        self.reduce_conv1 = cba(128, 64, 1)
        self.c3_p3 = _CSP(128, 64, 1, False)
        self.bu_conv2 = _dw(64, 64, 3, 2)
        self.c3_n3 = _CSP(128, 128, 1, False)
        self.bu_conv1 = _dw(128, 128, 3, 2)
        self.c3_n4 = _CSP(256, 256, 1, False)
        # decoupled head, hidden width 64
        self.stems = nn.ModuleList([cba(ch, 64, 1) for ch in (64, 128, 256)])
        self.cls_convs = nn.ModuleList([nn.Sequential(_dw(64, 64, 3), _dw(64, 64, 3)) for _ in range(3)])
        self.reg_convs = nn.ModuleList([nn.Sequential(_dw(64, 64, 3), _dw(64, 64, 3)) for _ in range(3)])
        self.cls_preds = nn.ModuleList([nn.Conv2d(64, num_classes, 1) for _ in range(3)])
        self.reg_preds = nn.ModuleList([nn.Conv2d(64, 4, 1) for _ in range(3)])
        self.obj_preds = nn.ModuleList([nn.Conv2d(64, 1, 1) for _ in range(3)])

    def forward(self, x):
        x = self.dark2(self.stem(x))
        d3 = self.dark3(x)
        d4 = self.dark4(d3)
        d5 = self.dark5(d4)
        fpn0 = self.lateral_conv0(d5)
        f = self.c3_p4(torch.cat([F.interpolate(fpn0, scale_factor=2, mode="nearest"), d4], 1))
        fpn1 = self.reduce_conv1(f)
        p3 = self.c3_p3(torch.cat([F.interpolate(fpn1, scale_factor=2, mode="nearest"), d3], 1))
        p4 = self.c3_n3(torch.cat([self.bu_conv2(p3), fpn1], 1))
        p5 = self.c3_n4(torch.cat([self.bu_conv1(p4), fpn0], 1))
        outs = []
        for i, feat in enumerate((p3, p4, p5)):
            s = self.stems[i](feat)
            cls = self.cls_preds[i](self.cls_convs[i](s))
            r = self.reg_convs[i](s)
            out = torch.cat([self.reg_preds[i](r), torch.sigmoid(self.obj_preds[i](r)), torch.sigmoid(cls)], 1)
            outs.append(out.flatten(2))
        return torch.cat(outs, 2).permute(0, 2, 1)


@register("yolox-nano", description="YOLOX-nano: depthwise CSPDarknet + SPP, PAFPN, decoupled head; "
          "output (1, 3549, 85) undecoded",
          input_shapes={"input": (1, 3, 416, 416)}, tags={"korch", "detection", "baseline", "mobile"},
          family="detection",
          source="Ge et al., YOLOX, arXiv 2107.08430 (nano: depth 0.33, width 0.25, depthwise); Korch export "
                 "with SiLU as x*sigmoid(x) and decode_in_inference=False")
def yolox_nano() -> nn.Module:
    return YOLOXNano()


# =========================================================================== YOLOv4
def _mish(cin, cout, k, s=1):
    return cba(cin, cout, k, s, act=Mish)


def _leaky(cin, cout, k, s=1):
    return cba(cin, cout, k, s, act=LeakyReLU)


class _ResUnit(nn.Module):
    def __init__(self, c: int, hid: int):
        super().__init__()
        self.a, self.b = _mish(c, hid, 1), _mish(hid, c, 3)

    def forward(self, x):
        return x + self.b(self.a(x))


class _CSPStage(nn.Module):
    """CSPDarknet53 stage: stride-2 conv, split into a shortcut 1x1 and n residual units, concat, 1x1."""

    def __init__(self, cin: int, cout: int, n: int):
        super().__init__()
        first = n == 1  # the first stage keeps full width in its branches
        part = cout if first else cout // 2
        self.down = _mish(cin, cout, 3, 2)
        self.split0, self.split1 = _mish(cout, part, 1), _mish(cout, part, 1)
        self.blocks = nn.Sequential(*[_ResUnit(part, cout // 2 if first else part) for _ in range(n)],
                                    _mish(part, part, 1))
        self.fuse = _mish(2 * part, cout, 1)

    def forward(self, x):
        x = self.down(x)
        return self.fuse(torch.cat([self.blocks(self.split1(x)), self.split0(x)], 1))


def _five(cin: int, c: int) -> nn.Sequential:
    """1x1, 3x3, 1x1, 3x3, 1x1 leaky block of the PANet neck/head."""
    return nn.Sequential(_leaky(cin, c, 1), _leaky(c, 2 * c, 3), _leaky(2 * c, c, 1), _leaky(c, 2 * c, 3),
                         _leaky(2 * c, c, 1))


class _YoloDecode(nn.Module):
    """Per-level decode to normalized boxes (x1, y1, x2, y2) and per-class confidences."""

    def __init__(self, anchors: list[tuple[int, int]], stride: int, grid: int, num_classes: int, img: int):
        super().__init__()
        self.na, self.nc, self.g = len(anchors), num_classes, grid
        gy, gx = torch.meshgrid(torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32),
                                indexing="ij")
        self.register_buffer("gx", gx.reshape(1, 1, grid, grid), persistent=False)
        self.register_buffer("gy", gy.reshape(1, 1, grid, grid), persistent=False)
        a = torch.tensor(anchors, dtype=torch.float32) / img
        self.register_buffer("aw", a[:, 0].reshape(1, -1, 1, 1), persistent=False)
        self.register_buffer("ah", a[:, 1].reshape(1, -1, 1, 1), persistent=False)

    def forward(self, p):
        b = p.shape[0]
        p = p.reshape(b, self.na, 5 + self.nc, self.g, self.g)
        cx = (torch.sigmoid(p[:, :, 0]) + self.gx) / self.g
        cy = (torch.sigmoid(p[:, :, 1]) + self.gy) / self.g
        w, h = torch.exp(p[:, :, 2]) * self.aw, torch.exp(p[:, :, 3]) * self.ah
        boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1).reshape(b, -1, 4)
        conf = torch.sigmoid(p[:, :, 5:]) * torch.sigmoid(p[:, :, 4:5])
        conf = conf.permute(0, 1, 3, 4, 2).reshape(b, -1, self.nc)
        return boxes, conf


class YOLOv4(nn.Module):
    """CSPDarknet53 (Mish) + SPP + PANet (leaky ReLU) + three YOLOv3 heads, with box decode."""

    ANCHORS = [(12, 16), (19, 36), (40, 28), (36, 75), (76, 55), (72, 146), (142, 110), (192, 243), (459, 401)]

    def __init__(self, num_classes: int = 1000, img: int = 416):
        super().__init__()
        out = 3 * (5 + num_classes)
        self.stem = _mish(3, 32, 3)
        self.stages = nn.ModuleList([_CSPStage(32, 64, 1), _CSPStage(64, 128, 2), _CSPStage(128, 256, 8),
                                     _CSPStage(256, 512, 8), _CSPStage(512, 1024, 4)])
        self.pre_spp = nn.Sequential(_leaky(1024, 512, 1), _leaky(512, 1024, 3), _leaky(1024, 512, 1))
        self.spp = nn.ModuleList([nn.MaxPool2d(k, 1, k // 2) for k in (5, 9, 13)])
        self.post_spp = nn.Sequential(_leaky(2048, 512, 1), _leaky(512, 1024, 3), _leaky(1024, 512, 1))
        self.up5, self.lat4, self.five4 = _leaky(512, 256, 1), _leaky(512, 256, 1), _five(512, 256)
        self.up4, self.lat3, self.five3 = _leaky(256, 128, 1), _leaky(256, 128, 1), _five(256, 128)
        self.head3 = nn.Sequential(_leaky(128, 256, 3), nn.Conv2d(256, out, 1))
        self.down3, self.pan4 = _leaky(128, 256, 3, 2), _five(512, 256)
        self.head4 = nn.Sequential(_leaky(256, 512, 3), nn.Conv2d(512, out, 1))
        self.down4, self.pan5 = _leaky(256, 512, 3, 2), _five(1024, 512)
        self.head5 = nn.Sequential(_leaky(512, 1024, 3), nn.Conv2d(1024, out, 1))
        self.decode = nn.ModuleList([_YoloDecode(self.ANCHORS[3 * i:3 * i + 3], s, img // s, num_classes, img)
                                     for i, s in enumerate((8, 16, 32))])

    def forward(self, x):
        x = self.stem(x)
        feats = []
        for st in self.stages:
            x = st(x)
            feats.append(x)
        c3, c4, c5 = feats[2], feats[3], feats[4]
        x = self.pre_spp(c5)
        x6 = self.post_spp(torch.cat([p(x) for p in reversed(self.spp)] + [x], 1))
        x13 = self.five4(torch.cat([self.lat4(c4), F.interpolate(self.up5(x6), scale_factor=2)], 1))
        x20 = self.five3(torch.cat([self.lat3(c3), F.interpolate(self.up4(x13), scale_factor=2)], 1))
        y3 = self.head3(x20)
        x8 = self.pan4(torch.cat([self.down3(x20), x13], 1))
        y4 = self.head4(x8)
        y5 = self.head5(self.pan5(torch.cat([self.down4(x8), x6], 1)))
        boxes, confs = zip(*(d(y) for d, y in zip(self.decode, (y3, y4, y5))))
        return torch.cat(boxes, 1), torch.cat(confs, 1)


@register("yolov4", description="YOLOv4: CSPDarknet53 (Mish) + SPP + PANet + 3 heads, 1000 classes, "
          "decoded boxes (1, 10647, 4) and confidences (1, 10647, 1000)",
          input_shapes={"input": (1, 3, 416, 416)}, tags={"korch", "detection"}, family="detection",
          source="Bochkovskiy et al., YOLOv4, arXiv 2004.10934; layout of the Tianxiaomo pytorch-YOLOv4 "
                 "model that Korch exports with n_classes=1000, inference=True",
          output_names=("boxes", "confs"))
def yolov4() -> nn.Module:
    return YOLOv4()


# =========================================================================== YOLOv2
class YOLOv2(nn.Module):
    """Darknet-19 trunk, two 3x3x1024 convs, passthrough (26x26x512 -> 1x1x64 -> space-to-depth), head."""

    def __init__(self, num_classes: int = 80, anchors: int = 5):
        super().__init__()
        cfg1 = [32, "M", 64, "M", 128, (64, 1), 128, "M", 256, (128, 1), 256, "M",
                512, (256, 1), 512, (256, 1), 512]
        cfg2 = ["M", 1024, (512, 1), 1024, (512, 1), 1024, 1024, 1024]
        self.part1, c = self._make(cfg1, 3)
        self.part2, c2 = self._make(cfg2, c)
        self.passthrough = _leaky(c, 64, 1)
        self.fuse = _leaky(c2 + 256, 1024, 3)
        self.head = nn.Conv2d(1024, anchors * (5 + num_classes), 1)

    @staticmethod
    def _make(cfg, cin):
        layers: list[nn.Module] = []
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            cout, k = (v, 3) if isinstance(v, int) else v
            layers.append(_leaky(cin, cout, k))
            cin = cout
        return nn.Sequential(*layers), cin

    def forward(self, x):
        a = self.part1(x)
        b = self.part2(a)
        p = self.passthrough(a)
        n, c, h, w = p.shape
        p = p.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 3, 5, 1, 2, 4).reshape(n, 4 * c, h // 2, w // 2)
        return self.head(self.fuse(torch.cat([p, b], 1)))


@register("yolov2", description="YOLOv2 (Darknet-19 + passthrough), 80 classes x 5 anchors, raw 13x13x425 output",
          input_shapes={"input": (1, 3, 416, 416)}, tags={"codl", "detection"}, family="detection",
          source="Redmon & Farhadi, YOLO9000, CVPR'17 (darknet yolov2.cfg); CoDL evaluation model")
def yolov2() -> nn.Module:
    return YOLOv2()


# =========================================================================== RetinaFace
def _cb(cin, cout, k, s=1, leaky=0.0, act=True, groups=1):
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.LeakyReLU(leaky) if leaky else nn.ReLU())
    return nn.Sequential(*layers)


def _dws(cin, cout, s):
    """MobileNetV1 depthwise-separable block with leaky ReLU(0.1), as in RetinaFace's mobilenet0.25."""
    return nn.Sequential(_cb(cin, cin, 3, s, 0.1, groups=cin), _cb(cin, cout, 1, 1, 0.1))


class _SSH(nn.Module):
    """Single-stage headless context module: 3x3 | 5x5 (two 3x3) | 7x7 (three 3x3) branches."""

    def __init__(self, c: int):
        super().__init__()
        self.c3 = _cb(c, c // 2, 3, act=False)
        self.c5_1 = _cb(c, c // 4, 3, leaky=0.1)
        self.c5_2 = _cb(c // 4, c // 4, 3, act=False)
        self.c7_2 = _cb(c // 4, c // 4, 3, leaky=0.1)
        self.c7_3 = _cb(c // 4, c // 4, 3, act=False)

    def forward(self, x):
        t = self.c5_1(x)
        return F.relu(torch.cat([self.c3(x), self.c5_2(t), self.c7_3(self.c7_2(t))], 1))


class RetinaFace(nn.Module):
    def __init__(self, anchors: int = 2):
        super().__init__()
        self.stage1 = nn.Sequential(_cb(3, 8, 3, 2, 0.1), _dws(8, 16, 1), _dws(16, 32, 2), _dws(32, 32, 1),
                                    _dws(32, 64, 2), _dws(64, 64, 1))
        self.stage2 = nn.Sequential(_dws(64, 128, 2), *[_dws(128, 128, 1) for _ in range(5)])
        self.stage3 = nn.Sequential(_dws(128, 256, 2), _dws(256, 256, 1))
        c = 64
        leaky = 0.1  # out_channels <= 64 -> leaky 0.1 in the FPN
        self.lat = nn.ModuleList([_cb(ci, c, 1, leaky=leaky) for ci in (64, 128, 256)])
        self.merge2, self.merge1 = _cb(c, c, 3, leaky=leaky), _cb(c, c, 3, leaky=leaky)
        self.ssh = nn.ModuleList([_SSH(c) for _ in range(3)])
        self.cls = nn.ModuleList([nn.Conv2d(c, anchors * 2, 1) for _ in range(3)])
        self.box = nn.ModuleList([nn.Conv2d(c, anchors * 4, 1) for _ in range(3)])
        self.ldm = nn.ModuleList([nn.Conv2d(c, anchors * 10, 1) for _ in range(3)])

    def forward(self, x):
        s1 = self.stage1(x)
        s2 = self.stage2(s1)
        s3 = self.stage3(s2)
        o1, o2, o3 = self.lat[0](s1), self.lat[1](s2), self.lat[2](s3)
        o2 = self.merge2(o2 + F.interpolate(o3, size=o2.shape[-2:], mode="nearest"))
        o1 = self.merge1(o1 + F.interpolate(o2, size=o1.shape[-2:], mode="nearest"))
        feats = [ssh(o) for ssh, o in zip(self.ssh, (o1, o2, o3))]

        def heads(convs, k):
            return torch.cat([cv(f).permute(0, 2, 3, 1).reshape(f.shape[0], -1, k) for cv, f in zip(convs, feats)], 1)

        return heads(self.box, 4), torch.softmax(heads(self.cls, 2), -1), heads(self.ldm, 10)


@register("retinaface", description="RetinaFace with MobileNet-0.25 backbone, FPN, SSH context modules and "
          "box/class/landmark heads (2 anchors per cell), 640x640",
          input_shapes={"input": (1, 3, 640, 640)}, tags={"codl", "detection", "mobile"}, family="detection",
          source="Deng et al., RetinaFace, CVPR'20; mobilenet0.25 configuration of the widely used PyTorch "
                 "port (FPN width 64); CoDL evaluation model (CoDL conv shapes reach HW 640)",
          output_names=("bbox", "conf", "landmarks"))
def retinaface() -> nn.Module:
    return RetinaFace()
