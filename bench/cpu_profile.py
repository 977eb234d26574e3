#!/usr/bin/env python3
"""Sorts the samples of a system-wide `perf record -a -g` into where the CPU went.

    perf script -F pid,tid,comm,ip,sym,dso -i perf.data | \\
        bench/cpu_profile.py --group osd=PID,PID,PID --group client=PID ... > profile.json

bench/run.sh runs it on its profiled runs ("Where the CPU goes", docs/benchmarks.md); the
report divides the samples by the IOs of the window. Each sample is one CPU's time between
two ticks of the sampling clock, so the samples of all CPUs together, idle ones included,
stand for the window's length times the CPU count: the report turns samples into CPU time
that way, with no assumption about the sampling rate.

A sample is put in a process group by its pid (`--group NAME=PID,...`) and the kind of its
thread (`osd/shard`, `osd/flush`, `client/tokio-rt-worker`: the thread's name without its
number), else in `kernel threads` (a kernel worker: the kernel's work done on some process's
behalf, such as completing a direct-IO write), `idle`, or `other` (any other process). Its
category:

- in the kernel (the leaf is a kernel symbol), by the kernel call chain, which `-g` records
  whole: scheduler (a context switch or a wake-up: on a VM, where a wake-up on another vCPU
  costs an inter-processor interrupt, its cost shows here, also when a socket's data wakes
  its reader), disk doorbell (the virtio notification: a VM exit per submission), network,
  disk IO (io_uring, the block layer, the file system), epoll, other;
- in user space, by the leaf symbol alone (without frame pointers the user chain is not
  reliable, the leaf is): Raft library and protobuf, AES-GCM (the auth modes' tags),
  crc32c, memcpy/memset, allocator, redb, clock reads, metrics, tokio, and fastblock's own
  crates.

Only the Python standard library is used. The input is perf script's text: a header line per
sample (`comm pid/tid`), then one indented line per frame (`ip symbol (dso)`), then a blank line.
"""

import argparse
import collections
import json
import re
import sys

# Kernel categories, tried in order. The scheduler is looked for near the leaf only (the
# first four frames, or a spin-unlock called from a wake-up): a sample in the middle of a TCP
# send counts as network, one in the wake-up that the send causes counts as scheduler.
SCHED_LEAF = re.compile(
    r"finish_task_switch|__schedule|schedule_|try_to_wake_up|ttwu_|__smp_call_single|"
    r"native_send_call_func|x2apic_send_IPI|default_send_IPI|flush_smp_call|pick_next_task|"
    r"enqueue_task|dequeue_task|update_curr|psi_")
KERNEL_CATEGORIES = [
    ("disk doorbell (VM exit)", re.compile(r"iowrite16|vp_notify|virtqueue_notify|vm_notify")),
    ("network", re.compile(
        r"tcp_|inet_|sock_|__sys_sendto|__sys_recvfrom|__sys_sendmsg|__sys_recvmsg|"
        r"net_rx_action|__napi_poll|process_backlog|loopback_xmit|ip_output|ip_rcv|"
        r"__dev_queue_xmit|skb_|__skb")),
    ("disk IO (io_uring, block, file system)", re.compile(
        r"io_uring|io_issue_sqe|io_submit_sqes|io_cqring|io_req_|blk_|bio_|submit_bio|ext4_|"
        r"iomap_|virtblk|dio_|jbd2|filemap_|folio")),
    ("scheduler (switches, wake-ups)", re.compile(
        r"schedule|finish_task_switch|try_to_wake_up|futex_|hrtimer_|do_nanosleep")),
    ("epoll", re.compile(r"ep_poll|do_epoll|ep_send_events")),
]
USER_CATEGORIES = [
    ("Raft library + protobuf", re.compile(r"^(<)?(raft|raft_proto|protobuf)::")),
    ("AES-GCM (auth tags)", re.compile(r"ring_core|ring::aead|aes_gcm|ghash")),
    ("crc32c", re.compile(r"crc32c")),
    ("memcpy/memset", re.compile(r"mem(cpy|move|set)|copy_from_slice")),
    ("allocator", re.compile(
        r"malloc|_int_free|cfree|^free$|realloc|unlink_chunk|__rust_(de)?alloc|__rdl_|"
        r"alloc_zeroed|calloc")),
    ("redb", re.compile(r"redb::")),
    ("clock reads (stage timings)", re.compile(r"clock_gettime|Instant>::(elapsed|now)")),
    ("metrics (prometheus-client)", re.compile(r"prometheus_client::")),
    ("tokio", re.compile(r"^(<)?tokio::")),
    ("store (apply, WAL, block map)", re.compile(r"fastblock_store::")),
    ("shard and PG cores", re.compile(r"fastblock_(shard|pg)::")),
    ("OSD runtime, wire, auth framing", re.compile(r"fastblock_(osd|wire|auth)::")),
    ("client library", re.compile(r"fastblock_(client|bench|nbd)::")),
]
# A wake-up seen from its caller: the leaf re-enables interrupts at the end of waking a
# thread (on a VM, where the IPI to the sleeper's vCPU costs an exit, its cost shows there).
UNLOCK_LEAF = re.compile(r"^_raw_spin_unlock_irq(restore)?$")
WAKE_CALLER = re.compile(
    r"sock_def_readable|__wake_up|wake_up_|ep_poll_callback|try_to_wake_up|eventfd_signal|"
    r"io_eventfd|complete$|swake_up")
