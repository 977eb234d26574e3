#!/usr/bin/env python3
"""Turns the raw outputs of bench/run.sh into results.json, results.md and PNG plots.

    bench/report.py RESULTS_DIR

RESULTS_DIR/raw holds what run.sh wrote: runs.tsv (one line per run: CPU ticks of the OSDs,
the monitor and the NBD server over the run, wall-clock start and end), NAME.json (fio,
block_bench or rtt_bench JSON), NAME.metrics.{before,after}.osdN.txt (OSD /metrics), env.txt,
clk_tck. Only the Python standard library is used; the plots are drawn by gnuplot when it is
installed (scripts/install-deps.sh installs it). The definitions of every figure and target
are in docs/benchmarks.md.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys

TARGETS_DOC = "docs/benchmarks.md"
STAGES = ["queue", "wal_commit", "replication", "apply", "reply", "op_write",
          "read_index", "read", "op_read", "raft_queue", "flush", "flush_start"]
POOL_REPLICAS = {"bench1": 1, "fb": 3}
RAMP_SEC = 1.0


def load_json(path):
    try:
        with open(path) as f:
            text = f.read()
        # fio may print notes before its JSON.
        return json.loads(text[text.index("{"):]) if "{" in text else None
    except (OSError, ValueError):
        return None


def read_env(raw):
    env = {}
    try:
        for line in open(os.path.join(raw, "env.txt")):
            k, _, v = line.rstrip("\n").partition("=")
            env[k] = v
    except OSError:
        pass
    return env


def read_skipped(raw):
    """Why the NBD rows were skipped (raw/nbd.skipped), or None when they ran."""
    try:
        return open(os.path.join(raw, "nbd.skipped")).read().strip() or "skipped"
    except OSError:
        return None


def read_runs(raw):
    runs = []
    with open(os.path.join(raw, "runs.tsv")) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            row = dict(zip(header, line.rstrip("\n").split("\t")))
            runs.append(row)
    return runs


def scrape_stages(raw, name, when):
    """Sum and count of every stage over all OSD files of one scrape."""
    agg = {}
    pattern = re.compile(
        r'fastblock_osd_stage_latency_us_(sum|count)\{shard="\d+",stage="(\w+)"\} (\S+)')
    for fname in sorted(os.listdir(raw)):
        if not fname.startswith(f"{name}.metrics.{when}.osd"):
            continue
        for line in open(os.path.join(raw, fname)):
            m = pattern.match(line)
            if m:
                key = (m.group(2), m.group(1))
                agg[key] = agg.get(key, 0.0) + float(m.group(3))
    return agg


def stage_deltas(raw, name):
    before, after = scrape_stages(raw, name, "before"), scrape_stages(raw, name, "after")
    if not after:
        return None
    out = {}
    for stage in STAGES:
        n = after.get((stage, "count"), 0.0) - before.get((stage, "count"), 0.0)
        s = after.get((stage, "sum"), 0.0) - before.get((stage, "sum"), 0.0)
        out[stage] = {"count": int(round(n)), "mean_us": s / n if n > 0 else None}
    return out


PERF_EVENTS = {"raw_syscalls:sys_enter": "syscalls", "io_uring:io_uring_submit_req": "sqes",
               "syscalls:sys_enter_io_uring_enter": "uring_enters",
               "io_uring:io_uring_queue_async_work": "iowq_punts"}
COUNTER_GROUPS = ("osd", "mon", "nbd", "client")


def thread_class(comm):
    """A thread's kind from its name: digits and trailing separators dropped (iou-wrk-1234,
    shard-0 and shard-1 count together)."""
    return re.sub(r"[-_ ]*\d+$", "", comm) or comm


def cswitch_file(path):
    out = {}
    try:
        for line in open(path):
            parts = line.split()
            if len(parts) == 5:
                out[parts[1]] = (parts[0], parts[2], int(parts[3]), int(parts[4]))
    except (OSError, ValueError):
        return None
    return out


def window_counters(raw, name, iops):
    """The machine's work per IO in the run's counted window (bench/run.sh count_window):
    context switches from /proc per group and per thread kind, and the perf counts."""
    try:
        w0, w1 = (float(x) for x in open(os.path.join(raw, f"{name}.window")).read().split())
    except (OSError, ValueError):
        return None
    before = cswitch_file(os.path.join(raw, f"{name}.cs.before"))
    after = cswitch_file(os.path.join(raw, f"{name}.cs.after"))
    ios = (iops or 0) * (w1 - w0)
    if before is None or after is None or ios <= 0:
        return None
    per_group, per_class = {}, {}
    # Threads seen at the end, each from 0 if it started in the window (a thread that ended
    # in the window takes its switches with it: a small undercount).
    for tid, (group, comm, vol, invol) in after.items():
        _, _, v0, i0 = before.get(tid, (group, comm, 0, 0))
        dv, di = max(vol - v0, 0), max(invol - i0, 0)
        g = per_group.setdefault(group, {"cs_voluntary": 0, "cs_involuntary": 0})
        g["cs_voluntary"] += dv
        g["cs_involuntary"] += di
        key = f"{group}/{thread_class(comm)}"
        per_class[key] = per_class.get(key, 0) + dv + di
    for group in COUNTER_GROUPS:
        path = os.path.join(raw, f"{name}.perf.{group}")
        if not os.path.exists(path):
            continue
        g = per_group.setdefault(group, {"cs_voluntary": 0, "cs_involuntary": 0})
        for line in open(path):
            if line.startswith("#") or "," not in line:
                continue
            fields = line.split(",")
            event = fields[2] if len(fields) > 2 else ""
            if event in PERF_EVENTS:
                try:
                    g[PERF_EVENTS[event]] = int(fields[0])
                except ValueError:
                    pass  # "<not counted>"
    out = {"window_s": w1 - w0, "window_ios": ios, "groups": {}, "threads": {}}
    total = {}
    for group, counts in per_group.items():
        out["groups"][group] = {k: v / ios for k, v in counts.items()}
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    out["per_io"] = {k: v / ios for k, v in total.items()}
    out["per_io"]["cs"] = (total.get("cs_voluntary", 0) + total.get("cs_involuntary", 0)) / ios
    out["threads"] = {k: v / ios for k, v in sorted(per_class.items(), key=lambda kv: -kv[1])}
    return out


def fio_side(job):
    for side in ("write", "read"):
        if job.get(side, {}).get("total_ios", 0) > 0:
            return side, job[side]
    return "read", job.get("read", {})


def fio_percentiles(section):
    """(percentile dict, cdf points) from lat_ns if fio reported it, else clat_ns."""
    for key in ("lat_ns", "clat_ns"):
        pct = section.get(key, {}).get("percentile")
        if pct:
            points = sorted((float(q) / 100.0, v / 1000.0) for q, v in pct.items())
            return {float(q): v / 1000.0 for q, v in pct.items()}, [(us, q) for q, us in points]
    return {}, []


def io_bytes(test):
    return (1 << 20) if test.endswith("1m") else 4096


def parse_fio(run, data, wall):
    job = data["jobs"][0]
    side, sec = fio_side(job)
    pct, cdf = fio_percentiles(sec)
    iops = sec.get("iops", 0.0)
    runtime = job.get("job_runtime", 0) / 1000.0 or wall
    measured = sec.get("total_ios", 0)
    # fio counts only IOs after its ramp; the CPU window covers the whole process.
    all_ios = measured + iops * RAMP_SEC
    client_cpu = (job.get("usr_cpu", 0.0) + job.get("sys_cpu", 0.0)) / 100.0 * (runtime + RAMP_SEC)
    jobs = max(1, int(job.get("job options", {}).get("numjobs", 1) or 1))
    out = {
        "jobs": jobs,
        "mean_us": sec.get("lat_ns", {}).get("mean", 0.0) / 1000.0,
        "p50_us": pct.get(50.0),
        "p99_us": pct.get(99.0),
        "p999_us": pct.get(99.9),
        "iops": iops,
        "mib_s": sec.get("bw_bytes", 0) / 2**20,
        "ios": all_ios,
        "client_cpu_s": client_cpu,
        "cdf": cdf,
    }
    if "sync" in job and job["sync"].get("lat_ns", {}).get("mean"):
        out["sync_mean_us"] = job["sync"]["lat_ns"]["mean"] / 1000.0
    if iops > 0:
        # Time per operation, everything included (for fdatasync=1: the write and its sync),
        # per job when several run side by side.
        out["op_us"] = jobs * 1e6 / iops if "qd1" in run["test"] else None
    if all_ios > 0:
        out["cpu_us_per_io"] = client_cpu * 1e6 / all_ios
    return out


def parse_bb(run, data):
    if not data.get("phases"):
        return {"error": data.get("error") or "no phase completed"}
    p = data["phases"][0]
    pc = p.get("percentiles", {})
    iops = p.get("iops", 0.0)
    return {
        "mean_us": p.get("mean_us"),
        "p50_us": pc.get("p0.5_us"),
        "p99_us": pc.get("p0.99_us"),
        "p999_us": pc.get("p0.999_us"),
        "iops": iops,
        "mib_s": iops * io_bytes(run["test"]) / 2**20,
        "ios": p.get("total_io_count", 0),
        "client_cpu_s": (data.get("process_cpu_us") or 0) / 1e6,
        "cdf": [(us, q) for us, q in p.get("latency_cdf", [])],
        "error": data.get("error"),
    }


def collect(out_dir):
    raw = os.path.join(out_dir, "raw")
    env = read_env(raw)
    try:
        clk = float(open(os.path.join(raw, "clk_tck")).read().strip())
    except (OSError, ValueError):
        clk = 100.0
    results = {"env": env, "baselines": {}, "runs": [], "auth": [], "noflush": [], "snap": [],
               "nbd_skipped": read_skipped(raw)}
    for run in read_runs(raw):
        name = run["name"]
        data = load_json(os.path.join(raw, f"{name}.json"))
        wall = float(run["end"]) - float(run["start"])
        if data is None:
            err = ""
            try:
                err = open(os.path.join(raw, f"{name}.err")).read().strip()[-300:]
            except OSError:
                pass
            entry = {"error": err or "no output"}
        elif run["frontend"] == "rtt":
            entry = {"mean_us": data["mean_us"], "p50_us": data["p50_us"],
                     "p99_us": data["p99_us"], "p999_us": data["p999_us"]}
        elif run["frontend"] in ("fio-file", "nbd"):
            entry = parse_fio(run, data, wall)
        else:
            entry = parse_bb(run, data)
        entry.update({"name": name, "frontend": run["frontend"], "pool": run["pool"],
                      "test": run["test"], "wall_s": wall})
        if run["frontend"] in ("block_bench", "nbd"):
            entry["replicas"] = POOL_REPLICAS.get(run["pool"])
            osd = int(run["osd_ticks"]) / clk
            mon = int(run["mon_ticks"]) / clk
            nbd = int(run["nbd_ticks"]) / clk
            ios = entry.get("ios") or 0
            cpu = {"osds_s": osd, "mon_s": mon, "nbd_s": nbd,
                   "client_s": entry.get("client_cpu_s", 0.0)}
            fastblock = osd + mon + nbd + (cpu["client_s"] if run["frontend"] == "block_bench" else 0)
            cpu["fastblock_s"] = fastblock
            if ios > 0:
                cpu["fastblock_us_per_io"] = fastblock * 1e6 / ios
                cpu["osds_us_per_io"] = osd * 1e6 / ios
                cpu["client_us_per_io"] = cpu["client_s"] * 1e6 / ios
                cpu["nbd_us_per_io"] = nbd * 1e6 / ios
            entry["cpu"] = cpu
            delay = run.get("osd_run_delay_ns")
            if delay not in (None, "") and ios > 0:
                entry["osd_run_delay_us_per_io"] = int(delay) / 1e3 / ios
            counters = window_counters(raw, name, entry.get("iops"))
            if counters:
                entry["counters"] = counters
            stages = stage_deltas(raw, name)
            if stages:
                entry["stages"] = stages
                commits = stages["wal_commit"]["count"]
                if ios > 0:
                    entry["wal_commits_per_io"] = commits / ios
        if run["frontend"] in ("fio-file", "rtt"):
            results["baselines"][name] = entry
        elif run["test"].startswith("auth-"):
            results["auth"].append(entry)
        elif run["test"].startswith("noflush-"):
            results["noflush"].append(entry)
        elif run["test"].startswith("snap-"):
            results["snap"].append(entry)
        else:
            results["runs"].append(entry)
    results["profiles"] = read_profiles(raw, env)
    results["profile_skipped"] = None
    try:
        results["profile_skipped"] = open(os.path.join(raw, "profile.skipped")).read().strip()
    except OSError:
        pass
    return results


# (name, label, the test of the measured row it repeats on the 3-replica pool)
PROFILE_RUNS = [("profile-randwrite-qd32", "3-replica 4 KiB randwrite QD32", "randwrite-qd32"),
                ("profile-randread-qd32", "3-replica 4 KiB randread QD32", "randread-qd32"),
                ("profile-randwrite-qd1", "3-replica 4 KiB randwrite QD1", "randwrite-qd1"),
                ("profile-randread-qd1", "3-replica 4 KiB randread QD1", "randread-qd1")]
# The groups the kit counts as fastblock's CPU (the targets' "all fastblock processes").
FASTBLOCK_GROUPS = ("osd/", "mon/", "client/")


def read_profiles(raw, env):
    """The profiled runs (bench/cpu_profile.py's JSON): CPU µs per IO per group and category.

    All samples, idle ones included, stand for the window times the CPU count, so a sample
    is worth cpus / samples of the window's CPU time, and per IO: cpus / (samples × IOPS)."""
    out = []
    try:
        cpus = int(env.get("cpus", "0"))
    except ValueError:
        cpus = 0
    for name, label, twin in PROFILE_RUNS:
        prof = load_json(os.path.join(raw, f"{name}.profile.json"))
        bb = load_json(os.path.join(raw, f"{name}.json"))
        if not prof or not bb or not bb.get("phases") or not prof.get("samples") or cpus <= 0:
            continue
        iops = bb["phases"][0].get("iops") or 0.0
        if iops <= 0:
            continue
        per_sample_us = cpus / prof["samples"] / iops * 1e6
        cells = [dict(c, us_per_io=c["samples"] * per_sample_us) for c in prof["cells"]]
        fastblock = sum(c["us_per_io"] for c in cells if c["group"].startswith(FASTBLOCK_GROUPS))
        out.append({"name": name, "label": label, "twin": twin, "iops": iops,
                    "samples": prof["samples"],
                    "idle_share": prof["idle_samples"] / prof["samples"],
                    "fastblock_us_per_io": fastblock,
                    "fastblock_user_us_per_io": sum(
                        c["us_per_io"] for c in cells
                        if c["group"].startswith(FASTBLOCK_GROUPS) and c["side"] == "user"),
                    "cells": cells, "top_symbols": prof.get("top_symbols", {})})
    return out


def find(results, frontend, pool, test):
    for r in results["runs"]:
        if (r["frontend"], r["pool"], r["test"]) == (frontend, pool, test) and r.get("iops") is not None:
            return r
    return None


def baseline_runs(results, name):
    """The runs of one baseline: before and after fastblock (`-a`, `-b`), or a single one."""
    b = results["baselines"]
    runs = [b[k] for k in (f"{name}-a", f"{name}-b", name) if b.get(k) and "error" not in b[k]]
    return runs


def best(results, name, field, lower_is_better):
    """The better of a baseline's runs: the targets never profit from a noisy minute."""
    values = [r[field] for r in baseline_runs(results, name) if r.get(field)]
    if not values:
        return None
    return min(values) if lower_is_better else max(values)


def targets(results):
    rtt = best(results, "base-rtt", "mean_us", True)
    w1 = best(results, "base-randwrite-qd1", "op_us", True)
    r1 = best(results, "base-randread-qd1", "op_us", True)
    w32 = best(results, "base-randwrite-qd32", "iops", False)
    floor = w1 + 2 * rtt if (w1 and rtt) else None
    read_floor = r1 + rtt if (r1 and rtt) else None
    results["floors"] = {"write_floor_us": floor, "read_floor_us": read_floor,
                         "fio_write_qd1_op_us": w1, "fio_read_qd1_op_us": r1, "rtt_us": rtt}
    r3w1 = find(results, "block_bench", "fb", "randwrite-qd1")
    r3r1 = find(results, "block_bench", "fb", "randread-qd1")
    r1w32 = find(results, "block_bench", "bench1", "randwrite-qd32")
    r3w32 = find(results, "block_bench", "fb", "randwrite-qd32")
    r3r32 = find(results, "block_bench", "fb", "randread-qd32")
    rd32 = best(results, "base-randread-qd32", "iops", False)

    def t(name, measured, limit, kind, unit, note=""):
        if measured is None or limit is None:
            return {"target": name, "measured": measured, "limit": limit, "unit": unit,
                    "status": "not measured", "note": note}
        ok = measured <= limit if kind == "max" else measured >= limit
        return {"target": name, "measured": measured, "limit": limit, "unit": unit,
                "status": "met" if ok else "not met", "note": note,
                "ratio": measured / limit if limit else None}

    out = [
        t("3-replica 4 KiB randwrite QD1 mean latency <= 1.3 x floor",
          r3w1 and r3w1["mean_us"], floor and 1.3 * floor, "max", "us"),
        t("3-replica 4 KiB randwrite QD1 p99 latency <= 2 x floor",
          r3w1 and r3w1["p99_us"], floor and 2 * floor, "max", "us"),
        t("1-replica 4 KiB randwrite QD32 IOPS >= 80 % of fio iodepth-32 randwrite",
          r1w32 and r1w32["iops"], w32 and 0.8 * w32, "min", "IOPS"),
        t("3-replica 4 KiB randread QD1 mean latency <= 1.3 x (fio QD1 randread + 1 RTT)",
          r3r1 and r3r1["mean_us"], read_floor and 1.3 * read_floor, "max", "us"),
        t("CPU per 3-replica 4 KiB write, all fastblock processes <= 60 us",
          r3w32 and r3w32.get("cpu", {}).get("fastblock_us_per_io"), 60.0, "max", "us",
          "block_bench randwrite QD32 on the 3-replica pool: OSDs + monitor + block_bench"),
        t("Context switches per 3-replica 4 KiB write, all fastblock processes <= 3",
          r3w32 and r3w32.get("counters", {}).get("per_io", {}).get("cs"), 3.0, "max", "count",
          "block_bench randwrite QD32 on the 3-replica pool, counted window"),
        t("3-replica 4 KiB randread QD32 IOPS >= 65 % of fio iodepth-32 randread",
          r3r32 and r3r32["iops"], rd32 and 0.65 * rd32, "min", "IOPS"),
        t("CPU per 4 KiB read, all fastblock processes <= 25 us",
          r3r32 and r3r32.get("cpu", {}).get("fastblock_us_per_io"), 25.0, "max", "us",
          "block_bench randread QD32 on the 3-replica pool: OSDs + monitor + block_bench"),
    ]
    # NBD vs block_bench at QD32: the worse of write and read on the 3-replica pool.
    ratios = []
    for test in ("randwrite-qd32", "randread-qd32"):
        n, bb = find(results, "nbd", "fb", test), find(results, "block_bench", "fb", test)
        if n and bb and bb["iops"]:
            ratios.append((n["iops"] / bb["iops"], test))
    if results["nbd_skipped"] or not ratios:
        out.append({"target": "NBD path vs block_bench, QD32 IOPS >= 85 %", "measured": None,
                    "limit": 0.85, "unit": "ratio", "status": "not measured",
                    "note": results["nbd_skipped"] or "no data"})
    else:
        worst = min(ratios)
        out.append(t("NBD path vs block_bench, QD32 IOPS >= 85 %", worst[0], 0.85, "min", "ratio",
                     "3-replica pool, the worse of " + " and ".join(
                         f"{x}: {v:.2f}" for v, x in ratios)))
    results["targets"] = out


def fmt(v, digits=0):
    if v is None:
        return "–"
    if isinstance(v, float) and math.isnan(v):
        return "–"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def markdown(results):
    env, b, fl = results["env"], results["baselines"], results["floors"]
    lines = [f"## fastblock benchmark, {env.get('date', '?')}", ""]
    lines.append(f"{env.get('cpus', '?')} CPUs ({env.get('cpu_model', '?')}), kernel "
                 f"{env.get('kernel', '?')}, commit {env.get('commit', '?')}, file system "
                 f"`{env.get('filesystem', '?')}`; {env.get('seconds', '?')} s per timed run "
                 f"(first second warm-up), image {env.get('image_mib', '?')} MiB, "
                 f"{env.get('pgs', '?')} PGs per pool, 3 OSDs; load average at start "
                 f"{env.get('loadavg_start', '?')}, at end {env.get('loadavg_end', '?')}.")
    lines += ["", "### Baselines (the OSDs' file system, loopback; before and after fastblock)", "",
              "| baseline | mean µs, before | mean µs, after | IOPS, before | IOPS, after | "
              "fio CPU µs/IO |",
              "|---|---:|---:|---:|---:|---:|"]
    names = [("base-randwrite-qd1", "fio 4 KiB randwrite O_DIRECT QD1 fdatasync=1 (time per write+sync)"),
             ("base-randwrite-qd32", "fio 4 KiB randwrite O_DIRECT QD32"),
             ("base-randread-qd1", "fio 4 KiB randread O_DIRECT QD1 (time per read)"),
             ("base-randread-qd32", "fio 4 KiB randread O_DIRECT QD32"),
             ("base-randwrite-qd1-x3", "3 × fio 4 KiB randwrite QD1 fdatasync=1, side by side "
              "(what 3 OSDs on this disk see; not a target)"),
             ("base-rtt", "loopback TCP round trip, 4 KiB request / 16 B reply")]
    for key, label in names:
        ra, rb = b.get(f"{key}-a") or b.get(key) or {}, b.get(f"{key}-b") or {}
        mean = lambda r: r.get("op_us") or r.get("mean_us")
        lines.append(f"| {label} | {fmt(mean(ra), 1)} | {fmt(mean(rb), 1)} | "
                     f"{fmt(ra.get('iops'))} | {fmt(rb.get('iops'))} | "
                     f"{fmt(ra.get('cpu_us_per_io'), 1)} |")
    lines += ["", "Mean µs of the fio QD1 rows is the time per operation (1 / IOPS; for the "
              "fdatasync row, the write and its sync). The targets use the better of the two runs.",
              "", f"Write floor = fio QD1 fdatasync write + 2 × RTT = **{fmt(fl['write_floor_us'], 1)} µs**; "
              f"read floor = fio QD1 read + 1 × RTT = **{fmt(fl['read_floor_us'], 1)} µs**."]
    lines += ["", "### fastblock", "",
              "| frontend | replicas | test | mean µs | p99 µs | p99.9 µs | IOPS | MiB/s | "
              "CPU µs/IO, fastblock | of it OSDs | client µs/IO | WAL commits/IO | "
              "OSDs waiting for a CPU, µs/IO |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["runs"]:
        fe = "block_bench" if r["frontend"] == "block_bench" else "fio nbd"
        if r.get("error") and r.get("iops") is None:
            lines.append(f"| {fe} | {r.get('replicas', '?')} | {r['test']} | error: "
                         f"{str(r['error'])[:80]} | | | | | | | | | |")
            continue
        cpu = r.get("cpu", {})
        client = cpu.get("client_us_per_io")
        lines.append(
            f"| {fe} | {r.get('replicas', '?')} | {r['test']} | {fmt(r.get('mean_us'), 1)} | "
            f"{fmt(r.get('p99_us'))} | {fmt(r.get('p999_us'))} | {fmt(r.get('iops'))} | "
            f"{fmt(r.get('mib_s'), 1)} | {fmt(cpu.get('fastblock_us_per_io'), 1)} | "
            f"{fmt(cpu.get('osds_us_per_io'), 1)} | {fmt(client, 1)}"
            f"{'' if r['frontend'] == 'block_bench' else ' (fio)'} | "
            f"{fmt(r.get('wal_commits_per_io'), 2)} | {fmt(r.get('osd_run_delay_us_per_io'), 1)} |")
    if results["nbd_skipped"]:
        lines += ["", f"nbd: skipped ({results['nbd_skipped']})"]
    lines += counters_table(results)
    lines += noflush_table(results)
    lines += auth_table(results)
    lines += snap_table(results)
    lines += profile_tables(results)
    lines += ["", "### Targets (ratios within this run)", "",
              "| target | measured | limit | measured / limit | status |", "|---|---:|---:|---:|---|"]
    for t in results["targets"]:
        unit = t["unit"]
        d = 2 if unit in ("ratio", "count") else (1 if unit == "us" else 0)
        ratio = t.get("ratio")
        status = {"met": "**met**", "not met": "**not met**"}.get(t["status"], t["status"])
        note = f" ({t['note']})" if t.get("note") else ""
        shown = unit if unit not in ("ratio", "count") else ""
        lines.append(f"| {t['target']}{note} | {fmt(t['measured'], d)} {shown} | "
                     f"{fmt(t['limit'], d)} {shown} | {fmt(ratio, 2)} | {status} |")
    lines += ["", "### Per-stage latency on the OSDs (mean µs from `/metrics`, all OSDs; see docs/metrics.md)", "",
              "| run | " + " | ".join(STAGES) + " |", "|---|" + "---:|" * len(STAGES)]
    for r in results["runs"]:
        st = r.get("stages")
        if not st:
            continue
        cells = [fmt(st[s]["mean_us"], 1) for s in STAGES]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def profile_columns(group):
    """The report's column for a profile group."""
    if group == "osd/shard":
        return "OSD shard threads"
    if group == "osd/flush":
        return "OSD flusher threads"
    if group.startswith("osd/"):
        return "other OSD threads"
    if group.startswith("client/"):
        return "block_bench"
    if group.startswith("mon/"):
        return "monitor"
    return {"kernel threads": "kernel threads (not counted)",
            "other": "other processes (not counted)"}.get(group, group)


PROFILE_COLUMNS = ["OSD shard threads", "OSD flusher threads", "other OSD threads", "block_bench",
                   "monitor", "kernel threads (not counted)", "other processes (not counted)"]


def profile_tables(results):
    """Where the CPU went in each profiled run (docs/benchmarks.md, "Where the CPU goes")."""
    profs = results.get("profiles") or []
    if not profs:
        why = results.get("profile_skipped")
        return ["", f"### Where the CPU goes: not profiled ({why})"] if why else []
    lines = ["", "### Where the CPU goes (CPU µs per IO from a sampling profile of a run of its own; "
             "docs/benchmarks.md)"]
    for p in profs:
        table = {}
        for c in p["cells"]:
            key = (c["side"], c["category"])
            col = profile_columns(c["group"])
            table.setdefault(key, {}).setdefault(col, 0.0)
            table[key][col] += c["us_per_io"]
        cols = [c for c in PROFILE_COLUMNS if any(col == c for row in table.values() for col in row)]
        twin = find(results, "block_bench", "fb", p["twin"])
        measured = (twin or {}).get("cpu", {}).get("fastblock_us_per_io")
        lines += ["", f"**{p['label']}**: {fmt(p['iops'])} IOPS; fastblock processes "
                  f"{fmt(p['fastblock_us_per_io'], 1)} µs per IO in the profile (of it user space "
                  f"{fmt(p['fastblock_user_us_per_io'], 1)}), {fmt(measured, 1)} from /proc in the "
                  f"measured row; the CPUs idle {100 * p['idle_share']:.0f} % of the window.", "",
                  "| where | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        order = sorted(table, key=lambda k: (k[0] != "kernel", -sum(table[k].values())))
        for key in order:
            if sum(table[key].values()) < 0.05:
                continue
            lines.append(f"| {key[0]}: {key[1]} | " +
                         " | ".join(fmt(table[key].get(c), 1) if table[key].get(c) else ""
                                    for c in cols) + " |")
        totals = {c: sum(row.get(c, 0.0) for row in table.values()) for c in cols}
        lines.append("| **total** | " + " | ".join(f"**{fmt(totals[c], 1)}**" for c in cols) + " |")
    lines += ["", "Samples of `perf record -a -g` (999 Hz per CPU) in the middle of each run, sorted "
              "by `bench/cpu_profile.py`: kernel time by its call chain, user time by the function it "
              "was in. Kernel threads (completing direct-IO writes, the block layer's work) and other "
              "processes are not in the targets' CPU per IO. `results.json` has the most sampled "
              "functions of each thread kind."]
    return lines


def counters_table(results):
    """The machine's work per IO in each run's counted window (docs/benchmarks.md)."""
    rows = [r for r in results["runs"] + results.get("noflush", []) + results.get("auth", [])
            if r.get("counters")]
    if not rows:
        return []
    lines = ["", "### The machine's work per IO (a steady-state window of each run; "
             "all fastblock processes)", "",
             "| run | context switches/IO | voluntary | involuntary | of it OSDs | client or NBD | "
             "syscalls/IO | io_uring SQEs/IO | io_uring_enter/IO | io-wq hand-offs/IO | "
             "most switching threads (switches/IO) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        c = r["counters"]
        p, g = c["per_io"], c["groups"]
        osd = g.get("osd", {})
        front = g.get("client") or g.get("nbd") or {}
        cs = lambda d: d.get("cs_voluntary", 0) + d.get("cs_involuntary", 0) if d else None
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(c["threads"].items())[:4])
        lines.append(
            f"| {r['name']} | {fmt(p.get('cs'), 2)} | {fmt(p.get('cs_voluntary'), 2)} | "
            f"{fmt(p.get('cs_involuntary'), 2)} | {fmt(cs(osd), 2)} | {fmt(cs(front), 2)} | "
            f"{fmt(p.get('syscalls'), 1)} | {fmt(p.get('sqes'), 2)} | "
            f"{fmt(p.get('uring_enters'), 2)} | {fmt(p.get('iowq_punts'), 2)} | {top} |")
    lines += ["", "Counted over the middle of each timed run (`window_s` in results.json) and "
              "divided by its IOs (IOPS × window). System calls and io_uring figures come from "
              "kernel tracepoints (`perf stat`); `–` when perf could not count them."]
    return lines


def noflush_table(results):
    """The randwrite rows with durable writes beside the same rows without device flushes."""
    rows = results.get("noflush", [])
    if not rows:
        return []
    lines = ["", "### Without device flushes (measurement only: `--wal-sync no-flush-benchmark-only`, "
             "docs/benchmarks.md; never a target)", "",
             "| pool | test | durable: mean µs / p99 µs / IOPS / CPU µs/IO | "
             "no flush: mean µs / p99 µs / IOPS / CPU µs/IO |", "|---|---|---:|---:|"]
    cell = lambda r: (f"{fmt(r.get('mean_us'), 1)} / {fmt(r.get('p99_us'))} / {fmt(r.get('iops'))} / "
                      f"{fmt(r.get('cpu', {}).get('fastblock_us_per_io'), 1)}") if r else "–"
    for r in rows:
        test = r["test"][len("noflush-"):]
        durable = find(results, "block_bench", r["pool"], test)
        lines.append(f"| {r['pool']} ({r.get('replicas', '?')} replicas) | {test} | {cell(durable)} | "
                     f"{cell(r)} |")
    return lines


def snap_table(results):
    """Random writes on the plain image, then the first writes after a snapshot and rewrites
    of the same blocks, with each one's cost against the plain image."""
    rows = {r["test"]: r for r in results.get("snap", [])}
    if not rows:
        return []
    lines = ["", "### Snapshots (block_bench, 3 replicas, 4 KiB randwrite QD32, the same count "
             "of writes each; docs/design/snapshots.md)", "",
             "| image | mean µs | p99 µs | IOPS | CPU µs/IO | IOPS vs plain | CPU vs plain |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    plain = rows.get("snap-plain-randwrite-qd32") or {}
    pct = lambda a, b: f"{(a / b - 1) * 100:+.1f} %" if a and b else "?"
    cpu = lambda r: r.get("cpu", {}).get("fastblock_us_per_io")
    for test, what in (("snap-plain-randwrite-qd32", "plain"),
                       ("snap-first-randwrite-qd32", "first writes after a snapshot"),
                       ("snap-rewrite-randwrite-qd32", "rewrites after a snapshot")):
        r = rows.get(test)
        if not r or r.get("iops") is None:
            lines.append(f"| {what} | error: {str((r or {}).get('error', 'not run'))[:60]} |||||")
            continue
        lines.append(f"| {what} | {fmt(r.get('mean_us'), 1)} | {fmt(r.get('p99_us'))} | "
                     f"{fmt(r.get('iops'))} | {fmt(cpu(r), 1)} | {pct(r.get('iops'), plain.get('iops'))} | "
                     f"{pct(cpu(r), cpu(plain))} |")
    return lines


# --- plots ---------------------------------------------------------------------------------

AUTH_MODES = ("none", "sign", "secure")
AUTH_TESTS = ("randwrite-qd1", "randwrite-qd32", "randread-qd32")


def auth_table(results):
    """The auth-mode rows side by side, each mode's cost against none."""
    rows = {r["test"]: r for r in results.get("auth", [])}
    if not rows:
        return []
    lines = ["", "### Authentication modes (block_bench, 3 replicas; docs/security.md)", "",
             "| test | " + " | ".join(f"{m}: mean µs / IOPS / CPU µs/IO" for m in AUTH_MODES)
             + " | sign vs none | secure vs none |",
             "|---|" + "---:|" * (len(AUTH_MODES) + 2)]
    for test in AUTH_TESTS:
        cells, got = [], {}
        for m in AUTH_MODES:
            r = rows.get(f"auth-{m}-{test}")
            if not r or r.get("iops") is None:
                cells.append("error: " + str((r or {}).get("error", "not run"))[:60])
                continue
            cpu = r.get("cpu", {}).get("fastblock_us_per_io")
            got[m] = (r.get("mean_us"), r.get("iops"), cpu)
            cells.append(f"{fmt(r.get('mean_us'), 1)} / {fmt(r.get('iops'))} / {fmt(cpu, 1)}")

        def vs(m):
            if m not in got or "none" not in got:
                return ""
            (lat, iops, cpu), (lat0, iops0, cpu0) = got[m], got["none"]
            pct = lambda a, b: f"{(a / b - 1) * 100:+.1f} %" if a and b else "?"
            what = "latency" if test.endswith("qd1") else "IOPS"
            main = pct(lat, lat0) if test.endswith("qd1") else pct(iops, iops0)
            return f"{what} {main}, CPU {pct(cpu, cpu0)}"
        lines.append(f"| {test} | " + " | ".join(cells) + f" | {vs('sign')} | {vs('secure')} |")
    return lines


def label(r):
    fe = "block_bench" if r["frontend"] == "block_bench" else "nbd"
    return f"{fe} {r.get('replicas', '?')}-rep"


def plots(results, out_dir):
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        return "gnuplot not installed: no plots (scripts/install-deps.sh installs it)"
    pdir = os.path.join(out_dir, "plot")
    os.makedirs(pdir, exist_ok=True)
    script = ["set terminal pngcairo size 1000,620 noenhanced font ',10'",
              "set grid", "set key left top"]
    made = []
    fl = results["floors"]
    for test, floor_key, title in [
            ("randwrite-qd1", "write_floor_us", "4 KiB random write, QD1"),
            ("randread-qd1", "read_floor_us", "4 KiB random read, QD1"),
            ("randwrite-qd32", None, "4 KiB random write, QD32"),
            ("randread-qd32", None, "4 KiB random read, QD32")]:
        series = []
        for r in results["runs"]:
            if r["test"] != test or not r.get("cdf"):
                continue
            path = os.path.join(pdir, f"cdf-{r['name']}.dat")
            with open(path, "w") as f:
                for us, q in r["cdf"]:
                    if q < 1.0:
                        f.write(f"{1.0 / (1.0 - q):.6f} {us}\n")
            series.append(f"'{path}' using 1:2 with linespoints pt 7 ps 0.4 title '{label(r)}'")
        if not series:
            continue
        png = os.path.join(out_dir, f"latency-{test}.png")
        script += [f"set output '{png}'", f"set title 'Latency distribution: {title}'",
                   "set logscale x", "set logscale y",
                   # Tic labels are formats: '%%' prints '%'.
                   "set xtics ('0%%' 1, '50%%' 2, '90%%' 10, '99%%' 100, '99.9%%' 1000, '99.99%%' 10000)",
                   "set xlabel 'percentile'", "set ylabel 'latency (us)'", "unset arrow"]
        floor = fl.get(floor_key) if floor_key else None
        if floor:
            series.append(f"{floor} with lines lw 2 dt 2 title 'floor {floor:.0f} us'")
            series.append(f"{1.3 * floor} with lines lw 1 dt 3 title '1.3 x floor'")
        script.append("plot [1:20000] " + ", ".join(series))
        script += ["unset logscale x", "unset logscale y", "set xtics autofreq"]
        made.append(png)
    # IOPS and CPU per IO bars at QD32.
    configs = sorted({(r["frontend"], r.get("replicas")) for r in results["runs"]},
                     key=lambda c: (c[0] != "block_bench", c[1]))
    iops_dat = os.path.join(pdir, "iops.dat")
    with open(iops_dat, "w") as f:
        f.write("test " + " ".join(f'"{label({"frontend": fe, "replicas": rep})}"'
                                   for fe, rep in configs) + ' "fio on the file"\n')
        for test, base in [("randwrite-qd32", "base-randwrite-qd32"), ("randread-qd32", "base-randread-qd32")]:
            row = [test]
            for fe, rep in configs:
                r = next((x for x in results["runs"] if x["frontend"] == fe and x.get("replicas") == rep
                          and x["test"] == test), None)
                row.append(f"{(r or {}).get('iops') or 0:.0f}")
            row.append(f"{best(results, base, 'iops', False) or 0:.0f}")
            f.write(" ".join(row) + "\n")
    ncols = len(configs) + 1
    png = os.path.join(out_dir, "iops-qd32.png")
    script += [f"set output '{png}'", "set title '4 KiB IOPS at QD32'", "set style data histograms",
               "set style histogram clustered gap 1", "set style fill solid 0.8 border -1",
               "set ylabel 'IOPS'", "set xlabel ''", "set key right top", "set yrange [0:*]",
               f"plot for [i=2:{ncols + 1}] '{iops_dat}' using i:xtic(1) title columnheader(i)"]
    made.append(png)
    cpu_dat = os.path.join(pdir, "cpu.dat")
    with open(cpu_dat, "w") as f:
        f.write('run "OSDs" "client (block_bench; fio for nbd)" "NBD server" "monitor"\n')
        for r in results["runs"]:
            if not r["test"].endswith("qd32") or "cpu" not in r or not r.get("ios"):
                continue
            c, n = r["cpu"], r["ios"]
            name = f"{label(r)} {r['test'].split('-')[0]}".replace(" ", "_")
            f.write(f"{name} {c['osds_s'] * 1e6 / n:.2f} {c['client_s'] * 1e6 / n:.2f} "
                    f"{c['nbd_s'] * 1e6 / n:.2f} {c['mon_s'] * 1e6 / n:.2f}\n")
    png = os.path.join(out_dir, "cpu-per-io-qd32.png")
    script += [f"set output '{png}'", "set title 'CPU time per 4 KiB IO at QD32 (us), by process'",
               "set style histogram rowstacked", "set boxwidth 0.6", "set ylabel 'CPU us per IO'",
               "set xtics rotate by -25", "set key left top",
               "set arrow from graph 0, first 60 to graph 1, first 60 nohead dt 2 lw 2",
               f"plot for [i=2:5] '{cpu_dat}' using i:xtic(1) title columnheader(i)"]
    made.append(png)
    gp = os.path.join(pdir, "plots.gp")
    with open(gp, "w") as f:
        f.write("\n".join(script) + "\n")
    proc = subprocess.run([gnuplot, gp], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"gnuplot failed: {proc.stderr.strip()[-500:]}"
    return "plots: " + ", ".join(os.path.basename(p) for p in made)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    out_dir = sys.argv[1]
    results = collect(out_dir)
    targets(results)
    note = plots(results, out_dir)
    md = markdown(results) + f"\n{note}\n"
    for r in list(results["runs"]) + list(results["auth"]) + list(results["baselines"].values()):
        r.pop("cdf", None)  # in the plots' data files; keeps results.json readable
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
