"""Measure the library's Transformer against torch.nn.Transformer, and decoding with and without the KV cache.

    python benchmarks/benchmark.py --size small                    # CPU-friendly model, on the best device here
    python benchmarks/benchmark.py --size base --dtype bf16 --compile --json results.json

One run, on one device: the library model (fused attention, and the explicit path that can return attention
weights) and an nn.Transformer holding a copy of the same weights (benchmarks/torch_baseline.py) train on the same
random batches with the same optimizer. Each is timed over --repeats windows of --steps steps, the windows of the
different models interleaved so that a change in the machine's load hits them alike; the table gives the median and
the range (min-max) of the windows. Throughput counts target tokens (the non-padding labels) per second of
forward + backward + optimizer step. Peak memory is the CUDA allocator's high-water mark on a GPU; on a CPU it is
the peak resident size of a fresh process that built the model and ran three steps, read from getrusage.

Model FLOPs (for MFU) count every matrix multiply of the model, forward 2 * m * n * k, training 3 x forward
(the backward pass costs two forward passes); the causal mask's skipped half of the decoder's self-attention is
counted, as is usual. flops_per_step() is checked against torch.utils.flop_counter in tests/test_benchmark.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import transformer_lib as tl  # noqa: E402
from torch_baseline import TorchTransformer  # noqa: E402
from transformer_lib.decoding import beam_search  # noqa: E402
from transformer_lib.files import atomic_write_text, read_json  # noqa: E402
from transformer_lib.runs import check_output_file  # noqa: E402
from transformer_lib.settings import is_count, is_number  # noqa: E402
from transformer_lib.training import teacher_forcing_pair, translation_loss  # noqa: E402

SIZES = {
    # TransformerConfig fields; vocab is the shared source/target vocabulary.
    "tiny": dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, vocab=500),  # for the tests
    "small": dict(d_model=256, n_heads=8, n_layers=3, d_ff=1024, vocab=8000),  # the book's multi30k preset
    "base": dict(d_model=512, n_heads=8, n_layers=6, d_ff=2048, vocab=37000),  # the paper's base model
}
# Batch shape by size and device kind: (sentences, source length, target length). Lengths are maxima; each
# sentence's real length is drawn between half of it and all of it, and the rest is padding.
BATCHES = {
    ("tiny", "cpu"): (4, 12, 12), ("small", "cpu"): (32, 32, 32), ("base", "cpu"): (16, 32, 32),
    ("tiny", "gpu"): (4, 12, 12), ("small", "gpu"): (128, 64, 64), ("base", "gpu"): (128, 64, 64),
}
# The square matrix multiply whose measured rate is the denominator of MFU: (tiny model?, on a GPU?) -> n.
MATMUL_SIZE = {(False, False): 2048, (False, True): 8192, (True, False): 256, (True, True): 1024}
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
MODELS = ("torch.nn.Transformer", "library, fused attention", "library, explicit attention")


def make_model(size: str, seed: int = 0, dropout: float = 0.1) -> tl.Transformer:
    """The library model of a size, seeded, with one embedding matrix shared by source, target and output."""
    shape = SIZES[size]
    torch.manual_seed(seed)
    cfg = tl.TransformerConfig(src_vocab_size=shape["vocab"], tgt_vocab_size=shape["vocab"], d_model=shape["d_model"],
                               n_heads=shape["n_heads"], n_layers=shape["n_layers"], d_ff=shape["d_ff"],
                               dropout=dropout, max_len=512, share_embeddings=True, tie_embeddings=True)
    return tl.Transformer(cfg)


def build(name: str, size: str, device: torch.device) -> torch.nn.Module:
    """One of MODELS, on device; all three start from the same weights."""
    model = make_model(size)
    if name == "torch.nn.Transformer":
        model = TorchTransformer(model)
    elif name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    return model.to(device)  # both library models: Trainer.step runs the explicit one inside tl.explicit_attention


def random_batches(n: int, size: str, shape: tuple[int, int, int], seed: int = 1) -> list[tuple]:
    """n batches of random ids (B, S) and (B, T + 1), with <bos> ... <eos> targets and random lengths padded."""
    batch, src_len, tgt_len = shape
    vocab = SIZES[size]["vocab"]
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        src = torch.randint(len(tl.SPECIAL_TOKENS), vocab, (batch, src_len), generator=generator)  # (B, S)
        tgt = torch.randint(len(tl.SPECIAL_TOKENS), vocab, (batch, tgt_len + 1), generator=generator)  # (B, T + 1)
        tgt[:, 0] = tl.BOS_ID
        for row in range(batch):
            s = int(torch.randint(src_len // 2, src_len + 1, (1,), generator=generator))
            t = int(torch.randint(tgt_len // 2, tgt_len + 1, (1,), generator=generator))
            src[row, s:] = tl.PAD_ID
            tgt[row, t] = tl.EOS_ID
            tgt[row, t + 1 :] = tl.PAD_ID
        batches.append((src, tgt))
    return batches


def flops_per_step(size: str, batch: int, src_len: int, tgt_len: int, training: bool = True) -> int:
    """Matrix-multiply FLOPs of one step on (batch, src_len) and (batch, tgt_len) padded inputs (see the docstring)."""
    s = SIZES[size]
    d, d_ff, n, vocab = s["d_model"], s["d_ff"], s["n_layers"], s["vocab"]
    S, T = src_len, tgt_len
    encoder = n * (4 * d * d * S + 2 * S * S * d + 2 * d * d_ff * S)  # projections, scores and mixing, feed-forward
    decoder = n * (
        4 * d * d * T + 2 * T * T * d  # self-attention
        + 2 * d * d * T + 2 * d * d * S + 2 * T * S * d  # cross-attention: Q and output on T, K and V on S
        + 2 * d * d_ff * T  # feed-forward
    )
    generator = d * vocab * T
    forward = 2 * batch * (encoder + decoder + generator)  # multiply-adds -> FLOPs
    return 3 * forward if training else forward


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 10) -> float:
    """Measured FLOP/s of an n x n by n x n matrix multiply in dtype: the denominator of MFU."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - started)
    return 2 * n**3 / statistics.median(times)


