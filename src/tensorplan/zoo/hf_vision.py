"""Vision networks built from `transformers` config objects (random init, never from_pretrained):
ConvNeXt-T, EfficientNet-B0, MobileViT-S and Swin-T.

Why: the CDMPP dataset needs many networks' kernels; these add 7x7 depthwise convolutions with
channel-last LayerNorm, SiLU squeeze-excite, unfold/fold patch reshapes and shifted-window
partitions, none of which the other zoo networks contain.
"""
from __future__ import annotations

from torch import nn

from tensorplan.zoo._registry import register
from tensorplan.zoo.transformer import _eager, _Out0

_IMG = {"input": (1, 3, 224, 224)}


@register("convnext-tiny", description="ConvNeXt-T trunk (7x7 depthwise, channel LayerNorm, GELU MLP, "
          "layer scale), 224x224, last stage features", input_shapes=_IMG, tags={"cnn", "vision"}, family="cnn",
          source="Liu et al., A ConvNet for the 2020s, CVPR'22; transformers.ConvNextModel(ConvNextConfig())",
          output_names=("last_hidden_state",))
def convnext_tiny() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextModel

    return _Out0(ConvNextModel(ConvNextConfig()), "last_hidden_state")


@register("efficientnet-b0", description="EfficientNet-B0 trunk (MBConv, SiLU squeeze-excite, 3x3/5x5 "
          "depthwise), 224x224, no pooler", input_shapes=_IMG, tags={"cnn", "mobile"}, family="cnn",
          source="Tan & Le, EfficientNet, ICML'19; transformers.EfficientNetModel(EfficientNetConfig())",
          output_names=("last_hidden_state",))
def efficientnet_b0() -> nn.Module:
    from transformers import EfficientNetConfig, EfficientNetModel

    # The config defaults are B7; B0 is width/depth 1.0 at 224 with a 1280-channel head.
    cfg = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280)
    return _Out0(EfficientNetModel(cfg), "last_hidden_state")


@register("mobilevit-s", description="MobileViT-S trunk (MobileNetV2 blocks + unfold/transformer/fold "
          "blocks, SiLU), 256x256, no pooler", input_shapes={"input": (1, 3, 256, 256)},
          tags={"transformer", "vision", "mobile"}, family="transformer",
          source="Mehta & Rastegari, MobileViT, ICLR'22; transformers.MobileViTModel(MobileViTConfig())",
          output_names=("last_hidden_state",))
def mobilevit_s() -> nn.Module:
    from transformers import MobileViTConfig, MobileViTModel

    return _Out0(MobileViTModel(_eager(MobileViTConfig()), expand_output=True), "last_hidden_state")


@register("swin-tiny", description="Swin-T trunk (shifted 7x7 windows, relative position bias), 224x224, "
          "no pooler", input_shapes=_IMG, tags={"transformer", "vision"}, family="transformer",
          source="Liu et al., Swin Transformer, ICCV'21; transformers.SwinModel(SwinConfig())",
          output_names=("last_hidden_state",))
def swin_tiny() -> nn.Module:
    from transformers import SwinConfig, SwinModel

    return _Out0(SwinModel(_eager(SwinConfig()), add_pooling_layer=False), "last_hidden_state")
