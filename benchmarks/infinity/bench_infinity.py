#!/usr/bin/env python3
"""Train what does not fit (issue 8's proof): zero-train on 2 CPU ranks with
ZeRO stage 3, parameters and optimizer state on NVMe (offload_param nvme +
offload_optimizer nvme) and activation checkpointing, for a GPT whose training
state (16 bytes x params: fp32 params 4 + grads 4 + AdamW moments 8) is a
multiple of this machine's RAM.

  /usr/bin/python3 benchmarks/infinity/bench_infinity.py --build build \\
      --dir /work/zero-infinity --n-layer 64 --d-model 2048 --steps 4 --json infinity.json

Before training it prints the arithmetic (parameters, state / RAM, FLOPs and
NVMe bytes per step, disk needed) and refuses to start when the disk cannot
hold the swap files. Per step it prints: wall time, loss, the NVMe bytes each
rank's engine read and wrote (its offload reports) and the block-layer bytes
the kernel counted for the rank processes (/proc/PID/io), the peak RSS of each
rank (VmHWM) against RAM / ranks, and the engine's memory report per rank.

The peer: after training (the engine's swap files are gone by then), the
same number of ranks run a raw O_DIRECT loop at once, each its own file in the
same directory, moving the bytes a median step moved on that rank: a first
write of the file (fallocate'd, like the store), an overwrite (what a step's
write-back is), then reads of the step's read volume. raw time of a step =
its written bytes / raw overwrite GB/s + its read bytes / raw read GB/s;
"disk-bound" = raw time / step time (1.0: the step took exactly as long as
the disk needs to move its bytes; lower: compute, communication or waiting
that the I/O did not hide). --raw-fraction < 1 moves that fraction of the
volume (the rates are then those of the smaller volume; said in the output).

The swap directory is created by the benchmark (a fresh subdirectory of
--dir) and removed at the end, whatever happened. Writes a JSON beside the
human table (--json). Not a test: at full size it runs for many minutes.
"""
import argparse
import datetime
import json
import mmap
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GB = 1e9
GIB = float(1 << 30)
MIB = float(1 << 20)


# ------------------------------------------------------------------ arithmetic
def gpt_params(n_layer, d, seq, vocab):
    """The parameter count of model/gpt_params.c's GPT: tied wte (vocab x d),
    wpe (seq x d), per block 12 d^2 + 13 d (ln_1, c_attn, c_proj, ln_2, c_fc,
    mlp c_proj with biases), ln_f."""
    return vocab * d + seq * d + n_layer * (12 * d * d + 13 * d) + 2 * d


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def plan(a):
    P = gpt_params(a.n_layer, a.d_model, a.seq_len, 256)
    S = P / a.ranks                               # shard elements per rank (padding ignored here)
    tokens = a.micro_batch * a.seq_len            # per rank per step
    # 6 P T for forward + backward, plus one more forward of every block (recomputation)
    block_p = 12 * a.d_model ** 2
    flops = 6 * P * tokens + (2 * block_p * a.n_layer * tokens if not a.no_activation_checkpointing else 0)
    # NVMe per rank per step, fp32: the parameter shard read at the forward and
    # at the backward gather (4 B), the optimizer chunks [master|m|v] read and
    # written (12 B), the updated parameter chunks written (4 B).
    read = S * (2 * 4 + 12)
    written = S * (12 + 4)
    return dict(params=P, state_bytes=16 * P, shard_numel=S, tokens_per_rank=tokens, flops_per_rank=flops,
                nvme_bytes_per_rank=S * 16, est_read_per_rank=read, est_written_per_rank=written,
                gacc_bytes_per_rank=4 * S)


