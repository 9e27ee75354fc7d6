import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run on CPU tensors through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels():
    """Compile the numba kernels once, before any test spawns ranks that would each compile."""
    from terngrad.kernels import warm_up

    warm_up(levels=True)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield
