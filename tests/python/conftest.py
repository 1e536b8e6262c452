"""Shared pytest fixtures: a fresh, printed seed per run (FLASHSTEP_SEED reproduces)."""
import os
import random

import numpy as np
import pytest

_SEED = int(os.environ.get("FLASHSTEP_SEED", random.SystemRandom().randrange(2**32)))


def pytest_report_header(config):
    return f"flashstep random seed {_SEED} (reproduce with FLASHSTEP_SEED={_SEED})"


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the run seed and the test's name."""
    seed = (_SEED + sum(map(ord, request.node.name)) * 7919) % 2**32
    print(f"seed for {request.node.name}: {seed} (run seed {_SEED})")
    return np.random.default_rng(seed)


@pytest.fixture
def torch():
    """PyTorch on a usable CUDA device with flashstep.cuda's library loaded, else a skip
    (cuda_support.torch_cuda_or_skip says when it fails instead): the GPU suites' fixture."""
    import cuda_support
    return cuda_support.torch_cuda_or_skip()


@pytest.fixture
def fsc():
    """flashstep.cuda, the module under test of the GPU suites."""
    import flashstep.cuda as fsc
    return fsc
