"""`python -m bench.peers`: run the peer benchmark and write the report."""

from __future__ import annotations

import argparse
import logging
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.peers.approaches import APPROACHES
from bench.peers.models import MODELS, default_size
from bench.peers.run import BUDGETS, REPO, Settings, run_model

RESULTS = REPO / "bench" / "results"

# --quick: sizes that keep one model's whole run in under 10 minutes on 2 CPU cores, yet large enough that the
# blocks' activations, not the vocabulary-sized gradient transients of the tied embeddings (147 MiB for GPT-2,
# held through the whole backward), set the keep-all peak: at GPT-2 batch 1 x 128 tokens they set all of it.
QUICK = {"gpt2": (1, 512), "bert-base": (1, 512), "vit-base": (2, 224), "resnet50": (4, 128)}
# The full run: realistic training shapes (meant for a GPU, or an hour of CPU per model).
FULL = {"gpt2": (4, 1024), "bert-base": (8, 512), "vit-base": (32, 224), "resnet50": (32, 224)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument(
        "--model",
        action="append",
        choices=[*MODELS, "all"],
        help="model to run (repeat for several; 'all' = every model). Default gpt2.",
    )
    p.add_argument("--quick", action="store_true", help="small batch / sequence and few steps")
    p.add_argument("--batch-size", type=int, help="batch size (default: per model, see --quick)")
    p.add_argument("--size", type=int, help="sequence length (text) or image side (vision)")
    p.add_argument("--steps", type=int, help="timed steps per run (median is reported); default 3 quick, 5 full")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps per run (compilation happens here)")
    p.add_argument(
        "--budgets",
        default=",".join(str(b) for b in BUDGETS),
        help="fractions of keep-all activation memory, comma separated",
    )
    p.add_argument(
        "--approaches", default=",".join(APPROACHES), help="comma separated subset of " + ", ".join(APPROACHES)
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: 1 with --quick on CPU, else torch's)")
    p.add_argument("--time-limit", type=float, help="memsched's exact-solver limit per budget, s (20 quick, 60 full)")
    p.add_argument(
        "--compile-reference",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run torch.compile at budget 1.0 (default: on for the full run, off with --quick)",
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from the results files")
    p.add_argument("--no-report", action="store_true", help="do not rebuild the report")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _settings(a: argparse.Namespace, model: str, command: str) -> Settings:
    preset = (QUICK if a.quick else FULL)[model]
    approaches = tuple(x.strip() for x in a.approaches.split(",") if x.strip())
    unknown = [x for x in approaches if x not in APPROACHES]
    if unknown:
        raise SystemExit(f"error: unknown approach {unknown}; choose from {', '.join(APPROACHES)}")
    return Settings(
        model=model,
        batch_size=a.batch_size or preset[0],
        size=a.size or preset[1] or default_size(model),
        steps=a.steps or (3 if a.quick else 5),
        warmup=a.warmup,
        budgets=tuple(float(b) for b in a.budgets.split(",")),
        approaches=approaches,
        device=a.device,
        # One thread for --quick on CPU: on a shared machine OpenMP workers spin while waiting for a core, which
        # inflates both wall and CPU time; a single thread's CPU time is what the step costs.
        threads=a.threads or (1 if a.quick and a.device == "cpu" else None),
        solve_time_limit_s=a.time_limit or (20.0 if a.quick else 60.0),
        compile_reference=(not a.quick) if a.compile_reference is None else a.compile_reference,
        command=command,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if a.verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    models = a.model or ["gpt2"]
    if "all" in models:
        models = list(MODELS)
    command = "python -m bench.peers " + shlex.join(argv)
    if not a.report_only:
        if len(models) == 1:
            t0 = time.perf_counter()
            path = run_model(_settings(a, models[0], command), a.out)
            print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
        else:
            # One process per model: allocator state, compile caches and thread pools do not leak between them.
            rest = _drop_model_flags(argv)
            for m in models:
                cmd = [sys.executable, "-m", "bench.peers", "--model", m, "--no-report", *rest]
                print("+", shlex.join(cmd), flush=True)
                rc = subprocess.run(cmd, cwd=REPO, check=False).returncode
                if rc != 0:
                    print(f"{m}: exit {rc}; continuing with the other models", file=sys.stderr)
    if not a.no_report:
        from bench.peers.report import write_report

        print(f"wrote {write_report(a.out)}")
    return 0


def _drop_model_flags(argv: list[str]) -> list[str]:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        if x == "--model":
            skip = True
            continue
        if x.startswith("--model="):
            continue
        out.append(x)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
