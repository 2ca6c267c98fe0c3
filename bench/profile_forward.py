"""Where a persistent forward's time goes, from timestamps recorded inside the kernel (fd_forward_profile).

Thread 0 of every CTA stamps each stage four times (globaltimer, ns): when it reached the stage, when its
work began (after waiting for the previous stage), when its activations were staged (GEMV stages), when it
finished. Per stage this prints the time
from the previous stage's last finish to this stage's last finish (its share of the critical path), the
median wait and work of the CTAs that had items, and the totals per stage kind.

    python bench/profile_forward.py MODEL.gguf [--rows 1] [--depth 128] [--out DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

KINDS = ["QKV", "ATTN", "O", "GU", "DOWN"]      # forward.cu's stages per layer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5, help="profiled forwards; the median per stage is reported")
    ap.add_argument("--tuning", action="append", default=[], metavar="FIELD=INT",
                    help="override a ForwardTuning field of the architecture's table entry (A/B runs)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)

    from flashd.daemon.backends.cuda.backend import CudaBackend
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.models.weights import total_weight_bytes

    backend = CudaBackend()
    f, cfg = open_model(a.model)
    max_ctx = a.depth + a.rows + 64
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, 512)
    lm = load_model((f, cfg), backend.ops.load_weight)
    runner = backend.make_runner(cfg, lm.weights, max_ctx, 512, plan)
    if a.tuning:
        import dataclasses
        from flashd.daemon.backends.cuda.persistent import PersistentForward, tuning_for
        tun = dataclasses.replace(tuning_for(backend.info()["cc"]),
                                  **{k: int(v) for k, v in (t.split("=", 1) for t in a.tuning)})
        if runner.persistent is not None:
            runner.persistent.close()
        runner.persistent = PersistentForward(backend.ops, cfg, lm.weights, runner.cache, tun)
    pf = runner.persistent
    if pf is None:
        raise SystemExit(f"no persistent forward: {runner.forward_note}")
    dev, lib, ffi = runner.dev, runner.dev.lib, runner.dev.ffi
    info = ffi.new("fd_forward_info_t*")
    dev.native.check(lib.fd_forward_info(pf._plan, info), "fd_forward_info")
    n_stages, n_ctas = int(info.n_stages), int(info.n_ctas)
    stamps_ptr = int(ffi.cast("uintptr_t", info.stamps))
    from flashd.daemon.backends.cuda.tensor import DeviceTensor
    stamps_t = DeviceTensor(stamps_ptr, (n_stages, n_ctas, 4), np.dtype(np.uint64), pf)
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(a.reps):
        runner.reset()
        runner.prefill(rng.integers(100, cfg.vocab_size - 100, a.depth).tolist())
        n = a.rows
        runner._will_write(n)
        dev.upload(np.array(rng.integers(100, cfg.vocab_size - 100, n), np.int32), out=runner.t_ids[:n])
        dev.upload(np.arange(a.depth, a.depth + n, dtype=np.int32), out=runner.t_pos[:n])
        dev.upload(np.array([a.depth], np.int32), out=runner.t_n_past)
        dev.upload(np.tril(np.ones((n, n), np.uint8)).reshape(-1), out=runner.t_mask[:n * n])
        dev.fill_bytes(stamps_t, 0)
        dev.native.check(lib.fd_forward_profile(pf._plan, 1), "profile on")
        pf.forward(runner.t_ids[:n], runner.t_pos[:n], runner.t_n_past, mask=runner.t_mask, mask_n=n)
        dev.native.check(lib.fd_forward_profile(pf._plan, 0), "profile off")
        runs.append(dev.download(stamps_t).astype(np.int64))
    names = [f"{KINDS[k % len(KINDS)]}{k // len(KINDS)}" for k in range(n_stages - 1)] + ["LM"]
    per_run = []
    for st in runs:
        t0 = st[0, :, 0].min()
        done = st[:, :, 3].max(axis=1) - t0
        span = np.diff(np.concatenate([[0], done]))
        worked = st[:, :, 1] > 0
        wait = np.where(worked, st[:, :, 1] - st[:, :, 0], 0)
        work = np.where(worked, st[:, :, 3] - st[:, :, 1], 0)
        stage_x = np.where(worked, st[:, :, 2] - st[:, :, 1], 0)
        med_wait = np.array([np.median(wait[k][worked[k]]) if worked[k].any() else 0 for k in range(n_stages)])
        med_work = np.array([np.median(work[k][worked[k]]) if worked[k].any() else 0 for k in range(n_stages)])
        max_work = work.max(axis=1)
        med_x = np.array([np.median(stage_x[k][worked[k]]) if worked[k].any() else 0 for k in range(n_stages)])
        per_run.append((done[-1], span, med_wait, med_work, max_work, worked.sum(axis=1), med_x))
    total = np.median([r[0] for r in per_run]) / 1e3
    span = np.median([r[1] for r in per_run], axis=0) / 1e3
    mwait = np.median([r[2] for r in per_run], axis=0) / 1e3
    mwork = np.median([r[3] for r in per_run], axis=0) / 1e3
    xwork = np.median([r[4] for r in per_run], axis=0) / 1e3
    ctas = per_run[0][5]
    mx = np.median([r[6] for r in per_run], axis=0) / 1e3
    lines = [f"# Persistent forward profile: {cfg.name or Path(a.model).name}, {a.rows} row(s) at depth {a.depth}",
             "", f"{backend.info()['name']}; plan {pf.info()}", "",
             f"whole forward (first stamp to last finish): {total:.1f} us (median of {a.reps})", "",
             "| kind | stages | critical path us | share | median wait us | median work us | of which staging x | max work us |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind in KINDS + ["LM"]:
        idx = [i for i, nm in enumerate(names) if nm.rstrip("0123456789") == kind]
        lines.append(f"| {kind} | {len(idx)} | {span[idx].sum():.1f} | {100 * span[idx].sum() / max(total, 1e-9):.1f}% | "
                     f"{np.mean(mwait[idx]):.2f} | {np.mean(mwork[idx]):.2f} | {np.mean(mx[idx]):.2f} | "
                     f"{np.mean(xwork[idx]):.2f} |")
    lines += ["", "| stage | CTAs with items | critical path us | median wait us | median work us | max work us |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for i in list(range(min(12, n_stages - 1))) + [n_stages - 1]:
        lines.append(f"| {names[i]} | {ctas[i]} | {span[i]:.2f} | {mwait[i]:.2f} | {mwork[i]:.2f} | {xwork[i]:.2f} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"forward-profile-{Path(a.model).stem}-r{a.rows}-d{a.depth}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
