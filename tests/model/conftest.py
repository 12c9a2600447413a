import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The tiny model's ops are far too small for intra-op threads; on a shared CPU they only spin."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    """An engine on a fresh random tiny checkpoint (its seed printed, to replay a failure)."""
    import random

    from dsv4bench.model.config import TINY
    from dsv4bench.model.engine import Engine
    from dsv4bench.model.loader import Checkpoint
    from dsv4bench.model.synth import write_checkpoint

    seed = random.randrange(1 << 30)
    print(f"tiny checkpoint seed {seed}")
    return Engine(Checkpoint.open(write_checkpoint(TINY, tmp_path_factory.mktemp("tiny"), seed=seed)))