# ------------------------------------------------------------------ raw O_DIRECT peer
def raw_worker(path, write_bytes, read_bytes, block, phase_fd_r, phase_fd_w):
    """One rank's raw loop (a subprocess). Phases run when the parent says
    so (one byte on a pipe), so every rank does each phase at the same time;
    prints one JSON line of timings."""
    bs = block
    nblk = max(1, write_bytes // bs)
    size = nblk * bs
    buf = mmap.mmap(-1, bs)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(4096) * (bs // 4096))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    out = {"file_bytes": size}
    try:
        os.posix_fallocate(fd, 0, size)  # like the store: preallocated, unwritten extents
        for phase in ("first_write", "overwrite", "read"):
            os.read(phase_fd_r, 1)
            t = time.perf_counter()
            if phase == "read":
                n = max(1, read_bytes // bs)
                for i in range(n):
                    got = os.preadv(fd, [buf], (i % nblk) * bs)
                    if got != bs:
                        raise RuntimeError("short read %d at block %d" % (got, i))
                out["read_bytes"] = n * bs
            else:
                for i in range(nblk):
                    if os.pwrite(fd, buf, i * bs) != bs:
                        raise RuntimeError("short write at block %d" % i)
                os.fsync(fd)
                out[phase + "_bytes"] = size
            out[phase + "_s"] = time.perf_counter() - t
            os.write(phase_fd_w, b"x")
    finally:
        os.close(fd)
        os.unlink(path)
    print(json.dumps(out), flush=True)


def raw_peer(directory, per_rank, block):
    """per_rank: [(write_bytes, read_bytes)] per rank, run at once."""
    procs, pipes = [], []
    for r, (w, rd) in enumerate(per_rank):
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--raw-worker",
                              os.path.join(directory, "raw-%d.bin" % r), str(int(w)), str(int(rd)), str(block),
                              str(go_r), str(done_w)], pass_fds=(go_r, done_w), stdout=subprocess.PIPE, text=True)
        os.close(go_r)
        os.close(done_w)
        procs.append(p)
        pipes.append((go_w, done_r))
    walls = {}
    for phase in ("first_write", "overwrite", "read"):
        t = time.perf_counter()
        for go_w, _ in pipes:
            os.write(go_w, b"x")
        for _, done_r in pipes:
            if os.read(done_r, 1) != b"x":
                raise RuntimeError("raw worker died in phase " + phase)
        walls[phase + "_s"] = time.perf_counter() - t
    ranks = []
    for p in procs:
        o, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError("raw worker failed: rc %d" % p.returncode)
        ranks.append(json.loads(o.strip().splitlines()[-1]))
    for go_w, done_r in pipes:
        os.close(go_w)
        os.close(done_r)
    tot = {k: sum(r[k + "_bytes"] for r in ranks) for k in ("first_write", "overwrite", "read")}
    return dict(block_bytes=block, ranks=ranks, wall=walls, bytes=tot,
                gbps={k: tot[k] / walls[k + "_s"] / GB for k in tot})


# ------------------------------------------------------------------ the run
def config(a, swap):
    L = a.n_layer
    z = {
        "stage": 3,
        "overlap_comm": True,
        "reduce_bucket_size": int(a.bucket),
        "allgather_bucket_size": int(a.bucket),
        "stage3_prefetch_bucket_size": int(a.prefetch),
        "stage3_max_live_parameters": int(a.max_live),
        "stage3_param_persistence_threshold": 4096,
        "sub_group_size": int(a.sub_group),
        "offload_optimizer": {"device": "nvme", "nvme_path": swap, "buffer_count": a.opt_buffers},
        "offload_param": {"device": "nvme", "nvme_path": swap, "buffer_count": a.param_buffers,
                          "buffer_size": int(a.bucket)},
    }
    c = {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "scheduler": None,
        "zero_optimization": z,
        "aio": {"block_size": a.aio_block, "queue_depth": a.aio_qd},
        "model": {"n_layer": L, "n_head": a.n_head, "d_model": a.d_model, "seq_len": a.seq_len, "vocab": 256},
        "train": {"steps": a.steps, "seed": 1234, "log_every": 1, "comm_timeout_s": a.comm_timeout},
    }
    if not a.no_activation_checkpointing:
        c["activation_checkpointing"] = {"number_checkpoints": L}
    return c


def descendants(pid):
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2:].split()[1])
            kids.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for k in kids.get(p, []):
            out.append(k)
            todo.append(k)
    return out


