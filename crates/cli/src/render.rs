//! Text output: tables, the `status` layout, and the reference system's shapes.

use fastblock_types::api::StatusResponse;
use fastblock_types::map::{ImageInfo, OsdInfo};
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
    out.push_str("\n  data:\n");
    out.push_str(&format!("    pools  : {} pools, {} pgs\n", s.pools, s.pgs));
    if modern {
        out.push_str(&format!("    images : {} images\n", s.images));
    } else {
        out.push_str("    objects: 0 objects\n");
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

pub fn image_human(i: &ImageInfo) -> String {
    format!(
        "image {}/{}\n  id: {}\n  size: {} ({} bytes)\n  object size: {}\n  objects: {}\n  created at epoch: {}\n",
        i.pool_name,
        i.name,
        i.id,
        format_size(i.size_bytes),
        i.size_bytes,
        format_size(i.object_size_bytes),
        i.object_count(),
        i.created_epoch
    )
}

/// The reference's image line body: `imagename: .. Poolname: .. Size: .. Objectsize: ..`.
pub fn image_legacy(i: &ImageInfo) -> String {
    format!(
        "imagename: {} Poolname: {} Size: {} Objectsize: {}",
        i.name, i.pool_name, i.size_bytes, i.object_size_bytes
    )
}
