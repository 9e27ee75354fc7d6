"""Which tensors stay in full precision: the last layer found by tensor, not by module (issue
29, item 2): a tied output projection is kept and named in a warning, a frozen classifier
passed over for the last layer that trains."""

import warnings

import pytest
import torch
from torch import nn

from terngrad.comm import Options, last_layer_names
from terngrad.comm.front.hook import State
from terngrad.comm.rank.plans import full_precision_names, tied_last_layer


class TiedLM(nn.Module):
    """GPT-2's layout: the head's weight is the embedding's matrix."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.body = nn.Linear(width, width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.body(self.wte(x)))


def _frozen_head() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4), nn.Linear(4, 2))
    for p in model[3].parameters():
        p.requires_grad_(False)
    return model


def test_a_tied_output_projection_is_kept_under_the_name_it_is_listed_by():
    model = TiedLM()
    assert [n for n, _ in model.named_parameters()] == ["wte.weight", "body.weight", "body.bias"]
    assert last_layer_names(model) == {"wte.weight"}  # the head's tensor, as listed
    assert tied_last_layer(model) == {"lm_head.weight": "wte.weight"}
    kept = full_precision_names(list(model.named_parameters()), last_layer_names(model),
                                Options(min_numel=0))  # fmt: skip
    assert kept == {"wte.weight"}


def test_binding_a_tied_model_says_so_unless_the_last_layer_is_quantized():
    with pytest.warns(UserWarning, match=r"lm_head.weight is wte.weight \(800 elements\)"):
        State(model=TiedLM())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        State(model=TiedLM(), quantize_last=True)  # asked to quantize it: nothing to say
        State(model=nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))  # untied: nothing to say


def test_a_frozen_classifier_is_passed_over_for_the_last_layer_that_trains():
    model = _frozen_head()
    assert last_layer_names(model) == {"2.weight", "2.bias"}
    model[2].bias.requires_grad_(False)  # a frozen tensor in it is not kept (it sends nothing)
    assert last_layer_names(model) == {"2.weight"}


def test_the_usual_model_keeps_its_classifier():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4, 10))
    assert last_layer_names(model) == {"2.weight", "2.bias"}
    assert tied_last_layer(model) == {}
    assert last_layer_names(nn.ReLU()) == set()


def test_one_class_quantized_alone_keeps_every_other_in_full_precision():
    """``quantize_only`` (``-only<class>``): the tensors of one class are quantized, all of them
    (small ones and a tied head's included), every other keeps full precision; the classes are
    read from the names of the Hugging Face families and terngrad's models."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from terngrad.comm.spec.tensor_classes import tensor_class
    from terngrad.experiments import zoo

    llama = zoo.build_model("llama")
    params = list(llama.named_parameters())
    last = last_layer_names(llama)
    classes = {name: tensor_class(name, last) for name, _ in params}
    assert classes["model.embed_tokens.weight"] == "embeddings"
    assert classes["model.layers.0.self_attn.q_proj.weight"] == "attention"
    assert classes["model.layers.0.mlp.gate_proj.weight"] == "mlp"
    assert classes["model.layers.0.input_layernorm.weight"] == "norms"
    assert classes["lm_head.weight"] == "head" and "other" not in classes.values()
    for quantized in ("embeddings", "attention", "mlp", "norms", "head"):
        kept = full_precision_names(params, last, Options(quantize_only=quantized))
        assert kept == {n for n, c in classes.items() if c != quantized}, quantized
    bert = zoo.build_model("bert")  # a BERT attention's LayerNorm is a norm; its MLP's output
    last = last_layer_names(bert)  # dense an MLP's; the tied word embedding is the head
    assert tensor_class("bert.encoder.layer.0.attention.output.LayerNorm.weight", last) == "norms"
    assert tensor_class("bert.encoder.layer.0.output.dense.weight", last) == "mlp"
    assert tensor_class("bert.encoder.layer.0.attention.output.dense.weight", last) == "attention"
    assert tensor_class("bert.embeddings.word_embeddings.weight", last) == "head"
    with pytest.raises(ValueError, match="decides which tensors are quantized"):
        Options(quantize_only="mlp", quantize_last=True)
    with pytest.raises(ValueError, match="unknown quantize only 'ffn'"):
        Options(quantize_only="ffn")
