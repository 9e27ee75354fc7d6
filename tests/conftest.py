import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run on CPU tensors through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield
