"""flashd vs llama.cpp on the same GGUF and the same GPU, in one run.

Builds llama.cpp's llama-bench from the source vendored in the llama-cpp-python sdist (CUDA, the
local GPU's arch; cached in --build-dir), runs it with flash attention on and all layers on the
GPU, runs `flashd bench`'s tests in process on the same model, and prints the ratio table:

    python bench/compare_llama_cpp.py --sdist llama_cpp_python-0.3.36.tar.gz \
        --model qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--model ...] --out bench/results/

Tests: pp512, pp8192, tg128, tg128 at depth 8192 (llama-bench -p 512,8192 -n 128 -d 0,8192).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from flashd.bench.out_files import commit_label, file_label


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build_llama_bench(sdist: Path, build_dir: Path, arch: str, jobs: int) -> Path:
    exe = build_dir / "build" / "bin" / "llama-bench"
    if exe.exists():
        return exe
    src = build_dir / "src"
    if not src.exists():
        log(f"extracting {sdist.name}")
        with tarfile.open(sdist) as tar:
            tar.extractall(build_dir / "sdist")
        vendored = next((build_dir / "sdist").glob("*/vendor/llama.cpp"))
        shutil.move(str(vendored), src)
    # arch "cpu": no CUDA, for checking the tools' command lines on a machine without a GPU (bench_spec)
    gpu = ["-DGGML_CUDA=OFF"] if arch == "cpu" else ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    cmake = ["cmake", "-S", str(src), "-B", str(build_dir / "build"), *gpu, "-DLLAMA_CURL=OFF",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]
    if shutil.which("ninja"):
        cmake += ["-G", "Ninja"]
    log("configuring llama.cpp: " + " ".join(cmake))
    subprocess.run(cmake, check=True, stdout=subprocess.DEVNULL)
    log("building llama-bench")
    subprocess.run(["cmake", "--build", str(build_dir / "build"), "--target", "llama-bench", "-j", str(jobs)],
                   check=True, stdout=subprocess.DEVNULL)
    return exe


def run_llama_bench(exe: Path, model: Path, prompts: str, gens: str, depths: str, reps: int) -> dict[str, float]:
    cmd = [str(exe), "-m", str(model), "-p", prompts, "-n", gens, "-d", depths, "-fa", "1", "-ngl", "99",
           "-r", str(reps), "-o", "json"]
    log("running " + " ".join(cmd))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    result = {}
    for r in rows:
        n_p, n_g, depth = r["n_prompt"], r["n_gen"], r.get("n_depth", 0)
        name = f"pp{n_p}" if n_g == 0 else f"tg{n_g}"
        if depth:
            name += f"@d{depth}"
        result[name] = float(r["avg_ts"])
    return result


def run_flashd(model: Path, tests: list[str], reps: int, max_ctx: int, tuning: str = ""):
    from flashd.daemon.backends.cuda.backend import measure_copy_gbs
    from flashd.daemon.bench import run_bench
    from flashd.daemon.bench_cli import apply_tuning, parse_tuning
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine

    engine = Engine(EngineConfig(model=str(model), device="cuda", max_ctx=max_ctx, prefix_cache=False))
    apply_tuning(engine.backend, parse_tuning(tuning))    # before the load: graphs are captured with it
    engine.load()
    copy_gbs = measure_copy_gbs(engine.backend.device)
    embd = engine.model.file.tensor("token_embd.weight").n_bytes
    res = run_bench(engine.runner, engine.model.config, tests, reps=reps, weight_bytes=engine.model.file_weight_bytes,
                    embd_bytes=embd, copy_gbs=copy_gbs, log=log)
    info = {**engine.backend.info(), "tuning": engine.backend.device.native.tuning()}
    vram = engine.plan.total_bytes
    engine.runner.close()
    return res, info, copy_gbs, vram


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help="llama_cpp_python-*.tar.gz (its vendor/llama.cpp is built)")
    ap.add_argument("--llama-bench", type=Path, help="an already built llama-bench (skips the build)")
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/llama-cpp-build"))
    ap.add_argument("--arch", default="90", help="CMAKE_CUDA_ARCHITECTURES ('cpu': build without CUDA)")
    ap.add_argument("--model", type=Path, action="append", required=True)
    ap.add_argument("-p", default="512,8192")
    ap.add_argument("-n", default="128")
    ap.add_argument("-d", default="0,8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-llama", action="store_true", help="flashd only")
    ap.add_argument("--tuning", default="", metavar="FIELD=N,...",
                    help="flashd's CUDA launch tuning overrides (flashd_tuning.h), e.g. gemv_rows=0: set before the "
                         "load; the title of each table lists the tuning in effect")
    ap.add_argument("--build-only", action="store_true", help="build llama-bench and exit")
    ap.add_argument("--out", type=Path, default=None, help="folder for the markdown + json result")
    args = ap.parse_args(argv)

    ints = lambda s: [int(x) for x in s.split(",") if x]   # noqa: E731
    tests = [f"pp{n}" for n in ints(args.p)] + [f"tg{n}" + (f"@d{d}" if d else "") for n in ints(args.n)
                                                   for d in ints(args.d)]
    max_ctx = max(ints(args.p) + [n + max(d, 1) + 1 for n in ints(args.n) for d in ints(args.d)])
    exe = args.llama_bench
    if not args.skip_llama and exe is None:
        if args.sdist is None:
            ap.error("--sdist or --llama-bench is required (or --skip-llama)")
        exe = build_llama_bench(args.sdist, args.build_dir, args.arch, os.cpu_count() or 8)
    if args.build_only:
        print(exe)
        return 0

    sections, records = [], []
    commit = commit_label()
    for model in args.model:
        ours, info, copy_gbs, vram = run_flashd(model, tests, args.reps, max_ctx, args.tuning)
        theirs = {} if args.skip_llama else run_llama_bench(exe, model, args.p, args.n, args.d, args.reps)
        lines = [f"### {model.name} on {info['name']}",
                 f"flashd commit {commit}, {datetime.date.today()}, device copy bandwidth {copy_gbs:.0f} GB/s, "
                 f"flashd VRAM plan {vram / 2**30:.2f} GiB; tuning "
                 + ", ".join(f"{k}={v}" for k, v in info["tuning"].items()), "",
                 "| test | llama.cpp t/s | flashd t/s | flashd / llama.cpp | flashd % roofline |",
                 "| --- | ---: | ---: | ---: | ---: |"]
        for r in ours:
            base = theirs.get(r.test)
            ratio = f"{r.tok_s / base:.2f}x" if base else "n/a"
            pct = f"{r.roofline_pct:.1f}%" if r.roofline_pct is not None else ""
            lines.append(f"| {r.test} | {base or float('nan'):.1f} | {r.tok_s:.1f} | {ratio} | {pct} |")
            records.append({"model": model.name, "gpu": info["name"], "test": r.test, "flashd_tok_s": r.tok_s,
                            "llama_cpp_tok_s": base, "roofline_pct": r.roofline_pct, "commit": commit,
                            "date": str(datetime.date.today()), "copy_gbs": copy_gbs, "tuning": info["tuning"]})
        sections.append("\n".join(lines))
    text = "\n\n".join(sections)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.date.today().isoformat()
        (args.out / f"compare-{stamp}-{file_label(commit)}.md").write_text(text + "\n")
        (args.out / f"compare-{stamp}-{file_label(commit)}.json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
