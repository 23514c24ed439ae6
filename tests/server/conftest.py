import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_intra_op_thread():
    """The engine's loop thread, uvicorn and httpx share the test process; with a loaded 2-core CI
    box, a 2-thread intra-op pool busy-waits against them and a tiny-model step can take 50x longer."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
