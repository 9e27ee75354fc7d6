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
