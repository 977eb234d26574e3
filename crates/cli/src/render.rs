//! Text output: tables, the `status` layout, and the reference system's shapes.

use fastblock_types::api::StatusResponse;
use fastblock_types::map::{ImageInfo, OsdInfo, SnapInfo, SnapState};
use fastblock_types::units::{format_rate, format_size};
use fastblock_types::OsdId;

/// Left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

pub fn members(list: &[OsdId]) -> String {
    let inner: Vec<String> = list.iter().map(|o| o.to_string()).collect();
    format!("[{}]", inner.join(","))
}

pub fn up_in(osd: &OsdInfo) -> (&'static str, &'static str) {
    (
        if osd.up { "up" } else { "down" },
        if osd.is_in { "in" } else { "out" },
    )
}

/// The reference's PG-state buckets, in its order.
const PG_BUCKETS: &[(&str, &str)] = &[
    ("creating", "creating"),
    ("active", "active"),
    ("undersize", "undersize"),
    ("down", "down"),
    ("remapped", "remap"),
    ("creating+undersize", "creating + undersize"),
    ("creating+down", "creating + down"),
    ("undersize+remapped", "undersize + remap"),
    ("down+remapped", "down + remap"),
];

/// The monitors' etcd in one line: its largest member's database against the quota, the
/// revision, the last compaction and any alarm.
fn etcd_line(e: &fastblock_types::etcd::EtcdStatus) -> String {
    let biggest = e.members.iter().max_by_key(|m| m.db_size_bytes);
    let mut line = format!(
        "{}, db {} of {} ({} in use), revision {}",
        plural_members(e.members.len()),
        format_size(biggest.map_or(0, |m| m.db_size_bytes)),
        format_size(e.quota_bytes),
        format_size(biggest.map_or(0, |m| m.db_size_in_use_bytes)),
        e.revision
    );
    match (e.compact_interval_ms, e.compacted_revision) {
        (0, _) => line.push_str(", compaction off"),
        (_, Some(r)) => line.push_str(&format!(", compacted to {r}")),
        (_, None) => line.push_str(", not compacted yet"),
    }
    let alarms: Vec<String> = e
        .alarms
        .iter()
        .map(|a| format!("{} on {}", a.alarm, a.member))
        .collect();
    if !alarms.is_empty() {
        line.push_str(&format!(", ALARM {}", alarms.join(", ")));
    }
    line
}

fn plural_members(n: usize) -> String {
    if n == 1 {
        "1 member".to_string()
    } else {
        format!("{n} members")
    }
}

