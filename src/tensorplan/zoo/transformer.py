"""Transformers built from `transformers` config objects (random init, never from_pretrained).

Attention uses the "eager" implementation so the export shows MatMul/Softmax
rather than a fused SDPA decomposition chosen by the exporter.
"""
from __future__ import annotations

import torch
from torch import nn

from tensorplan.zoo._registry import register


def _eager(config):
    config._attn_implementation = "eager"
    return config


class _Bert(nn.Module):
    """BERT-base encoder whose only graph input is the token ids: the attention mask is all ones
    (a constant that folds away) and token types are zero, so every shape stays static."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        self.bert = BertModel(_eager(BertConfig()), add_pooling_layer=False)

    def forward(self, input_ids):
        mask = torch.ones_like(input_ids)
        return self.bert(input_ids=input_ids, attention_mask=mask,
                         token_type_ids=torch.zeros_like(input_ids)).last_hidden_state


@register("bert-base", description="BERT-base encoder (12 layers, 768 hidden, 12 heads), sequence 128, "
          "no pooler; input = token ids, attention mask all ones",
          input_shapes={"input_ids": (1, 128)}, input_dtypes={"input_ids": "int64"}, int_high=30522,
          tags={"transformer", "nlp", "baseline"}, family="transformer",
          source="Devlin et al., BERT, NAACL'19; transformers.BertModel(BertConfig()) random init",
          output_names=("last_hidden_state",))
def bert_base() -> nn.Module:
    return _Bert()


class _Out0(nn.Module):
    """Return one named field of a transformers ModelOutput as a plain tensor."""

    def __init__(self, model: nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, x):
        return getattr(self.model(x), self.field)


@register("vit-b16", description="ViT-B/16 encoder, 224x224 (197 tokens), no pooler/classifier",
          input_shapes={"input": (1, 3, 224, 224)}, tags={"transformer", "vision", "baseline"},
          family="transformer",
          source="Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR'21; transformers.ViTModel(ViTConfig())",
          output_names=("last_hidden_state",))
def vit_b16() -> nn.Module:
    from transformers import ViTConfig, ViTModel

    return _Out0(ViTModel(_eager(ViTConfig()), add_pooling_layer=False), "last_hidden_state")


@register("segformer-b0", description="SegFormer-b0 (MiT-b0 encoder + all-MLP decoder), 150 ADE20K classes, "
          "logits at 1/4 resolution",
          input_shapes={"input": (1, 3, 512, 512)}, tags={"korch", "transformer", "vision", "baseline"},
          family="transformer",
          source="Xie et al., SegFormer, NeurIPS'21; transformers.SegformerForSemanticSegmentation with the "
                 "b0 config (nvidia/segformer-b0-finetuned-ade-512-512 architecture), as in Korch",
          output_names=("logits",))
def segformer_b0() -> nn.Module:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    cfg = SegformerConfig(num_labels=150, hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2],
                          num_attention_heads=[1, 2, 5, 8], decoder_hidden_size=256)
    return _Out0(SegformerForSemanticSegmentation(_eager(cfg)), "logits")


class _Gpt2(nn.Module):
    """GPT-2 small decoder stack over token ids (causal self-attention, tanh GELU), no LM head."""

    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        self.gpt2 = GPT2Model(_eager(GPT2Config(use_cache=False)))

    def forward(self, input_ids):
        # An explicit all-ones mask keeps the exporter away from packed-sequence detection (aten::diff).
        return self.gpt2(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                         use_cache=False).last_hidden_state


@register("gpt2", description="GPT-2 small decoder (12 layers, 768 hidden, 12 heads, causal), sequence 128, "
          "no LM head; input = token ids",
          input_shapes={"input_ids": (1, 128)}, input_dtypes={"input_ids": "int64"}, int_high=50257,
          tags={"transformer", "nlp"}, family="transformer",
          source="Radford et al., Language Models are Unsupervised Multitask Learners, 2019; "
                 "transformers.GPT2Model(GPT2Config()) random init",
          output_names=("last_hidden_state",))
def gpt2() -> nn.Module:
    return _Gpt2()
