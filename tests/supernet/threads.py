"""One torch thread for the supernet tests: on a shared 2-core machine, torch's default of one thread
per core makes small convolutions many times slower as soon as anything else runs."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
