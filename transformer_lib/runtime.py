"""Hand-written helpers the book uses but does not teach: picking a device and the smoke-test switch."""

import os

import torch

SMOKE_ENV = "TRANSFORMER_BOOK_SMOKE"


def get_device() -> torch.device:
    """The best device available: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def is_smoke() -> bool:
    """True when TRANSFORMER_BOOK_SMOKE asks for a shrunken run (CI sets it to 1)."""
    value = os.environ.get(SMOKE_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{SMOKE_ENV} must be 1 or 0 (or true/false), got {value!r}")


def smoke_or(full, smoke):
    """Return `smoke` under TRANSFORMER_BOOK_SMOKE=1, else `full`: one place to shrink a heavy setting for CI."""
    return smoke if is_smoke() else full


def cpu_name() -> str:
    """The CPU's model name as the operating system reports it (for records of where a run ran)."""
    import platform
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


AUTOCAST_ENV = "TRANSFORMER_LIB_AUTOCAST"
_AUTOCAST_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


def autocast_override(natural: torch.dtype | None) -> torch.dtype | None:
    """The mixed-precision type a GPU trains in: `natural` (the device's own choice, chapter 7's autocast_dtype)
    unless TRANSFORMER_LIB_AUTOCAST names fp16, bf16 or fp32 (fp32: no autocast).

    It exists for testing: fp16 with a GradScaler is what a T4 (Colab's free GPU) runs, and tools/gpu_kit.py (stage 1)
    forces it on a newer GPU to check that path where no T4 is at hand.
    """
    value = os.environ.get(AUTOCAST_ENV, "").strip().lower()
    if not value:
        return natural
    if value not in _AUTOCAST_TYPES:
        raise ValueError(f"{AUTOCAST_ENV} must be one of {', '.join(_AUTOCAST_TYPES)} or unset, got {value!r}")
    return _AUTOCAST_TYPES[value]


def training_threads(cores: int | None = None, load: float | None = None) -> int:
    """The CPU threads a training should use: every core when nothing else runs, one when other work shares them.

    Measured on 2 cores (benchmarks/threads.py; the performance appendix): alone, 2 threads train the tiny and the
    multi30k-cpu models 1.3 and 1.7 times as fast as 1; beside one busy process, 3.3 and 1.5 times as slowly, because
    torch's threads wait for each other and each wait lasts as long as the other work holds a core. So the choice
    follows the machine: every core when the 1-minute load average is under half a core, one when another process
    holds more. `cores` and `load` default to this machine's (os.cpu_count, os.getloadavg)."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # (Windows has no load average)
    return cores if load < 0.5 else 1