class Trainer:
    """One model, its Adam optimizer, and a step function that trains on one batch and returns its target tokens."""

    def __init__(self, name: str, size: str, device: torch.device, amp: torch.dtype | None, compile: bool) -> None:
        self.name, self.device, self.amp = name, device, amp
        self.model = build(name, size, device).train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
        self.forward = torch.compile(self.model) if compile else self.model
        self.explicit = name == "library, explicit attention"

    def step(self, src: torch.Tensor, tgt: torch.Tensor) -> int:
        src, tgt = src.to(self.device, non_blocking=True), tgt.to(self.device, non_blocking=True)
        decoder_input, labels = teacher_forcing_pair(tgt)  # (B, T), (B, T)
        amp = torch.autocast(self.device.type, dtype=self.amp) if self.amp else nullcontext()
        with tl.explicit_attention(self.model, enabled=self.explicit), amp:
            logits = self.forward(src, decoder_input)  # (B, T, V)
            loss = translation_loss(logits.float(), labels, tl.PAD_ID, 0.1)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return int((labels != tl.PAD_ID).sum())


def check_same_function(size: str, device: torch.device) -> float:
    """Largest logit difference between the library model and its nn.Transformer copy (eval mode, fp32)."""
    model = make_model(size).to(device).eval()
    baseline = TorchTransformer(model).to(device).eval()
    src, tgt = random_batches(1, size, (3, 10, 9))[0]
    with torch.no_grad():
        ours = model(src.to(device), tgt[:, :-1].to(device))
        theirs = baseline(src.to(device), tgt[:, :-1].to(device))
    difference = (ours - theirs).abs().max().item()
    if difference > 1e-3:
        raise RuntimeError(f"the nn.Transformer copy computes another function: logits differ by {difference:.3g}")
    return difference


