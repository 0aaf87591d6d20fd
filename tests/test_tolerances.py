"""Tolerances that hold on any CPU: the key comparisons of results computed in another order, on 1 and on 2 threads.

Fused versus explicit kernels, a batch versus its sentences one by one, a cache versus the full recomputation: such
results differ by rounding, and how much depends on the CPU's vector instructions and on how many threads split each
reduction. A tolerance is safe only with a wide margin over that rounding. Each test here reruns the comparisons of
other test files in a fresh process with OMP_NUM_THREADS (and torch.set_num_threads) 1 and 2, measures what share of
its tolerance every torch.testing.assert_close call uses, max(|actual - expected| / (atol + rtol * |expected|)), and
asks for a margin of 10: at most a tenth, for each of five draws of the random inputs (seeds 0 to 4). With a single
draw, the padded-sentence comparison of test_model once used 0.112 of its old tolerance (1e-5) on 2 threads, in one
of three full runs on the same 2-core machine; over 40 seeds it reached 0.126. The two-process comparisons have their own thread mix in
tests/test_distributed.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_decoding import MODEL_OPTIONS  # the option sets whose cached decoding is compared

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 10  # the tolerance must be at least 10 times the largest difference seen
DRAWS = 5  # each comparison runs with the random seeds 0 to 4: the margin must hold for all of them

# (test file, test function, keyword arguments): comparisons between different orders of the same arithmetic
COMPARISONS = [
    ("test_attention", "test_matches_torch_sdpa_with_padding_and_causal_masks", {}),  # ours vs torch's fused kernel
    *[("test_multihead", "test_matches_torch_multihead_attention", {"fused": f, "causal": c})  # vs torch's module
      for f in (True, False) for c in (False, True)],
    *[("test_model", "test_matches_torch_transformer", {"norm_first": n}) for n in (False, True)],  # vs nn.Transformer
    *[("test_model", "test_no_information_flows_from_padding", {"norm_first": n, "fused": f})  # batch vs one sentence
      for n in (False, True) for f in (True, False)],
    *[("test_decoding", "test_cached_and_uncached_decoding_agree", {"options": o, "device": "cpu"})
      for o in MODEL_OPTIONS],  # every model option that changes a decoder layer
    *[("test_benchmark", "test_baseline_computes_the_same_function_and_trains_the_same", {"norm_first": n})
      for n in (False, True)],
]

# Run in a fresh process: set the threads, record every assert_close's share of its tolerance, print them as JSON.
PROBE = r"""
import json, os, sys
import torch
torch.set_num_threads(int(sys.argv[1]))
sys.path[:0] = sys.argv[2].split(os.pathsep)  # the folders pytest puts on the path (pyproject's pythonpath)
DEFAULTS = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
            torch.float64: (1e-7, 1e-7)}  # torch.testing.assert_close's defaults (rtol, atol)
original, used = torch.testing.assert_close, []

def pairs(a, b):
    if isinstance(a, dict):
        for key in a:
            yield from pairs(a[key], b[key])
    else:
        yield torch.as_tensor(a), torch.as_tensor(b)

def recording(actual, expected, *args, rtol=None, atol=None, **kwargs):
    for a, b in pairs(actual, expected):
        if a.is_floating_point() and a.numel():
            r, t = (rtol, atol) if rtol is not None else DEFAULTS[a.dtype]
            share = (a.detach().double() - b.detach().double()).abs() / (t + r * b.detach().double().abs())
            used.append(float(share.nan_to_num(0.0).max()))
    return original(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)

torch.testing.assert_close = recording
import importlib
results = {}
for module, function, kwargs in json.loads(sys.argv[3]):
    used.clear()
    for seed in range(int(sys.argv[4])):  # several draws of the random inputs (a test that seeds itself repeats one)
        torch.manual_seed(seed)
        getattr(importlib.import_module(module), function)(**kwargs)
    results[f"{module}.{function}({kwargs})"] = list(used)
print(json.dumps(results))
"""


def shares(threads: int, paths: list) -> dict[str, list[float]]:
    """Run every comparison in one fresh process on `threads` threads, with paths first on its import path; the share
    of its tolerance each one used."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", PROBE, str(threads), os.pathsep.join(map(str, paths)),
                           json.dumps(COMPARISONS), str(DRAWS)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, f"the comparisons on {threads} thread(s) failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("threads", [1, 2])
def test_every_tolerance_has_a_margin_of_ten_on_this_cpu(threads, pytestconfig):
    results = shares(threads, pytestconfig.getini("pythonpath"))
    assert len(results) == len(COMPARISONS) and all(results.values()), f"a test made no comparison: {results}"
    tight = {name: round(max(used), 3) for name, used in results.items() if max(used) > 1 / MARGIN}
    assert not tight, (f"on {threads} thread(s) these comparisons used more than 1/{MARGIN} of their tolerance "
                       f"(share used): {tight}; a tolerance must be at least {MARGIN}x the difference it meets")