/// `status` in the reference layout; `modern` adds the health lines.
pub fn status(s: &StatusResponse, modern: bool) -> String {
    let mut out = String::from("  cluster:\n");
    if modern {
        out.push_str(&format!("    health: {}\n", s.health));
        for check in &s.health_checks {
            out.push_str(&format!("            {check}\n"));
        }
    }
    let mut flags = Vec::new();
    if s.flags.norebalance {
        flags.push(if modern { "norebalance" } else { "noReblance" });
    }
    if s.flags.noout {
        flags.push(if modern { "noout" } else { "noOut" });
    }
    if !flags.is_empty() {
        out.push_str(&format!("    {}  flags set\n", flags.join(",")));
    }
    out.push_str("\n  services:\n");
    let names: Vec<&str> = s.mons.iter().map(|m| m.name.as_str()).collect();
    let mut mon_line = format!("    mon: {} mons, {}", s.mons.len(), names.join(","));
    if let (true, Some(leader)) = (modern, &s.leader) {
        mon_line.push_str(&format!(" (leader: {})", leader.name));
    }
    out.push_str(&mon_line);
    out.push('\n');
    out.push_str(&format!(
        "    osd: {} osds: {} up, {} in\n",
        s.osds_total, s.osds_up, s.osds_in
    ));
    if let (true, Some(etcd)) = (modern, &s.etcd) {
        out.push_str(&format!("    etcd: {}\n", etcd_line(etcd)));
    }
    out.push_str("\n  data:\n");
    out.push_str(&format!("    pools  : {} pools, {} pgs\n", s.pools, s.pgs));
    let u = &s.usage;
    if modern {
        out.push_str(&format!(
            "    images : {} images, {} objects\n",
            s.images, u.objects
        ));
        out.push_str(&format!(
            "    usage  : {} stored, {} used, {} / {} raw free\n",
            format_size(u.stored_bytes),
            format_size(u.used_bytes),
            format_size(u.raw_free_bytes),
            format_size(u.raw_total_bytes)
        ));
    } else {
        out.push_str(&format!("    objects: {} objects\n", u.objects));
    }
    out.push_str("    pgs    :\n");
    for (name, label) in PG_BUCKETS {
        if let Some(n) = s.pg_states.get(*name).filter(|n| **n > 0) {
            out.push_str(&format!("      {n}  {label}\n"));
        }
    }
    for (name, n) in &s.pg_states {
        if !PG_BUCKETS.iter().any(|(b, _)| b == name) {
            out.push_str(&format!("      {n}  {}\n", name.replace('+', " + ")));
        }
    }
    let io = &s.io;
    let rec = &s.recovery;
    let any_io = io.read_bytes_per_sec > 0.0
        || io.write_bytes_per_sec > 0.0
        || io.read_ops_per_sec > 0.0
        || io.write_ops_per_sec > 0.0;
    let any_recovery = rec.recovering_pgs > 0 || rec.bytes_per_sec > 0.0;
    if any_io || any_recovery {
        out.push_str("\n  io:\n");
        if any_io {
            out.push_str(&format!(
                "    client   : {} rd,  {} wr,  {:.0} op/s rd,  {:.0} op/s wr\n",
                format_rate(io.read_bytes_per_sec),
                format_rate(io.write_bytes_per_sec),
                io.read_ops_per_sec,
                io.write_ops_per_sec
            ));
        }
        if any_recovery {
            out.push_str(&format!(
                "    recovery : {},  {} pgs recovering, {} / {} objects remaining\n",
                format_rate(rec.bytes_per_sec),
                rec.recovering_pgs,
                format_size(rec.remaining_bytes),
                rec.remaining_objects
            ));
        }
    }
    out
}

/// What `image info` shows beyond the monitor's image record (text and `--json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ImageDetails {
    /// Live snapshots of the image, `creating` and `created`.
    pub snapshot_count: usize,
    /// What the image holds on the OSDs; `None` if the data path could not answer
    /// (`usage_error` says why).
    pub usage: Option<UsageDetails>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_error: Option<String>,
}

/// What an image holds, from its PGs' leaders (`Image::usage`). Bytes are of one copy but
/// `raw_bytes`, which counts the pool's replicas.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UsageDetails {
    pub objects: u64,
    /// Data the image's head maps (4 KiB blocks).
    pub head_bytes: u64,
    /// Data kept for its snapshots, in all.
    pub snapshots_bytes: u64,
    /// Head and snapshots times the pool's size: what the image takes on the OSDs' disks.
    pub raw_bytes: u64,
    /// Per snapshot, what removing it alone would free (or hand to an older one).
    pub snapshots: Vec<SnapUsage>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapUsage {
    pub id: u64,
    pub name: String,
    pub bytes: u64,
}

/// `image info` in `--json`: the monitor's record with [`ImageDetails`] beside its fields
/// (added fields only, so readers of the plain record keep working).
#[derive(serde::Serialize)]
pub struct ImageReport<'a> {
    #[serde(flatten)]
    pub info: &'a ImageInfo,
    #[serde(flatten)]
    pub details: &'a ImageDetails,
}