def peak_memory_mib(name: str, args: argparse.Namespace, device: torch.device) -> float:
    """Peak memory of training `name` for three steps: CUDA allocator peak, or a fresh process's peak RSS on a CPU."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        train_three_steps(name, args, device)
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    command = [sys.executable, __file__, "--memory-probe", name, "--size", args.size, "--dtype", args.dtype,
               "--device", "cpu", "--batch", ",".join(map(str, args.shape))] + (["--compile"] if args.compile else [])
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def memory_probe(args: argparse.Namespace) -> None:
    """Child process of peak_memory_mib on a CPU: train three steps, print the peak resident size in MiB."""
    train_three_steps(args.memory_probe, args, torch.device("cpu"))
    print(peak_resident_mib())


def train_three_steps(name: str, args: argparse.Namespace, device: torch.device) -> None:
    """What peak memory is measured over: build the model and train it for three steps."""
    trainer = Trainer(name, args.size, device, DTYPES[args.dtype], args.compile)
    for src, tgt in random_batches(3, args.size, args.shape, seed=2):
        trainer.step(src, tgt)


def peak_resident_mib() -> float:
    """This process's peak resident size. Linux: VmHWM, since getrusage's ru_maxrss survives exec and would report
    the parent's peak; elsewhere ru_maxrss (KiB on Linux, bytes on macOS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB -> MiB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def benchmark_training(args: argparse.Namespace, device: torch.device) -> dict:
    amp = DTYPES[args.dtype]
    trainers = [Trainer(name, args.size, device, amp, args.compile) for name in MODELS]
    batches = random_batches(args.steps, args.size, args.shape)
    for trainer in trainers:  # warm-up: allocator, kernels, torch.compile
        for src, tgt in batches[: args.warmup]:
            trainer.step(src, tgt)
    rates: dict[str, list[float]] = {trainer.name: [] for trainer in trainers}
    for _ in range(args.repeats):
        for trainer in trainers:  # interleaved windows
            synchronize(device)
            started, tokens = time.perf_counter(), 0
            for src, tgt in batches:
                tokens += trainer.step(src, tgt)
            synchronize(device)
            rates[trainer.name].append(tokens / (time.perf_counter() - started))
    del trainers
    flops = statistics.mean(
        flops_per_step(args.size, src.size(0), src.size(1), tgt.size(1) - 1) for src, tgt in batches)
    tokens = statistics.mean(int((tgt[:, 1:] != tl.PAD_ID).sum()) for _, tgt in batches)
    results = {}
    for name in MODELS:
        results[name] = {
            "tokens_per_s": summary(rates[name]),
            "model_flops_per_s": statistics.median(rates[name]) / tokens * flops,
            "peak_memory_mib": peak_memory_mib(name, args, device) if not args.no_memory else None,
        }
    return results


def benchmark_decoding(args: argparse.Namespace, device: torch.device) -> dict:
    model = make_model(args.size).to(device).eval()
    src = random_batches(1, args.size, (args.decode_batch, args.shape[1], 2))[0][0].to(device)  # (B, S)
    rates: dict[str, list[float]] = {"with KV cache": [], "without KV cache": []}
    with torch.autocast(device.type, dtype=DTYPES[args.dtype]) if DTYPES[args.dtype] else nullcontext():
        for use_cache in (True, False):  # warm-up
            beam_search(model, src, 1, max_len=4, eos_id=-1, use_cache=use_cache)
        for _ in range(args.repeats):
            for name, use_cache in (("with KV cache", True), ("without KV cache", False)):
                synchronize(device)
                started = time.perf_counter()
                out = beam_search(model, src, 1, max_len=args.decode_tokens, eos_id=-1,
                                  use_cache=use_cache)  # greedy; eos_id=-1: never stops early, exactly decode_tokens
                synchronize(device)
                assert out.shape == (src.size(0), args.decode_tokens), out.shape
                rates[name].append(out.numel() / (time.perf_counter() - started))
    return {name: {"tokens_per_s": summary(values)} for name, values in rates.items()}


