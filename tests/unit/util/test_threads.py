"""``use_threads``: every thread of a process computes with the count, not only the caller."""

import ctypes
import threading
from pathlib import Path

import pytest
import torch

from terngrad.util.threads import use_threads

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL")


def _mkl_count_on_a_new_thread() -> int:
    """MKL's thread count as a thread that never set one sees it (as a comm hook's callback
    on gloo's thread does)."""
    mkl = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    seen = []
    thread = threading.Thread(target=lambda: seen.append(mkl.mkl_get_max_threads()))
    thread.start()
    thread.join()
    return seen[0]


def test_a_new_thread_computes_with_the_count_set_on_another():
    before = torch.get_num_threads()
    try:
        for count in (1, 3):  # (3: not the default of a 1-, 2- or 4-core machine)
            use_threads(count)
            assert torch.get_num_threads() == count
            assert _mkl_count_on_a_new_thread() == count
    finally:
        use_threads(before)