def proc_sample(pid):
    """(read_bytes, write_bytes, VmHWM, VmRSS) of a process, or None."""
    try:
        io = {}
        with open("/proc/%d/io" % pid) as f:
            for line in f:
                k, v = line.split(":")
                io[k] = int(v)
        hwm = rss = 0
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        return io["read_bytes"], io["write_bytes"], hwm, rss
    except (OSError, KeyError, ValueError):
        return None


def rank_pids(mpirun_pid):
    out = []
    for p in descendants(mpirun_pid):
        try:
            with open("/proc/%d/comm" % p) as f:
                if f.read().strip() == "zero-train":
                    out.append(p)
        except OSError:
            pass
    return sorted(out)


def run_train(a, swap, work):
    cfg_path = os.path.join(work, "config.json")
    metrics = os.path.join(work, "metrics.jsonl")
    log_path = os.path.join(work, "zero-train.log")
    with open(cfg_path, "w") as f:
        json.dump(config(a, swap), f, indent=1)
    exe = os.path.join(a.build, "tools", "train", "zero-train")
    cmd = [os.path.join(SRC, "tests", "mpirun.sh"), str(a.ranks), exe, "--config", cfg_path, "--plain",
           "--metrics", metrics]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS="1")
    t0 = time.time()
    log = open(log_path, "w")
    p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    samples = []        # (time, {pid: sample}, metrics lines so far, MemAvailable, loadavg)
    per_line = []       # the /proc sample taken when each metrics line appeared
    pids, nlines = [], 0
    min_avail, max_load = mem_available(), os.getloadavg()[0]
    first_seen = None
    try:
        while p.poll() is None:
            time.sleep(a.poll)
            if len(pids) < a.ranks:
                pids = rank_pids(p.pid)
            s = {q: proc_sample(q) for q in pids}
            samples.append((time.time() - t0, s))
            min_avail = min(min_avail, mem_available())
            max_load = max(max_load, os.getloadavg()[0])
            if os.path.exists(metrics):
                with open(metrics) as f:
                    n = sum(1 for line in f if line.endswith("\n"))
                while nlines < n:
                    nlines += 1
                    per_line.append((time.time() - t0, s))
                    if first_seen is None:
                        first_seen = time.time() - t0
    except KeyboardInterrupt:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait()
        raise
    log.close()
    wall = time.time() - t0
    text = open(log_path).read()
    rows = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    # the last /proc sample with every rank present: totals incl. finalize's writes
    last = {}
    hwm = {}
    for _, s in samples:
        for q, v in s.items():
            if v:
                last[q] = v
                hwm[q] = max(hwm.get(q, 0), v[2])
    return dict(cmd=cmd, rc=p.returncode, wall_s=wall, first_metrics_line_s=first_seen, log=text, rows=rows,
                per_line=per_line, pids=pids, proc_last=last, vm_hwm=hwm, min_mem_available=min_avail,
                max_load=max_load, config=config(a, swap))


# ------------------------------------------------------------------ report
def fmt_gb(x):
    return "%.2f" % (x / GB)


