"""Shared pytest set-up for tests/ and the notebooks that nbval runs from book/."""

import os

# Under pytest-xdist every worker (and every notebook kernel it starts) would otherwise use all cores for torch's
# thread pool; on a small machine the workers then fight over the cores and each runs many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
