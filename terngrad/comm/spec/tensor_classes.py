"""The classes of a model's tensors, for a method that quantizes one class alone
(``Options.quantize_only``, the ``-only<class>`` of a method's name): an ablation that finds
where a default loses its loss, one class at a time, the rest in full precision.

A parameter's class is read from its name, as the Hugging Face families (GPT-2, BERT, Llama,
Qwen2, T5, ViT) and terngrad's own models name them; the last layer (the head) is the one
:func:`~terngrad.comm.rank.plans.last_layer_names` finds. The patterns are tried in the order
of :data:`CLASSES` (a BERT ``attention.output.LayerNorm`` is a norm); a name none matches is
``other``, never quantized alone.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

#: each class and the words of a parameter's name that make it one, tried in this order
CLASSES: Mapping[str, str] = {
    "norms": r"norm|(^|\.)ln(_|\d|\.)",
    "embeddings": r"embed|(^|\.)(wte|wpe|shared|token|position)\.|cls_token",
    "attention": r"attn|attention|(^|\.)(q|k|v|o)(_proj)?\.|query|key|value",
    "mlp": r"mlp|intermediate|(^|\.)output\.dense|densereludense|(^|\.)(fc\d*|c_fc|ffn)\.|"
    r"(gate|up|down)_proj",
}
#: the classes a method may quantize alone: :data:`CLASSES` and the head
QUANTIZABLE = ("embeddings", "attention", "mlp", "norms", "head")


def tensor_class(name: str, last_layer: Collection[str]) -> str:
    """The class of the parameter ``name``: ``head`` for the last layer's, else the first of
    :data:`CLASSES` whose pattern its name holds (case aside), else ``other``."""
    if name in last_layer:
        return "head"
    return next((c for c, words in CLASSES.items() if re.search(words, name, re.IGNORECASE)),
                "other")  # fmt: skip