def summarize(a, est, tr, raw):
    rows = tr["rows"]
    steps = []
    prev = None
    for i, r in enumerate(rows):
        ranks = r.get("ranks", [])
        rd = [q["opt_nvme_read"] + q["param_nvme_read"] for q in ranks]
        wr = [q["opt_nvme_written"] + q["param_nvme_written"] for q in ranks]
        if prev is None:
            d_rd, d_wr = rd, wr
        else:
            d_rd = [x - y for x, y in zip(rd, prev[0])]
            d_wr = [x - y for x, y in zip(wr, prev[1])]
        prev = (rd, wr)
        # kernel's count for the rank processes (cumulative since they started)
        osb = None
        if i < len(tr["per_line"]):
            s = tr["per_line"][i][1]
            osb = [s[q] for q in sorted(s) if s[q]]
        steps.append(dict(step=r["step"], step_s=r["step_s"], loss=r["loss"], grad_norm=r["grad_norm"],
                          cpu_s=r.get("cpu_s"),
                          nvme_read=d_rd, nvme_written=d_wr,
                          rss_peak=[q["rss_peak"] for q in ranks], rss=[q["rss"] for q in ranks],
                          mem=[{k: q[k] for k in ("params", "grads", "master", "moments", "buffers", "other",
                                                  "total", "peak_total")} for q in ranks],
                          offload=[{k: q[k] for k in ("opt_host", "opt_nvme_bytes", "param_host",
                                                      "param_nvme_bytes")} for q in ranks],
                          os_cumulative=[{"read_bytes": v[0], "write_bytes": v[1]} for v in osb] if osb else None))
    if raw:
        rw = raw["gbps"]["overwrite"] * GB
        rr = raw["gbps"]["read"] * GB
        for s in steps:
            s["raw_s"] = sum(s["nvme_written"]) / rw + sum(s["nvme_read"]) / rr
            s["disk_bound"] = s["raw_s"] / s["step_s"] if s["step_s"] > 0 else None
    return steps


