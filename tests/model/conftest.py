import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The tiny model's ops are far too small for intra-op threads; on a shared CPU they only spin."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