IDLE = re.compile(r"default_idle|pv_native_safe_halt|cpuidle|do_idle|intel_idle|acpi_idle")


def kernel_frame(frame):
    return "[kernel.kallsyms]" in frame or frame.endswith("([kernel])")


def symbol(frame):
    """`ffffffff8110 name+0x12 (dso)` -> `name`."""
    parts = frame.split(None, 1)
    text = parts[1] if len(parts) > 1 else parts[0]
    text = re.sub(r"\s+\([^()]*\)$", "", text)
    return re.sub(r"\+0x[0-9a-f]+$", "", text).strip()


def categorize(frames):
    """The category of one sample from its frames, leaf first."""
    if not frames:
        return "user", "unknown"
    leaf = frames[0]
    if kernel_frame(leaf):
        chain = [symbol(f) for f in frames if kernel_frame(f)]
        text = " ".join(chain)
        if IDLE.search(text):
            return "idle", "idle"
        if any(SCHED_LEAF.search(s) for s in chain[:4]) or (
                UNLOCK_LEAF.search(chain[0]) and any(WAKE_CALLER.search(s) for s in chain[1:4])):
            return "kernel", "scheduler (switches, wake-ups)"
        for name, rx in KERNEL_CATEGORIES:
            if rx.search(text):
                return "kernel", name
        return "kernel", "other"
    sym = symbol(leaf)
    for name, rx in USER_CATEGORIES:
        if rx.search(sym):
            return "user", name
    return "user", "other (std, collections, unresolved)"


def parse(stream):
    """Yields (pid, comm, frames) per sample of perf script's text."""
    header = None
    frames = []
    for line in stream:
        line = line.rstrip("\n")
        if not line.strip():
            if header is not None:
                yield header[0], header[1], frames
            header, frames = None, []
            continue
        if not line[0].isspace():
            if header is not None:
                yield header[0], header[1], frames
            m = re.match(r"^(.*?)\s+(\d+)/(\d+)\s*$", line)
            header = (int(m.group(2)), m.group(1).strip()) if m else (-1, line.strip())
            frames = []
            continue
        frames.append(line.strip())
    if header is not None:
        yield header[0], header[1], frames


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", action="append", default=[],
                    help="NAME=PID[,PID...]: the processes of one group")
    args = ap.parse_args()
    group_of = {}
    for g in args.group:
        name, _, pids = g.partition("=")
        if not name or not re.fullmatch(r"\d+(,\d+)*", pids.strip()):
            ap.error(f"--group {g!r}: expected NAME=PID[,PID...]")
        for p in pids.split(","):
            group_of[int(p)] = name
    counts = collections.Counter()
    top = collections.defaultdict(collections.Counter)
    total = idle = 0
    for pid, comm, frames in parse(sys.stdin):
        total += 1
        side, category = categorize(frames)
        if pid == 0 or side == "idle":
            idle += 1
            continue
        if pid in group_of:
            group = group_of[pid]
        elif comm.startswith(("kworker", "ksoftirqd", "jbd2", "kblockd")):
            group = "kernel threads"
        else:
            group = "other"
        if group not in ("kernel threads", "other"):
            # The thread's kind (shard-0 -> shard, flush-0 -> flush, tokio-rt-worker).
            group = f"{group}/{re.sub(r'[-_]?[0-9]+$', '', comm) or comm}"
        counts[(group, side, category)] += 1
        if frames:
            top[group][symbol(frames[0])] += 1
    json.dump({
        "samples": total,
        "idle_samples": idle,
        "cells": [{"group": g, "side": s, "category": c, "samples": n}
                  for (g, s, c), n in sorted(counts.items())],
        "top_symbols": {g: c.most_common(15) for g, c in top.items()},
    }, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