def environment(device: torch.device) -> dict:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        commit = None
    return {"device": device.type, "device_name": name, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "commit": commit,
            "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def table(report: dict) -> str:
    """The results as a Markdown table, the way the performance appendix shows them."""
    lines = ["| model | target tokens/s (median, range) | vs torch.nn.Transformer | peak memory (MiB) | MFU |",
             "|---|---|---|---|---|"]
    train = report["training"]
    base = train["torch.nn.Transformer"]["tokens_per_s"]["median"]
    for name, r in train.items():
        t = r["tokens_per_s"]
        memory = "-" if r["peak_memory_mib"] is None else f"{r['peak_memory_mib']:,.0f}"
        mfu = r["model_flops_per_s"] / report["matmul_flops_per_s"]
        lines.append(f"| {name} | {t['median']:,.0f} ({t['min']:,.0f}-{t['max']:,.0f}) | "
                     f"{t['median'] / base:.2f}x | {memory} | {mfu:.1%} |")
    lines += ["", "| greedy decoding of {} tokens, library model, not compiled | generated tokens/s (median, range) |"
              .format(report["settings"]["decode_tokens"]), "|---|---|"]
    for name, r in report["decoding"].items():
        t = r["tokens_per_s"]
        lines.append(f"| {name} | {t['median']:,.1f} ({t['min']:,.1f}-{t['max']:,.1f}) |")
    return "\n".join(lines)


def _rates(value) -> bool:  # a summary() of tokens per second
    return isinstance(value, dict) and all(is_number(value.get(key)) and value[key] > 0
                                           for key in ("median", "min", "max"))


def _environment(value) -> bool:
    return (isinstance(value, dict) and all(isinstance(value.get(key), str) for key in ("device_name", "torch", "date"))
            and is_count(value.get("torch_threads"))
            and all(value.get(key) is None or is_number(value[key]) for key in ("load_average_at_start",
                                                                                "load_average_at_end")))


def _settings(value) -> bool:
    return (isinstance(value, dict) and value.get("size") in SIZES and value.get("dtype") in DTYPES
            and isinstance(value.get("compile"), bool)
            and all(is_count(value.get(key)) for key in ("repeats", "steps", "decode_tokens"))
            and isinstance(value.get("shape"), list) and len(value["shape"]) == 3
            and all(is_count(n) for n in value["shape"]))


# key -> (test, what is expected): what table() and benchmarks/tables.py read of a report
REPORT_FIELDS = {
    "environment": (_environment, "an object with device_name, torch_threads, torch, date and the load averages"),
    "settings": (_settings, "an object with size, dtype, compile, repeats, steps, decode_tokens and shape"),
    "matmul_flops_per_s": (lambda v: is_number(v) and v > 0, "a number > 0"),
    "training": (lambda v: isinstance(v, dict) and sorted(v) == sorted(MODELS) and all(
        isinstance(r, dict) and _rates(r.get("tokens_per_s")) and is_number(r.get("model_flops_per_s"))
        and "peak_memory_mib" in r and (r["peak_memory_mib"] is None or is_number(r["peak_memory_mib"]))
        for r in v.values()), f"an object of {', '.join(MODELS)}, each with tokens_per_s, model_flops_per_s and "
                               f"peak_memory_mib"),
    "decoding": (lambda v: isinstance(v, dict) and v != {} and all(
        isinstance(r, dict) and _rates(r.get("tokens_per_s")) for r in v.values()), "an object of tokens_per_s"),
}


def read_report(path: Path) -> dict:
    """The report in path, as main writes it with --json; one line naming the file and what is wrong otherwise."""
    report = read_json(Path(path), "benchmark report", "benchmarks/benchmark.py --json")
    problem = None if isinstance(report, dict) else f"holds a JSON {type(report).__name__}, not a report"
    for key, (test, expected) in REPORT_FIELDS.items():
        if problem is None and not test(report.get(key)):
            problem = f"has {key} {json.dumps(report.get(key))[:60]}, not {expected}"
    if problem is not None:
        raise ValueError(f"benchmark report {str(path)!r} {problem}; write it again with benchmarks/benchmark.py "
                         f"--json")
    return report


def is_report(path: Path) -> bool:
    """Whether path holds a report of this script, which --json may replace."""
    try:
        read_report(path)
    except (ValueError, OSError):
        return False
    return True


def device_problem(name: str) -> str | None:
    """Why --device NAME cannot be timed here (None when it can): only cpu, cuda[:N] and mps, and only if present."""
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        return f"--device must be a device such as cpu, cuda, cuda:1 or mps that this benchmark times, got {name!r}"
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        return (f"--device {name!r}: torch sees {torch.cuda.device_count()} CUDA GPUs here; use cpu, or one of "
                f"cuda:0 to cuda:{torch.cuda.device_count() - 1}" if torch.cuda.is_available() else
                f"--device {name!r}: torch sees no CUDA GPU here; use cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        return f"--device {name!r}: torch sees no Apple GPU (MPS) here; use cpu"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="small", help="model size (default: small)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: the best one here)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="autocast precision (default: fp32)")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model")
    parser.add_argument("--batch", default=None, help="SENTENCES,SRC_LEN,TGT_LEN (default: by size and device)")
    parser.add_argument("--steps", type=int, default=10, help="steps in one timed window (default: 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model first (default: 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed windows per model (default: 5)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens generated by greedy decoding")
    parser.add_argument("--decode-batch", type=int, default=16, help="sentences decoded at once (default: 16)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--json", type=Path, default=None, help="also write the full report to this file")
    parser.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("steps", "repeats", "decode_tokens", "decode_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.json is not None:
        try:  # never a folder, a link, a special file, a run's file or a file that is not a report of this script
            check_output_file(args.json, "--json", replaces=is_report, kind="a report of benchmarks/benchmark.py")
        except (ValueError, OSError) as error:
            parser.error(str(error))
    problem = None if args.device is None else device_problem(args.device)
    if problem is not None:
        parser.error(problem)
    if args.batch is not None:
        try:
            args.shape = tuple(int(part) for part in args.batch.split(","))
            assert len(args.shape) == 3 and min(args.shape) >= 2
        except (ValueError, AssertionError):
            parser.error(f"--batch must be three integers >= 2, SENTENCES,SRC_LEN,TGT_LEN, got {args.batch!r}")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        if args.batch is None:
            raise SystemExit("--memory-probe needs --batch")
        memory_probe(args)
        return None
    device = torch.device(args.device) if args.device else tl.get_device()
    if args.batch is None:
        args.shape = BATCHES[(args.size, "cpu" if device.type == "cpu" else "gpu")]
    if args.dtype == "fp16" and device.type == "cpu":
        raise SystemExit("--dtype fp16 needs a GPU: use fp32 or bf16 on a CPU")
    difference = check_same_function(args.size, device)
    peak_dtype = DTYPES[args.dtype] or torch.float32
    report = {
        "environment": environment(device),
        "settings": {key: value for key, value in vars(args).items() if key not in ("json", "memory_probe")}
        | {"shape": list(args.shape), "logit_difference_vs_torch": difference},
        "matmul_flops_per_s": matmul_rate(device, peak_dtype, MATMUL_SIZE[args.size == "tiny", device.type == "cuda"]),
        "training": benchmark_training(args, device),
        "decoding": benchmark_decoding(args, device),
    }
    report["settings"].pop("batch")
    if hasattr(os, "getloadavg"):
        report["environment"]["load_average_at_end"] = os.getloadavg()[0]  # other work on the machine, if any
    env = report["environment"]
    print(f"{args.size} model, {args.dtype}{', compiled' if args.compile else ''}, batch {args.shape} on "
          f"{env['device_name']} ({env['torch_threads']} threads), torch {env['torch']}, {env['date']}; "
          f"measured {args.dtype} matmul rate {report['matmul_flops_per_s'] / 1e12:.3g} TFLOP/s")
    print(table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.json, json.dumps(report, indent=1, default=str) + "\n")  # never through a link
    return report


if __name__ == "__main__":
    main()
