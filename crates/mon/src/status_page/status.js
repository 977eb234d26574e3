// The fastblock status page: polls GET /v1/status/public (docs/mon-api.md, "Status page") and
// renders it. Plain DOM calls and textContent only, never innerHTML: health detail lines carry
// names operators chose (pools, hosts), which must stay text.
"use strict";

// How often the page asks again, and how long one request may take.
const POLL_INTERVAL_MS = 3000;
const FETCH_TIMEOUT_MS = 5000;
// Health checks about PGs that are not fully replicated or are moving: shown with recovery.
const PG_CHECK_CODES = ["PG_DOWN", "PG_DEGRADED", "PG_REMAPPED", "PG_BACKFILL_TOOFULL"];

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (className) e.className = className;
  return e;
}

function byId(id) {
  return document.getElementById(id);
}

function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function formatRate(bytesPerSec) {
  return formatBytes(bytesPerSec) + "/s";
}

function formatDuration(secs) {
  if (secs < 60) return secs + " s";
  if (secs < 3600) return Math.floor(secs / 60) + " min " + (secs % 60) + " s";
  const h = Math.floor(secs / 3600);
  return h + " h " + Math.floor((secs % 3600) / 60) + " min";
}

function plural(n, word) {
  return n + " " + word + (n === 1 ? "" : "s");
}

function checkItem(check) {
  const li = el("li");
  li.dataset.code = check.code;
  li.append(el("span", check.code, "sev-" + check.severity), ": " + check.summary);
  if (check.detail && check.detail.length > 0) {
    const ul = el("ul", undefined, "detail");
    for (const line of check.detail) ul.append(el("li", line));
    li.append(ul);
  }
  return li;
}

function renderHealth(s) {
  const badge = byId("health-status");
  badge.textContent = s.health;
  badge.className = "badge " + s.health;
  const list = byId("checks");
  list.replaceChildren();
  if (s.health_checks.length === 0) list.append(el("li", "No health checks raised."));
  for (const check of s.health_checks) list.append(checkItem(check));
}

function renderOsds(s) {
  const up = s.osds.filter((o) => o.up).length;
  const inCount = s.osds.filter((o) => o.in).length;
  byId("osd-counts").textContent = plural(s.osds.length, "osd") + ": " + up + " up, " + inCount + " in";
  const body = byId("osds").tBodies[0];
  body.replaceChildren();
  for (const o of s.osds) {
    const tr = el("tr", undefined, (o.up ? "up" : "down") + (o.full ? " full" : ""));
    tr.dataset.osd = o.id;
    tr.append(el("td", "osd." + o.id));
    tr.append(el("td", o.up ? "up" : "down"));
    tr.append(el("td", o.in ? "in" : "out"));
    if (o.space && o.space.total_bytes > 0) {
      const used = o.space.total_bytes - o.space.free_bytes;
      const pct = (100 * used) / o.space.total_bytes;
      tr.append(el("td", formatBytes(used)));
      tr.append(el("td", formatBytes(o.space.total_bytes)));
      tr.append(el("td", pct.toFixed(1) + " %" + (o.full ? " (full)" : "")));
    } else {
      // Down, or up without a space report yet: the monitor has no figure to show.
      for (let i = 0; i < 3; i++) tr.append(el("td", "-"));
    }
    body.append(tr);
  }
}

function renderPgs(s) {
  byId("pg-counts").textContent =
    plural(s.pgs, "pg") + " in " + plural(s.pools, "pool") + ", " + plural(s.images, "image");
  const body = byId("pg-states").tBodies[0];
  body.replaceChildren();
  for (const [state, count] of Object.entries(s.pg_states)) {
    const tr = el("tr");
    tr.dataset.state = state;
    tr.append(el("td", state.replaceAll("+", " + ")), el("td", String(count), "num"));
    body.append(tr);
  }
}

function renderUsage(s) {
  const u = s.usage;
  byId("usage").textContent =
    formatBytes(u.stored_bytes) + " stored (" + u.objects + " objects), " +
    formatBytes(u.used_bytes) + " used with replication, " +
    formatBytes(u.raw_free_bytes) + " free of " + formatBytes(u.raw_total_bytes) +
    " raw on the OSDs that are up";
}

