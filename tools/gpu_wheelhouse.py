"""Build, here, what the GPU machine lacks: a wheelhouse for its Python and the offline Multi30k, in .gpu/.

    python tools/gpu_wheelhouse.py                 # .gpu/wheels and .gpu/data/multi30k, then their sizes
    python tools/gpu_wheelhouse.py --check         # only say what .gpu holds and whether it all fits a call

The GPU machine (CONTRIBUTING.md, 'The GPU plan') runs Python 3.12 on x86-64 Linux, reaches no registry, and has
torch, numpy, tokenizers, sacreBLEU, pandas, matplotlib, seaborn, tqdm, pytest and much more (MACHINE_PACKAGES
below, read off the machine's image), but not what tools/gpu_kit.py's stages need beyond them: datasets and altair
(transformer_lib's own dependencies, which chapter 8 imports), nbformat, nbclient and ipykernel (stage 2 executes
chapters 8 and 9). spaCy, for chapter 8's tutorial metric, is left out: with blis and thinc it comes to about
52 MiB of wheels, which with the rest would not fit a device call, and chapter 8 prints a note instead of that one
metric without it (a GPU run whose outputs the book stores would have to bring it in another call). This script asks
pip to resolve those for CPython 3.12 on manylinux x86-64 (binary wheels only; the platform tags of the device's
recipe), walks their requirements, stops at every package the machine already has, and downloads exactly the rest,
one version each, with --no-deps into .gpu/wheels. gpu_kit.py installs them there with pip --no-index --no-deps
when a module is missing. It also copies the offline Multi30k (TRANSFORMER_LIB_DATA, by default ../shared/data) into
.gpu/data/multi30k, because ../shared does not travel.

.gpu/ is ignored by git (.gitignore) and travels only when a device call names it in `carry`; the working tree and
what is carried must stay under 64 MiB, which the script checks (exit status 1 when they do not fit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".gpu"
WHEELS, DATA = KIT / "wheels", KIT / "data"
LIMIT_MIB = 64  # the working tree and what is carried, together, on each device call
ROOTS = ("datasets", "altair", "nbformat", "nbclient", "ipykernel")  # what the kit needs beyond the machine's
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 26, 24, 17, 12, 5)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
# The Python packages of the GPU machine's image, as the device's notes list them (read there on 2026-11-17).
MACHINE_PACKAGES = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(roots: tuple[str, ...]) -> list[dict]:
    """pip's resolution of roots for CPython 3.12 on manylinux x86-64, binary wheels only: the report's 'install'."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                   "--report", str(report), "--only-binary=:all:", "--python-version", PYTHON, "--implementation",
                   "cp", *[f"--platform={tag}" for tag in PLATFORMS], "--target", str(Path(scratch) / "t"), *roots]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: pip could not resolve {' '.join(roots)} for Python {PYTHON} on manylinux "
                             f"x86-64: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        return json.loads(report.read_text())["install"]


def needed(install: list[dict], roots: tuple[str, ...]) -> list[dict]:
    """The resolved packages reachable from roots without passing through one the machine has."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    environment = {**default_environment(), "python_version": PYTHON, "python_full_version": f"{PYTHON}.3",
                   "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    by_name = {normalise(item["metadata"]["name"]): item for item in install}
    todo, seen = [normalise(root) for root in roots], set()
    while todo:
        name = todo.pop()
        if name in seen or name in MACHINE_PACKAGES:
            continue
        seen.add(name)
        for text in by_name[name]["metadata"].get("requires_dist", []):
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(normalise(requirement.name))
    return sorted((by_name[name] for name in seen), key=lambda item: normalise(item["metadata"]["name"]))


def download(items: list[dict]) -> None:
    """Each wheel, exactly the resolved version, with --no-deps, into a fresh .gpu/wheels."""
    if WHEELS.exists():
        shutil.rmtree(WHEELS)
    WHEELS.mkdir(parents=True)
    specs = [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in items]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", PYTHON, "--implementation", "cp", *[f"--platform={tag}" for tag in PLATFORMS],
               "-d", str(WHEELS), *specs]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: pip could not download the wheels: "
                         f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")


def copy_data(source: Path) -> None:
    """The offline Multi30k (train, validation, test, README) into .gpu/data/multi30k."""
    files = [source / "multi30k" / f"{split}.jsonl" for split in ("train", "validation", "test")]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise SystemExit(f"error: --data {str(source)!r} lacks {', '.join(missing)}; give the folder that holds "
                         f"multi30k/{{train,validation,test}}.jsonl")
    target = DATA / "multi30k"
    target.mkdir(parents=True, exist_ok=True)
    for path in [*files, source / "multi30k" / "README.md"]:
        if path.is_file():
            shutil.copyfile(path, target / path.name)


def tree_bytes() -> int:
    """The bytes of what a device call sends without carry: tracked files and untracked files git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / os.fsdecode(name)).stat().st_size for name in names if name and (ROOT / os.fsdecode(name))
               .is_file())


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def report() -> int:
    """What .gpu holds and whether the tree and .gpu fit one device call."""
    mib = 2 ** 20
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    for wheel in wheels:
        print(f"  {wheel.stat().st_size / mib:6.2f} MiB  {wheel.name}")
    tree, kit = tree_bytes(), folder_bytes(KIT) if KIT.is_dir() else 0
    data = folder_bytes(DATA) if DATA.is_dir() else 0
    print(f"{len(wheels)} wheels, {folder_bytes(WHEELS) / mib if WHEELS.is_dir() else 0:.1f} MiB; data "
          f"{data / mib:.1f} MiB; .gpu in all {kit / mib:.1f} MiB; the working tree {tree / mib:.1f} MiB; together "
          f"{(tree + kit) / mib:.1f} MiB of the {LIMIT_MIB} MiB a device call may send")
    if tree + kit > LIMIT_MIB * mib:
        print(f"error: the working tree and .gpu come to {(tree + kit) / mib:.1f} MiB, over {LIMIT_MIB} MiB: build "
              f"fewer wheels, or remove untracked files", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("TRANSFORMER_LIB_DATA",
                                                                         ROOT.parent / "shared" / "data")),
                        help="folder holding multi30k/*.jsonl (default: TRANSFORMER_LIB_DATA, else ../shared/data)")
    parser.add_argument("--check", action="store_true", help="only report what .gpu holds and its size")
    args = parser.parse_args(argv)
    if args.check:
        return report()
    roots = ROOTS
    print(f"resolving {' '.join(roots)} for CPython {PYTHON}, manylinux x86-64 ...", flush=True)
    items = needed(resolve(roots), roots)
    print(f"{len(items)} packages the GPU machine lacks: "
          + ", ".join(f"{i['metadata']['name']} {i['metadata']['version']}" for i in items), flush=True)
    download(items)
    copy_data(args.data)
    return report()


if __name__ == "__main__":
    sys.exit(main())
