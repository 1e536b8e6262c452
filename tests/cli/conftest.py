"""Run the `flashstep` binary under test (FLASHSTEP_CLI) and capture what it says."""
import os
import random
import subprocess

import pytest

_SEED = int(os.environ.get("FLASHSTEP_SEED", random.SystemRandom().randrange(2**32)))


def pytest_report_header(config):
    return f"flashstep random seed {_SEED} (reproduce with FLASHSTEP_SEED={_SEED})"


class Run:
    """One finished run: exit code, stdout, stderr."""

    def __init__(self, args, proc):
        self.args = args
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self):
        return (f"flashstep {' '.join(self.args)} -> exit {self.rc}\n--- stdout ---\n{self.out}"
                f"\n--- stderr ---\n{self.err}")


@pytest.fixture
def flashstep():
    exe = os.environ.get("FLASHSTEP_CLI")
    if not exe or not os.path.exists(exe):
        pytest.fail("FLASHSTEP_CLI must name the built flashstep binary")

    def run(*args, timeout=600):
        proc = subprocess.run([exe, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=timeout)
        return Run(list(args), proc)

    return run


@pytest.fixture
def seed():
    """The run seed, printed so that a failure reproduces."""
    print(f"seed {_SEED}")
    return _SEED