// The monitors' etcd: its largest member's database against the quota, the last compaction
// and any alarm (MON_ETCD_NEARFULL and MON_ETCD_NOSPACE are in the health checks).
function renderEtcd(s) {
  const e = s.etcd;
  if (!e) {
    byId("etcd").textContent = "Not looked at yet.";
    return;
  }
  let text = formatBytes(e.db_size_bytes) + " of the " + formatBytes(e.quota_bytes) +
    " quota (" + formatBytes(e.db_size_in_use_bytes) + " in use) over " +
    plural(e.members, "etcd member") + ", revision " + e.revision + "; ";
  if (e.compact_interval_ms === 0) {
    text += "compaction is off.";
  } else if (e.compacted_revision === null) {
    text += "not compacted yet.";
  } else {
    text += "compacted to revision " + e.compacted_revision + ".";
  }
  if (e.alarms.length > 0) {
    text += " Alarm: " + e.alarms.join(", ") + ".";
  }
  byId("etcd").textContent = text;
}

function renderIo(s) {
  const io = s.io;
  byId("io").textContent =
    formatRate(io.read_bytes_per_sec) + " read, " + formatRate(io.write_bytes_per_sec) +
    " written, " + io.read_ops_per_sec.toFixed(0) + " read op/s, " +
    io.write_ops_per_sec.toFixed(0) + " write op/s";
}

function renderRecovery(s) {
  const r = s.recovery;
  let text;
  if (r.recovering_pgs > 0 || r.remaining_bytes > 0) {
    text = plural(r.recovering_pgs, "pg") + " recovering: " + formatBytes(r.remaining_bytes) +
      " (" + plural(r.remaining_objects, "object") + ") left at " + formatRate(r.bytes_per_sec) +
      "; " + (s.recovery_eta_secs === null
        ? "ETA unknown: no copy progress measured yet."
        : "ETA " + formatDuration(s.recovery_eta_secs) + " at this rate.");
  } else {
    text = "The OSDs report no recovery in progress.";
  }
  const pgChecks = s.health_checks.filter((c) => PG_CHECK_CODES.includes(c.code));
  if (pgChecks.length > 0) {
    text += " PGs not fully replicated or moving (from health; the counts per state are above):";
  }
  byId("recovery").textContent = text;
  const list = byId("recovery-checks");
  list.replaceChildren();
  for (const c of pgChecks) {
    const li = el("li");
    li.append(el("span", c.code, "sev-" + c.severity), ": " + c.summary);
    list.append(li);
  }
}

function renderSlowOps(s) {
  const box = byId("slow-ops");
  box.replaceChildren();
  const slow = s.health_checks.filter((c) => c.code === "SLOW_OPS");
  if (slow.length === 0) {
    box.append(el("p", "No SLOW_OPS health check is raised."));
    return;
  }
  const list = el("ul");
  for (const c of slow) list.append(checkItem(c));
  box.append(list);
}

function render(s) {
  renderHealth(s);
  renderOsds(s);
  renderPgs(s);
  renderUsage(s);
  renderEtcd(s);
  renderIo(s);
  renderRecovery(s);
  renderSlowOps(s);
  byId("updated").textContent =
    "updated " + new Date().toLocaleTimeString() + ", map epoch " + s.epoch;
  byId("error").hidden = true;
}

// The monitor's error body is {"error":{"code","message"}}; anything else is shown as is.
async function errorOf(resp) {
  const text = await resp.text();
  try {
    const e = JSON.parse(text).error;
    return e.code + ": " + e.message;
  } catch (_) {
    return "HTTP " + resp.status + ": " + text.slice(0, 200);
  }
}

async function poll() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const resp = await fetch("/v1/status/public", { cache: "no-store", signal: abort.signal });
    if (!resp.ok) throw new Error(await errorOf(resp));
    render(await resp.json());
  } catch (e) {
    const err = byId("error");
    err.textContent = "Cannot read the cluster status (" + e.message + "); what is shown is from " +
      "the last successful read, if any. Retrying every " + POLL_INTERVAL_MS / 1000 + " s.";
    err.hidden = false;
  } finally {
    clearTimeout(timer);
    // The next poll is scheduled only after this one ended: never two in flight.
    setTimeout(poll, POLL_INTERVAL_MS);
  }
}

poll();