pub fn image_human(i: &ImageInfo, details: &ImageDetails) -> String {
    let mut out = format!("image {}/{}\n", i.pool_name, i.name);
    out.push_str(&format!("  id: {}\n", i.id));
    out.push_str(&format!(
        "  size: {} ({} bytes)\n",
        format_size(i.size_bytes),
        i.size_bytes
    ));
    out.push_str(&format!(
        "  object size: {}\n",
        format_size(i.object_size_bytes)
    ));
    out.push_str(&format!("  objects: {}\n", i.object_count()));
    out.push_str(&format!("  created at epoch: {}\n", i.created_epoch));
    out.push_str(&format!("  snapshots: {}\n", details.snapshot_count));
    match (&details.usage, &details.usage_error) {
        (Some(u), _) => {
            out.push_str(&format!(
                "  used: {} (head {}, snapshots {}), {} objects, {} raw\n",
                format_size(u.head_bytes + u.snapshots_bytes),
                format_size(u.head_bytes),
                format_size(u.snapshots_bytes),
                u.objects,
                format_size(u.raw_bytes)
            ));
            for snap in &u.snapshots {
                out.push_str(&format!(
                    "    snapshot {} (id {}): {}\n",
                    snap.name,
                    snap.id,
                    format_size(snap.bytes)
                ));
            }
        }
        (None, Some(why)) => out.push_str(&format!("  used: unknown ({why})\n")),
        (None, None) => {}
    }
    if let Some(p) = &i.parent {
        out.push_str(&format!(
            "  parent: {}/{}@{} (overlap {}, {} bytes)\n",
            p.pool_name,
            p.image_name,
            p.snap_name,
            format_size(p.overlap_bytes),
            p.overlap_bytes
        ));
    }
    out
}

/// `image snap ls` as a table: id, name, size, state, protected, creation time (`image info`
/// shows what each snapshot keeps).
pub fn snaps_table(snaps: &[SnapInfo]) -> String {
    let rows: Vec<Vec<String>> = snaps
        .iter()
        .map(|s| {
            vec![
                s.id.to_string(),
                s.name.clone(),
                format_size(s.size_bytes),
                snap_state(s.state).to_string(),
                if s.protected { "yes" } else { "no" }.to_string(),
                format_unix_ms(s.started_at_ms),
            ]
        })
        .collect();
    table(
        &["ID", "NAME", "SIZE", "STATE", "PROTECTED", "CREATED"],
        &rows,
    )
}

pub fn snap_state(state: SnapState) -> &'static str {
    match state {
        SnapState::Creating => "creating",
        SnapState::Created => "created",
    }
}

/// `image children` as a table: the clone, its id, size and overlap with the snapshot.
pub fn children_table(children: &[ImageInfo]) -> String {
    let rows: Vec<Vec<String>> = children
        .iter()
        .map(|c| {
            let overlap = c
                .parent
                .as_ref()
                .map_or("-".to_string(), |p| format_size(p.overlap_bytes));
            vec![
                format!("{}/{}", c.pool_name, c.name),
                c.id.to_string(),
                format_size(c.size_bytes),
                overlap,
            ]
        })
        .collect();
    table(&["IMAGE", "ID", "SIZE", "OVERLAP"], &rows)
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS UTC`; `-` for 0 (a record written before the
/// time was kept).
pub fn format_unix_ms(ms: u64) -> String {
    if ms == 0 {
        return "-".to_string();
    }
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Unix milliseconds as RFC 3339 in UTC to the second, `YYYY-MM-DDTHH:MM:SSZ` (one word, for
/// table cells).
pub fn format_unix_ms_rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// The reference's image line body: `imagename: .. Poolname: .. Size: .. Objectsize: ..`.
pub fn image_legacy(i: &ImageInfo) -> String {
    format!(
        "imagename: {} Poolname: {} Size: {} Objectsize: {}",
        i.name, i.pool_name, i.size_bytes, i.object_size_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_ms_format_as_utc_dates() {
        assert_eq!(format_unix_ms(0), "-");
        assert_eq!(format_unix_ms(1), "1970-01-01 00:00:00 UTC");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.
        assert_eq!(format_unix_ms(951_827_696_000), "2000-02-29 12:34:56 UTC");
        assert_eq!(format_unix_ms(1_764_092_718_000), "2025-11-25 17:45:18 UTC");
        // The last second of 2024, a leap year.
        assert_eq!(format_unix_ms(1_735_689_599_999), "2024-12-31 23:59:59 UTC");
        assert_eq!(format_unix_ms_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_unix_ms_rfc3339(951_827_696_000),
            "2000-02-29T12:34:56Z"
        );
    }
}