def print_report(a, est, tr, raw, steps, ram):
    P = est["params"]
    print("\n== issue 8 proof: %d ranks, GPT %d layers x d_model %d (%d heads), seq %d, micro-batch %d"
          % (a.ranks, a.n_layer, a.d_model, a.n_head, a.seq_len, a.micro_batch))
    print("   %.4f e9 parameters; training state 16 B x params = %.2f GB = %.2f x RAM (%.2f GB)"
          % (P / 1e9, est["state_bytes"] / GB, est["state_bytes"] / ram, ram / GB))
    print("   stage 3, offload_param nvme, offload_optimizer nvme, activation checkpointing %s"
          % ("off" if a.no_activation_checkpointing else "every block"))
    print("   zero-train exit status %d, wall %.1f s, first step done at %.1f s"
          % (tr["rc"], tr["wall_s"], tr["first_metrics_line_s"] or float("nan")))
    if raw:
        g = raw["gbps"]
        print("   raw O_DIRECT peer (%d ranks at once, %d KiB blocks, same volume as a median step%s): first write "
              "%.2f GB/s, overwrite %.2f GB/s, read %.2f GB/s"
              % (a.ranks, raw["block_bytes"] // 1024,
                 "" if a.raw_fraction == 1 else " x %.2f" % a.raw_fraction, g["first_write"], g["overwrite"],
                 g["read"]))
    hdr = ("step", "time s", "CPU busy", "loss", "NVMe read GB", "NVMe written GB", "raw s", "disk-bound",
           "peak RSS GiB / rank", "engine MiB / rank (grads, buffers)")
    print("\n| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for s in steps:
        print("| %d | %.1f | %s | %.4f | %s | %s | %s | %s | %s | %s |" % (
            s["step"], s["step_s"],
            "%.0f%%" % (100 * s["cpu_s"] / (a.ranks * a.threads * s["step_s"])) if s.get("cpu_s") else "-", s["loss"], " + ".join(fmt_gb(x) for x in s["nvme_read"]),
            " + ".join(fmt_gb(x) for x in s["nvme_written"]),
            "%.1f" % s["raw_s"] if "raw_s" in s else "-",
            "%.2f" % s["disk_bound"] if s.get("disk_bound") is not None else "-",
            " / ".join("%.2f" % (x / GIB) for x in s["rss_peak"]),
            " / ".join("%.0f (%.0f, %.0f)" % (m["total"] / MIB, m["grads"] / MIB, m["buffers"] / MIB)
                       for m in s["mem"])))
    print("\n   RAM / ranks = %.2f GiB; VmHWM seen by the poller: %s GiB; least MemAvailable during the run %.2f GiB;"
          " highest 1-min load average %.1f" % (ram / a.ranks / GIB,
                                                ", ".join("%.2f" % (v / GIB) for v in tr["vm_hwm"].values()),
                                                tr["min_mem_available"] / GIB, tr["max_load"]))
    if steps:
        s = steps[-1]
        print("   engine memory report, last step, per rank (MiB): " + "; ".join(
            "params %.1f grads %.1f master %.1f moments %.1f buffers %.1f other %.1f = %.1f (peak %.1f)"
            % tuple(m[k] / MIB for k in ("params", "grads", "master", "moments", "buffers", "other", "total",
                                         "peak_total")) for m in s["mem"]))
        print("   offload: " + "; ".join(
            "optimizer host %.1f MiB, NVMe %.2f GB; params host %.1f MiB, NVMe %.2f GB"
            % (o["opt_host"] / MIB, o["opt_nvme_bytes"] / GB, o["param_host"] / MIB, o["param_nvme_bytes"] / GB)
            for o in s["offload"]))
    for line in tr["log"].splitlines():
        if line.startswith("summary:") or line.startswith("model:") or line.startswith("engine:"):
            print("   zero-train " + line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/work/zero-infinity", help="parent of the swap directory (on the NVMe)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    ap.add_argument("--n-layer", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--n-head", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    # Adam's first step moves every weight by about lr (a sign step): the loss
    # changes by about lr x |g|_1 at first, which grows with the parameter
    # count. Measured at d_model 2048: 100M parameters fall by 0.2 per step at
    # 1e-6 and diverge (5.6 -> 13-16) at 1e-4 and 3e-4; 3.2e9 gets 5e-8.
    ap.add_argument("--lr", type=float, default=5e-8)
    ap.add_argument("--bucket", type=float, default=2e7, help="reduce_bucket_size (= allgather, = param buffer_size)")
    ap.add_argument("--prefetch", type=float, default=5.1e7, help="stage3_prefetch_bucket_size")
    ap.add_argument("--max-live", type=float, default=1.1e8, help="stage3_max_live_parameters")
    ap.add_argument("--sub-group", type=float, default=1e7, help="sub_group_size (optimizer NVMe chunk)")
    ap.add_argument("--opt-buffers", type=int, default=4)
    ap.add_argument("--param-buffers", type=int, default=5)
    ap.add_argument("--aio-block", type=int, default=1 << 20)
    ap.add_argument("--aio-qd", type=int, default=8)
    ap.add_argument("--raw-block", type=int, default=4 << 20)
    ap.add_argument("--raw-fraction", type=float, default=1.0, help="fraction of a step's volume the raw peer moves")
    ap.add_argument("--no-raw", action="store_true")
    ap.add_argument("--no-activation-checkpointing", action="store_true")
    ap.add_argument("--comm-timeout", type=float, default=1800)
    ap.add_argument("--poll", type=float, default=0.5)
    ap.add_argument("--dry-run", action="store_true", help="print the arithmetic and the config only")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep-work", action="store_true")
    a = ap.parse_args()

    ram = mem_total()
    est = plan(a)
    os.makedirs(a.dir, exist_ok=True)
    fs = os.statvfs(a.dir)
    free = fs.f_bavail * fs.f_frsize
    print("model: %.4f e9 params, state %.2f GB = %.2f x RAM %.2f GB; per rank: shard %.3f e9 elements, "
          "%.0f tokens/step, %.2f TFLOP/step (with recomputation)" % (
              est["params"] / 1e9, est["state_bytes"] / GB, est["state_bytes"] / ram, ram / GB,
              est["shard_numel"] / 1e9, est["tokens_per_rank"], est["flops_per_rank"] / 1e12))
    print("NVMe: %.2f GB of swap files (all ranks), free on %s: %.2f GB; per rank per step (estimate): read %.2f GB,"
          " write %.2f GB; resident fp32 gradient shard %.2f GB per rank (RAM / ranks %.2f GB)" % (
              est["nvme_bytes_per_rank"] * a.ranks / GB, a.dir, free / GB, est["est_read_per_rank"] / GB,
              est["est_written_per_rank"] / GB, est["gacc_bytes_per_rank"] / GB, ram / a.ranks / GB))
    need = est["nvme_bytes_per_rank"] * a.ranks * 1.02 + 2 * GB
    if a.dry_run:
        print(json.dumps(config(a, os.path.join(a.dir, "swap")), indent=1))
        return 0
    if free < need:
        print("bench_infinity: %s has %.2f GB free; the swap files need %.2f GB (+2%% padding, +2 GB margin)"
              % (a.dir, free / GB, need / GB), file=sys.stderr)
        return 2
    stamp = datetime.datetime.utcnow().strftime("%Y%m%dT%H%M%S")
    work = os.path.join(a.dir, "run-%s-%d" % (stamp, os.getpid()))
    swap = os.path.join(work, "swap")
    os.makedirs(swap)
    raw = None
    try:
        tr = run_train(a, swap, work)
        leftover = sum(os.path.getsize(os.path.join(swap, f)) for f in os.listdir(swap))
        if tr["rc"] != 0:
            print(tr["log"][-4000:], file=sys.stderr)
            print("bench_infinity: zero-train failed with exit status %d" % tr["rc"], file=sys.stderr)
        steps = summarize(a, est, tr, None)
        if not a.no_raw and steps and tr["rc"] == 0:
            # the raw peer moves what a median step moved, per rank, on the same file system
            nr = len(steps[0]["nvme_read"])
            per_rank = []
            for q in range(nr):
                w = statistics.median(s["nvme_written"][q] for s in steps) * a.raw_fraction
                r = statistics.median(s["nvme_read"][q] for s in steps) * a.raw_fraction
                per_rank.append((w, r))
            raw = raw_peer(swap, per_rank, a.raw_block)
            steps = summarize(a, est, tr, raw)
        print_report(a, est, tr, raw, steps, ram)
        loss = [s["loss"] for s in steps]
        finite = all(x is not None and x == x for x in loss)
        falling = finite and all(loss[i + 1] < loss[i] for i in range(len(loss) - 1))
        print("\n   loss finite: %s; falling at every step: %s; swap bytes left after the run: %d"
              % (finite, falling, leftover))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(date=stamp, argv=sys.argv, ram_bytes=ram, disk_free_before=free, estimate=est,
                               rc=tr["rc"], wall_s=tr["wall_s"], first_metrics_line_s=tr["first_metrics_line_s"],
                               min_mem_available=tr["min_mem_available"], max_load=tr["max_load"],
                               vm_hwm=list(tr["vm_hwm"].values()), config=tr["config"], command=tr["cmd"],
                               steps=steps, raw=raw, loss_finite=finite, loss_falling=falling,
                               swap_bytes_left=leftover, metrics=tr["rows"],
                               summary=[l for l in tr["log"].splitlines() if l.startswith(("summary:", "model:",
                                                                                          "engine:"))]),
                          f, indent=1)
            with open(a.json + ".log", "w") as f:
                f.write(tr["log"])
            print("   JSON: %s (zero-train's output: %s.log)" % (a.json, a.json))
        return 0 if tr["rc"] == 0 and finite else 1
    finally:
        if a.keep_work:
            print("kept " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-worker":
        p, w, r, b, fr, fw = sys.argv[2:8]
        raw_worker(p, int(float(w)), int(float(r)), int(b), int(fr), int(fw))
        sys.exit(0)
    sys.exit(main())
