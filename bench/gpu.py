"""The GPU layer on a real GPU: CUPTI kernel sketches, CUDA-event phase timing, NVML, the
always-on overhead and a straggler, one JSON line per part.

A small GPT (built here from a config, bf16 autocast, one GPU) is trained with the rank agent
attached (``RankAgent`` as ``argus.attach`` builds it, publishing into memory: the GPU
machine has no broker). Each part runs in a process of its own, so a driver or CUPTI fault
in one cannot take the others down; a part that fails says why in its JSON line.

- ``cupti``: the agent with all three layers; the CUPTI activity records the collector
  received are kept beside the sketches it emitted (a tee on ``CuptiCollector.feed``), so
  the sketches' p50/p90/p99 are compared with numpy's exact quantiles of the *same* records
  (kernels with >= 20 calls in a step, as ``bench/compression.py``); counts and totals must
  be exact. ``sketch_ratio`` is the raw events' bytes as Kineto writes them (JSON) over the
  sketches' and names' bytes. ``cupti_dropped``: records CUPTI dropped for want of a buffer
  (``cuptiActivityGetNumDroppedRecords``) plus records no step tag reached.
- ``events``: the agent's CUDA-event phase times (forward, backward, optimizer: cupti off,
  since Kineto and cupti-python cannot both own CUPTI's activity callbacks) against
  torch.profiler on the *same* steps: each phase is a ``record_function`` range, its GPU time
  the span of the kernels launched inside it (runtime calls matched by correlation id).
- ``nvml``: every field the node agent emits, sampled each second for 30 s while a matmul
  loads the GPU (run beside ``cupti`` and ``events``, which only compare records with
  records); DCGM's name and unit for each; what the driver or container refuses is listed.
- ``overhead``: blocks of steps with the agent (all three layers) and without, side by side
  in rounds off/on/on/off (or the mirror), a fresh agent per block, the first step of a
  block untimed; torch.profiler the same way in a process of its own. Medians of the
  rounds' ratios and their standard errors.
- ``straggler``: two processes on the one GPU (under CUDA MPS where the machine has it:
  without it the GPU time-slices the two contexts and both ranks slow together), data
  parallel by hand (the gradients all-reduced over gloo each step), rank 1 slowed by a GPU
  busy-wait kernel (``torch.cuda._sleep``, which every rank runs, ~10 us on the healthy
  ones) in its forward for a stretch of steps; the records of both agents go through the
  one engine with the kernel level (the stream worker's ``EvidenceHistory``); it must name
  rank 1 with kernel evidence.

Without a CUDA device it runs the part that needs none (the sketch-vs-exact comparison on
cupti-python records built here, through the same code) and says in one line that the rest
needs CUDA. ``--out DIR`` writes ``gpu.jsonl`` (every part's line) there.

    python bench/gpu.py [--quick | --smoke] [--out DIR] [--parts cupti,events,...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

from bench.gpu_parts.events import part_events, profiler_phase_ms
from bench.gpu_parts.kernels import cupti_shaped, part_cupti, sketch_accuracy
from bench.gpu_parts.model import SIZES, Size
from bench.gpu_parts.nvml import part_nvml
from bench.gpu_parts.overhead import part_overhead
from bench.gpu_parts.straggler import part_straggler, replay, straggler_rank

__all__ = [  # the parts' names, for the tests that load this script (tests/helpers/bench.py)
    "SIZES",
    "Size",
    "cupti_shaped",
    "part_cupti",
    "part_events",
    "part_nvml",
    "part_overhead",
    "part_straggler",
    "profiler_phase_ms",
    "replay",
    "sketch_accuracy",
    "straggler_rank",
]

PARTS = ("cupti", "events", "nvml", "overhead", "straggler")


# -- driver ---------------------------------------------------------------------------------
def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, f"no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda})"
    return True, f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def run_part(name: str, size: Size, out: Path, device: str) -> dict[str, Any]:
    """One part in this process (the driver runs each in a child)."""
    t0 = time.perf_counter()
    try:
        if name == "cupti":
            res = part_cupti(size, device)
        elif name == "events":
            res = part_events(size, device)
        elif name == "nvml":
            res = part_nvml(size, device)
        elif name == "overhead":
            # within the part's 400 s: the agent as it ships first, then with every step's
            # kernels traced and with CUPTI off (what each layer costs), then torch.profiler
            res = part_overhead(size, device, "agent", budget_s=110)
            alt = {
                name: part_overhead(size, device, "agent", size.rounds // 2, budget_s=40, **cfg)
                for name, cfg in (("every_step", {"kernel_every": 1}), ("no_cupti", {"cupti": False}))
            }
            prof = part_overhead(size, device, "profiler", max(2, size.rounds // 4), budget_s=40)
            res = {
                "overhead_gpu_pct": res["overhead_pct"],
                "overhead_gpu_se_pct": res["overhead_se_pct"],
                **{f"overhead_{t}_gpu_pct": a["overhead_pct"] for t, a in alt.items()},
                **{f"overhead_{t}_gpu_se_pct": a["overhead_se_pct"] for t, a in alt.items()},
                "profiler_overhead_gpu_pct": prof["overhead_pct"],
                "profiler_overhead_gpu_se_pct": prof["overhead_se_pct"],
                "agent": res,
                **{f"agent_{t}": a for t, a in alt.items()},
                "profiler": prof,
            }
        elif name == "straggler":
            res = part_straggler(size, device, out)
        else:
            raise ValueError(f"unknown part {name!r}")
    except Exception as exc:  # one part's failure is its line, not the run's end
        import traceback

        res = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    return {"part": name, "device": device, "seconds": round(time.perf_counter() - t0, 1), **res}


@contextlib.contextmanager
def _child(
    name: str, size_name: str, out: Path, timeout: float, cpu: bool
) -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen(
        [sys.executable, __file__, "--one", name, "--size", size_name, "--out", str(out), *(["--cpu"] * cpu)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield p
    finally:
        if p.poll() is None:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _line(p: subprocess.Popen[str], name: str) -> dict[str, Any]:
    out = p.stdout.read() if p.stdout else ""
    p.wait()
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"part": name, "error": f"the part's process exited {p.returncode} without a result"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="folder for gpu.jsonl")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument(
        "--cpu", action="store_true", help="run every part on the CPU (the code paths, not the figures)"
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--size", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-of-straggler", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--to", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.out is None and not (args.one or args.rank_of_straggler is not None):
        with tempfile.TemporaryDirectory(prefix="argus-gpu-") as tmp:  # gpu.jsonl goes with it
            args.out = Path(tmp)
            _main(args)
        return
    _main(args)


def _main(args: argparse.Namespace) -> None:
    size_name = args.size or ("smoke" if args.smoke else "quick" if args.quick else "full")
    size = SIZES[size_name]
    out = args.out or Path(tempfile.gettempdir())
    out.mkdir(parents=True, exist_ok=True)
    if args.rank_of_straggler is not None:
        straggler_rank(args.rank_of_straggler, args.steps, args.to, "cpu" if args.cpu else "cuda")
        return
    if args.one:
        device = "cuda" if _cuda()[0] and not args.cpu else "cpu"
        print(json.dumps(run_part(args.one, size, out, device), default=str), flush=True)
        return
    ok, why = _cuda()
    wanted = [p for p in args.parts.split(",") if p]
    if not ok and not args.cpu:
        wanted = [p for p in wanted if p == "cupti"]  # its pure half needs no GPU
    results: list[dict[str, Any]] = []

    def run(name: str) -> None:
        with _child(name, size_name, out, 400, args.cpu) as p:
            results.append(_line(p, name))
        print(json.dumps(results[-1], default=str), flush=True)

    # nvml beside cupti and events (they compare records with records, not times)
    beside = [p for p in wanted if p in ("cupti", "events")] if "nvml" in wanted else []
    if "nvml" in wanted:
        with _child("nvml", size_name, out, 120, args.cpu) as nv:
            for name in beside:
                run(name)
            results.append(_line(nv, "nvml"))
            print(json.dumps(results[-1], default=str), flush=True)
    for name in [p for p in wanted if p != "nvml" and p not in beside]:
        run(name)
    summary = _summary(results, ok, why)
    _table(results)
    (out / "gpu.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in [*results, summary]))
    if not ok:
        print(f"gpu-check: stopped where CUDA is needed: {why}")
    print(json.dumps(summary, default=str))


def _summary(results: list[dict[str, Any]], cuda: bool, why: str) -> dict[str, Any]:
    by = {r["part"]: r for r in results}
    keys = {
        "cupti": (
            "sketch_ratio",
            "sketch_p99_err_max",
            "kernels_per_step",
            "cupti_dropped",
            "cupti_untagged",
        ),
        "events": ("event_vs_profiler_pct",),
        "nvml": ("nvml_fields_ok", "nvml_fields_refused"),
        "overhead": (
            "overhead_gpu_pct",
            "overhead_gpu_se_pct",
            "profiler_overhead_gpu_pct",
            "profiler_overhead_gpu_se_pct",
        ),
        "straggler": ("gpu_straggler_named",),
    }
    out: dict[str, Any] = {"cuda": cuda, "device": why}
    for part, ks in keys.items():
        for k in ks:
            out[k] = by.get(part, {}).get(k)
    # every step traced and CUPTI off, beside the default's figures
    over = by.get("overhead", {})
    out.update({k: v for k, v in over.items() if k.startswith("overhead_") and k not in out})
    cupti = by.get("cupti", {})
    out.update({k: cupti.get(k) for k in ("counts_totals_exact", "step_ms", "toggle_us_mean")})
    for name, sub in cupti.items():
        if isinstance(sub, dict) and "tagging" in sub:
            for k in (
                "cupti_untagged",
                "cupti_dropped",
                "sketch_p99_err_max",
                "counts_totals_exact",
                "step_ms",
            ):
                out[f"{name}_{k}"] = sub.get(k)
    out["errors"] = {r["part"]: r["error"] for r in results if "error" in r}
    return out


def _table(results: list[dict[str, Any]]) -> None:
    print(f"{'part':<10} {'s':>6}  figures")
    for r in results:
        figs = {
            k: v
            for k, v in r.items()
            if k not in ("part", "seconds", "fields", "anomalies", "trace", "agent", "profiler")
            and not isinstance(v, dict)
        }
        text = ", ".join(f"{k}={_fmt(v)}" for k, v in figs.items())
        print(f"{r['part']:<10} {r.get('seconds', 0):>6}  {text[:400]}")


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
