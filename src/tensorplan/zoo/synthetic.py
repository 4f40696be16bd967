"""Synthetic coverage models for the CDMPP dataset: not networks anyone runs, but grids of the
kernels real networks contain too few of.

Why: on held-out networks the predictors' worst errors are data-movement kernels (strided
slices, pads, concat + reshape + transpose). Each zoo network has a handful of them at a few sizes,
so a new network's data-movement kernels have few neighbours in the training data (research/notes/cdmpp.md,
*Data-movement coverage*). `datamove-grid` applies nine layout patterns to sixteen NCHW shapes
(channels × spatial size); every branch ends in its own output, so Relax fuses each into one
kernel, and `tensorplan predictor dataset collect --networks datamove-grid` samples and times their
schedules like any network's. The grid shares no kernel with the zoo networks (checked by
tests/test_zoo.py), so adding it never moves a task out of a held-out network's test set.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tensorplan.zoo._registry import register

#: (channels, spatial size) grid; every C divisible by 4 (heads) and by 2 (groups)
CHANNELS = (24, 64, 160, 352)
SIZES = (7, 14, 28, 56)
SHAPES = tuple((c, s) for c in CHANNELS for s in SIZES)
HEADS = 4
N_PATTERNS = 9


def _patterns(x: torch.Tensor) -> list[torch.Tensor]:
    """Nine layout patterns of (1, C, H, W) `x`, the kinds CNNs and ViTs contain."""
    _, c, h, w = x.shape
    return [
        # concat + head split (EfficientViT's multi-scale attention, ShuffleNet's concat-shuffle)
        torch.cat([x, x], 1).reshape(1, HEADS, 2 * c // HEADS, h * w).transpose(2, 3),
        x.reshape(1, 2, c // 2, h, w).transpose(1, 2).reshape(1, c, h, w),     # channel shuffle
        x.permute(0, 2, 3, 1).contiguous(),                                    # NCHW -> NHWC
        x[:, :, ::2, ::2],                                                     # stride-2 slice
        F.relu(x[:, c // 4: 3 * c // 4]),                                      # channel slice + ReLU
        F.pad(x, (1, 1, 1, 1)),                                                # zero pad
        F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1)),                                  # slice + pad (shifted window)
        x.reshape(1, HEADS, c // HEADS, h * w).transpose(2, 3),                # attention head split
        torch.cat([x, x], 3),                                                  # concat along width
    ]


class _DataMoveGrid(nn.Module):
    """Each input (one shape of the grid) feeds every pattern; each pattern is an output."""

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(y for x in xs for y in _patterns(x))


@register("datamove-grid",
          description=f"synthetic: {N_PATTERNS} data-movement patterns (concat, shuffle, transpose, slice, pad) "
                      f"on {len(SHAPES)} NCHW shapes, for the CDMPP dataset",
          input_shapes={f"x{c}_{s}": (1, c, s, s) for c, s in SHAPES},
          tags={"synthetic"}, family="synthetic",
          source="tensorplan synthetic dataset-coverage model (tensorplan.zoo.synthetic)",
          output_names=tuple(f"y{c}_{s}_{k}" for c, s in SHAPES for k in range(N_PATTERNS)))
def datamove_grid() -> nn.Module:
    return _DataMoveGrid()
