"""What Colab's install cell installs is the package as committed: build a wheel, install it into a fresh virtual
environment with only its declared dependencies, import every public name and run a tiny forward pass."""

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SMOKE = """
import torch, transformer_lib as tl
missing = [name for name in tl.__all__ if not hasattr(tl, name)]
assert not missing, missing
import transformer_lib.attention_maps, transformer_lib.grading, transformer_lib.cli
cfg = tl.TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32)
logits = tl.Transformer(cfg).eval()(torch.randint(1, 20, (2, 5)), torch.randint(1, 20, (2, 4)))
assert logits.shape == (2, 4, 20)
print("ok", tl.__version__, torch.__version__)
"""


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_wheel_installs_alone_and_works(tmp_path):
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(ROOT))
    wheels = list((tmp_path / "dist").glob("transformer_lib-*.whl"))
    assert len(wheels) == 1, wheels
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = str(env / "bin" / "python")
    # The CPU build of torch first, as .ci/run does, so that the lower bound is met without a CUDA download: from
    # PyTorch's CPU index, or from the configured indexes where that cannot be reached.
    cpu_index = ["--timeout", "15", "--retries", "1", "--index-url", "https://download.pytorch.org/whl/cpu"]
    if subprocess.run([python, "-m", "pip", "install", "--quiet", *cpu_index, "torch==2.13.0"]).returncode != 0:
        run(python, "-m", "pip", "install", "--quiet", "torch==2.13.0")
    run(python, "-m", "pip", "install", "--quiet", str(wheels[0]))
    result = run(python, "-c", SMOKE, cwd=tmp_path)  # cwd outside the repository: the installed copy is used
    assert result.stdout.startswith("ok 0.1.0")
    result = run(str(env / "bin" / "transformer-lib"), "--help")
    assert "train" in result.stdout and "evaluate" in result.stdout
