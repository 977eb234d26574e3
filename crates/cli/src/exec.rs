//! Runs a parsed command against the monitor and prints the result in the chosen style.

use crate::command::{Command, Invocation, Style};
use crate::render::{self, image_human, image_legacy, members, table, up_in, ImageReport};
use anyhow::{anyhow, Result};
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::{
    CreateImageRequest, CreatePoolRequest, ErrorCode, PoolUsage, ResizeImageRequest,
};
use fastblock_types::map::ClusterMap;
use fastblock_types::units::format_size;
use fastblock_types::{Epoch, OsdId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

fn json(out: &mut dyn Write, value: &impl Serialize) -> Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// The reference CLI prints failures on stdout in its own words; we do that and also fail,
/// with the exit status of `e` but without printing it again.
fn legacy_fail(out: &mut dyn Write, line: String, e: MonError) -> anyhow::Error {
    let _ = writeln!(out, "{line}");
    anyhow!(crate::exit::Failure::Reported(e))
}

fn pool_error_words(e: &MonError) -> &'static str {
    match e.code() {
        Some(ErrorCode::PoolExists) => "pool already exists",
        Some(ErrorCode::NotEnoughDomains) => "failure domain need not satisfied",
        Some(ErrorCode::NotEnoughOsds) => "no enough osd to create pool(form quorum)",
        Some(ErrorCode::TooManyPgs) => "too many pgs per osd",
        Some(ErrorCode::InvalidArgument) => "invalid argument",
        _ => "internal error",
    }
}

fn image_error_words(e: &MonError) -> &'static str {
    match e.code() {
        Some(ErrorCode::ImageExists) => "imageExists",
        Some(ErrorCode::PoolNotFound) => "unknownPoolName",
        Some(ErrorCode::InvalidArgument) => "invalidArgument",
        Some(ErrorCode::TooLarge) => "imageTooLarge",
        _ => "putEtcdError",
    }
}

/// A row of `pool ls --json`: the pool's record with what it holds beside its fields
/// (added fields only, so readers of the plain record keep working).
#[derive(Serialize)]
struct PoolRow<'a> {
    #[serde(flatten)]
    pool: &'a fastblock_types::map::PoolInfo,
    /// From the PG leaders' last heartbeats: `objects`, `stored_bytes` (one copy),
    /// `used_bytes` (times the pool's size), `pgs_unreported`.
    usage: Option<&'a PoolUsage>,
}

pub async fn execute(inv: &Invocation, out: &mut dyn Write) -> Result<()> {
    // Local to this host (its admin sockets): no monitor, no key needed. An OSD without a
    // socket here is reached through the monitor (`run` below).
    if let Command::Config {
        run_dir,
        target,
        request,
    } = &inv.command
    {
        if crate::daemon_config::relayed_osd(run_dir, target)?.is_none() {
            let json = inv.style == Style::Json;
            return crate::daemon_config::run(run_dir, target, request, json, out).await;
        }
    }
    let mut client = MonClient::new(inv.monitors.clone()).with_deadline(inv.timeout);
    let hint = match crate::auth::credentials(inv)? {
        crate::auth::Credentials::Key(entity, key) => {
            client = client.with_credentials(entity, key);
            None
        }
        crate::auth::Credentials::Missing { hint } => Some(hint),
    };
    let client = client.with_auth_floor(inv.auth_floor);
    match run(inv, &client, out).await {
        Err(e) => match (e.downcast_ref::<MonError>().and_then(MonError::code), hint) {
            (Some(ErrorCode::AuthRequired), Some(hint)) => {
                Err(crate::exit::Failure::Refused(format!("{e}; {hint}")).into())
            }
            _ => Err(e),
        },
        ok => ok,
    }
}

async fn run(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    let style = inv.style;
    match &inv.command {
        Command::AuthAdd { .. }
        | Command::AuthGetOrCreate { .. }
        | Command::AuthLs
        | Command::AuthRm(_)
        | Command::AuthCaps { .. }
        | Command::AuthRotate { .. }
        | Command::AuthMode(_) => crate::auth::execute(inv, client, out).await?,
        Command::SnapCreate(_)
        | Command::SnapLs(_)
        | Command::SnapRm(_)
        | Command::SnapRollback { .. }
        | Command::SnapProtect { .. }
        | Command::ImageClone { .. }
        | Command::ImageFlatten { .. }
        | Command::ImageChildren(_) => crate::snap::execute(inv, client, out).await?,
        Command::ImageImport(_) | Command::ImageExport(_) | Command::ImageCp(_) => {
            crate::image_io::execute(inv, client, out).await?
        }
        Command::PgLs { .. } | Command::PgScrub { .. } => {
            crate::pg::execute(inv, client, out).await?
        }
        Command::Status => {
            let s = client.status().await?;
            match style {
                Style::Json => json(out, &s)?,
                Style::Human => write!(out, "{}", render::status(&s, true))?,
                Style::Legacy => write!(out, "{}", render::status(&s, false))?,
            }
        }
        Command::OsdOps { .. } => crate::ops::execute(inv, client, out).await?,
        Command::MonBackup(_) => crate::mon::execute(inv, client, out).await?,
        Command::Health { .. } | Command::Df | Command::OsdSetRatio { .. } => {
            crate::capacity::execute(inv, client, out).await?
        }
        Command::Config {
            run_dir,
            target,
            request,
        } => {
            let id = crate::daemon_config::relayed_osd(run_dir, target)?
                .expect("execute runs config commands on this host's sockets before this");
            let json = style == Style::Json;
            crate::daemon_config::run_relayed(client, id, request, json, out).await?
        }
        Command::OsdLs { detail } => {
            let osds = client.osds().await?;
            match style {
                Style::Json => json(out, &osds)?,
                Style::Legacy => {
                    let rows: Vec<Vec<String>> = osds
                        .iter()
                        .map(|o| {
                            let (up, inn) = up_in(o);
                            if *detail {
                                vec![
                                    o.id.to_string(),
                                    o.address.clone(),
                                    "0".into(),
                                    "0".into(),
                                    o.port.to_string(),
                                    up.into(),
                                    inn.into(),
                                ]
                            } else {
                                vec![o.id.to_string(), o.address.clone(), up.into(), inn.into()]
                            }
                        })
                        .collect();
                    let header: &[&str] = if *detail {
                        &[
                            "OSDID",
                            "ADDRESS",
                            "CORE",
                            "SHARD_ID",
                            "Port",
                            "STATUS-UP",
                            "STATUS-IN",
                        ]
                    } else {
                        &["OSDID", "ADDRESS", "STATUS-UP", "STATUS-IN"]
                    };
                    write!(out, "{}", table(header, &rows))?;
                }
                Style::Human => {
                    let rows: Vec<Vec<String>> = osds
                        .iter()
                        .map(|o| {
                            let (up, inn) = if o.pending_create {
                                ("new", "out")
                            } else {
                                up_in(o)
                            };
                            let addr = if o.port == 0 {
                                "-".to_string()
                            } else {
                                format!("{}:{}", o.address, o.port)
                            };
                            let mut row = vec![
                                o.id.to_string(),
                                up.into(),
                                inn.into(),
                                o.host.clone(),
                                addr,
                                format_size(o.capacity_bytes),
                            ];
                            if *detail {
                                row.push(o.uuid.clone());
                                row.push(o.boot_epoch.to_string());
                            }
                            row
                        })
                        .collect();
                    let mut header = vec!["ID", "STATUS", "IN", "HOST", "ADDRESS", "CAPACITY"];
                    if *detail {
                        header.extend(["UUID", "BOOT-EPOCH"]);
                    }
                    write!(out, "{}", table(&header, &rows))?;
                }
            }
        }
        Command::OsdPurge(id) => {
            let epoch = client.osd_purge(*id).await?;
            match style {
                Style::Json => json(out, &serde_json::json!({ "epoch": epoch }))?,
                _ => writeln!(out, "purged osd {id} (epoch {epoch}); its id is retired")?,
            }
        }
        Command::OsdOut(id) | Command::OsdIn(id) => {
            let is_out = matches!(inv.command, Command::OsdOut(_));
            let result = if is_out {
                client.osd_out(*id).await
            } else {
                client.osd_in(*id).await
            };
            let kind = if is_out {
                "OsdOutResponse"
            } else {
                "OsdInResponse"
            };
            match (style, result) {
                (Style::Legacy, Ok(_)) => writeln!(out, "Received {kind}, ok is true")?,
                (Style::Legacy, Err(e)) => {
                    return Err(legacy_fail(out, format!("Received {kind}, ok is false"), e))
                }
                (Style::Json, Ok(epoch)) => json(out, &serde_json::json!({ "epoch": epoch }))?,
                (Style::Human, Ok(epoch)) => writeln!(
                    out,
                    "marked osd {id} {} (epoch {epoch})",
                    if is_out { "out" } else { "in" }
                )?,
                (_, Err(e)) => return Err(e.into()),
            }
        }
        Command::OsdApplyId(uuid) => {
            let id = client.apply_id(uuid).await?;
            match style {
                Style::Json => json(out, &serde_json::json!({ "id": id }))?,
                _ => writeln!(out, "{id}")?,
            }
        }
        Command::OsdConfig(id) => {
            let osds = client.osds().await?;
            let osd = osds.iter().find(|o| o.id == *id).ok_or_else(|| {
                crate::exit::Failure::NotFound(format!("osd {id} does not exist"))
            })?;
            match style {
                Style::Json => json(out, &serde_json::json!({ "id": id, "config": osd.config }))?,
                _ => writeln!(out, "{}", osd.config)?,
            }
        }
        Command::OsdPgs { pool, pool_id } => {
            osd_pgs(client, style, pool.as_deref(), *pool_id, out).await?
        }
        Command::PoolCreate {
            name,
            pg_count,
            size,
            failure_domain,
        } => {
            let req = CreatePoolRequest {
                name: name.clone(),
                pg_count: *pg_count,
                size: *size,
                failure_domain: *failure_domain,
            };
            match (style, client.create_pool(&req).await) {
                (Style::Json, Ok(p)) => json(out, &p)?,
                (Style::Legacy, Ok(p)) => writeln!(out, "pool {name} created, pool is {}", p.id)?,
                (Style::Human, Ok(p)) => writeln!(
                    out,
                    "pool {name} created: id {}, {} pgs, size {}, failure domain {}",
                    p.id, p.pg_count, p.size, p.failure_domain
                )?,
                (Style::Legacy, Err(e)) => {
                    let words = pool_error_words(&e);
                    return Err(legacy_fail(
                        out,
                        format!("pool {name} creation failed, error is {words}"),
                        e,
                    ));
                }
                (_, Err(e)) => return Err(e.into()),
            }
        }
        Command::PoolRm { name, force } => {
            let p = client.delete_pool(name, *force).await?;
            match style {
                Style::Json => json(out, &p)?,
                _ => writeln!(out, "pool {name} deleted")?,
            }
        }
        Command::PoolLs => {
            let list = client.pool_list().await?;
            let pools = list.pools;
            // What each pool holds, by id (a monitor that predates it sends none).
            let usage: BTreeMap<_, _> = list.usage.into_iter().map(|u| (u.pool, u)).collect();
            match style {
                Style::Json => {
                    let rows: Vec<PoolRow<'_>> = pools
                        .iter()
                        .map(|p| PoolRow {
                            pool: p,
                            usage: usage.get(&p.id),
                        })
                        .collect();
                    json(out, &rows)?
                }
                Style::Legacy => {
                    if pools.is_empty() {
                        writeln!(out, "pools: no pools")?;
                    } else {
                        writeln!(out, "pools: ")?;
                        for p in &pools {
                            writeln!(
                                out,
                                "poolid: {}, name: {}, pgcount: {}, pgsize: {}, root: defaultroot",
                                p.id, p.name, p.pg_count, p.size
                            )?;
                        }
                    }
                }
                Style::Human => {
                    let rows: Vec<Vec<String>> = pools
                        .iter()
                        .map(|p| {
                            let u = usage.get(&p.id);
                            let bytes = |f: fn(&PoolUsage) -> u64| {
                                u.map_or("-".to_string(), |u| format_size(f(u)))
                            };
                            vec![
                                p.id.to_string(),
                                p.name.clone(),
                                p.pg_count.to_string(),
                                p.size.to_string(),
                                p.failure_domain.to_string(),
                                u.map_or("-".to_string(), |u| u.objects.to_string()),
                                bytes(|u| u.stored_bytes),
                                bytes(|u| u.used_bytes),
                            ]
                        })
                        .collect();
                    write!(
                        out,
                        "{}",
                        table(
                            &[
                                "ID",
                                "NAME",
                                "PGS",
                                "SIZE",
                                "FAILURE-DOMAIN",
                                "OBJECTS",
                                "STORED",
                                "USED"
                            ],
                            &rows
                        )
                    )?;
                }
            }
        }
        Command::ImageCreate {
            pool,
            name,
            size_bytes,
            object_size_bytes,
        } => {
            let req = CreateImageRequest {
                pool: pool.clone(),
                name: name.clone(),
                size_bytes: *size_bytes,
                object_size_bytes: *object_size_bytes,
            };
            match (style, client.create_image(&req).await) {
                (Style::Json, Ok(i)) => json(out, &i)?,
                (Style::Legacy, Ok(i)) => writeln!(out, "Image is created, {}", image_legacy(&i))?,
                (Style::Human, Ok(i)) => writeln!(
                    out,
                    "image {pool}/{name} created: {} , object size {}",
                    format_size(i.size_bytes),
                    format_size(i.object_size_bytes)
                )?,
                (Style::Legacy, Err(e)) => {
                    let words = image_error_words(&e);
                    return Err(legacy_fail(
                        out,
                        format!("create image {name} failed, {words}"),
                        e,
                    ));
                }
                (_, Err(e)) => return Err(e.into()),
            }
        }
        Command::ImageRm { pool, name } => match (style, client.remove_image(pool, name).await) {
            (Style::Json, Ok(i)) => json(out, &i)?,
            (Style::Legacy, Ok(_)) => writeln!(out, "imagename {name} is removed")?,
            (Style::Human, Ok(_)) => writeln!(
                out,
                "image {pool}/{name} removed; its data will be reclaimed"
            )?,
            (Style::Legacy, Err(e)) if e.code() == Some(ErrorCode::ImageNotFound) => {
                return Err(legacy_fail(
                    out,
                    format!("imagename {name} can't remove , not exist"),
                    e,
                ))
            }
            (Style::Legacy, Err(e)) => return Err(e.into()),
            (_, Err(e)) => return Err(crate::snap::explain_image_rm(client, pool, name, e).await),
        },
        Command::ImageResize {
            pool,
            name,
            size_bytes,
            allow_shrink,
        } => {
            let req = ResizeImageRequest {
                size_bytes: *size_bytes,
                allow_shrink: *allow_shrink,
            };
            let i = client.resize_image(pool, name, &req).await?;
            match style {
                Style::Json => json(out, &i)?,
                Style::Legacy => writeln!(
                    out,
                    "imagename {name} is resized , new size: {}",
                    i.size_bytes
                )?,
                Style::Human => writeln!(
                    out,
                    "image {pool}/{name} resized to {}",
                    format_size(i.size_bytes)
                )?,
            }
        }
        Command::ImageInfo { pool, name } => {
            let i = client.image(pool, name).await?;
            if style == Style::Legacy {
                writeln!(out, "Imagename: {name} get info {}", image_legacy(&i))?;
                return Ok(());
            }
            let details = crate::snap::image_details(inv, client, &i).await?;
            match style {
                Style::Json => json(
                    out,
                    &ImageReport {
                        info: &i,
                        details: &details,
                    },
                )?,
                _ => write!(out, "{}", image_human(&i, &details))?,
            }
        }
        Command::ImageLs { pool } => {
            let images = client.images(pool.as_deref()).await?;
            match style {
                Style::Json => json(out, &images)?,
                _ => {
                    let rows: Vec<Vec<String>> = images
                        .iter()
                        .map(|i| {
                            vec![
                                format!("{}/{}", i.pool_name, i.name),
                                i.id.to_string(),
                                format_size(i.size_bytes),
                                format_size(i.object_size_bytes),
                            ]
                        })
                        .collect();
                    write!(
                        out,
                        "{}",
                        table(&["IMAGE", "ID", "SIZE", "OBJECT-SIZE"], &rows)
                    )?;
                }
            }
        }
        Command::Flag { flag, set } => {
            let result = client.set_flag(flag, *set).await;
            let kind = if flag.eq_ignore_ascii_case("noout") {
                "NoOutResponse"
            } else {
                "NoReblanceResponse"
            };
            match (style, result) {
                (Style::Json, Ok(f)) => json(out, &f)?,
                (Style::Legacy, Ok(_)) => writeln!(out, "Received {kind}, ok is true")?,
                (Style::Human, Ok(_)) => {
                    writeln!(out, "{flag} is {}", if *set { "set" } else { "unset" })?
                }
                (Style::Legacy, Err(e)) => {
                    return Err(legacy_fail(out, format!("Received {kind}, ok is false"), e))
                }
                (_, Err(e)) => return Err(e.into()),
            }
        }
        Command::Map { watch } => map(client, style, *watch, out).await?,
        Command::ReclaimLs => {
            let entries = client.reclaim().await?;
            match style {
                Style::Json => json(out, &entries)?,
                _ => {
                    let rows: Vec<Vec<String>> = entries
                        .iter()
                        .map(|r| {
                            vec![
                                r.id.to_string(),
                                format!("{}/{}", r.pool, r.image_name),
                                r.image.to_string(),
                                format!("{}..{}", r.from_bytes, r.to_bytes),
                                r.reason.clone(),
                                r.done_pgs.len().to_string(),
                            ]
                        })
                        .collect();
                    write!(
                        out,
                        "{}",
                        table(
                            &[
                                "ID",
                                "POOL/IMAGE",
                                "IMAGE-ID",
                                "BYTES",
                                "REASON",
                                "PGS-DONE"
                            ],
                            &rows
                        )
                    )?;
                }
            }
        }
    }
    Ok(())
}

async fn osd_pgs(
    client: &MonClient,
    style: Style,
    pool: Option<&str>,
    pool_id: Option<u32>,
    out: &mut dyn Write,
) -> Result<()> {
    let list = client.pgs(pool).await?;
    let mut counts: BTreeMap<OsdId, (u32, u32)> = BTreeMap::new();
    for row in &list.pgs {
        if pool_id.is_some_and(|p| p != row.pgid.pool.0) {
            continue;
        }
        for (i, osd) in row.info.osdlist.iter().enumerate() {
            let e = counts.entry(*osd).or_default();
            e.0 += 1;
            if i == 0 {
                e.1 += 1;
            }
        }
    }
    match style {
        Style::Json => json(
            out,
            &counts
                .iter()
                .map(|(o, (m, p))| serde_json::json!({"osd": o, "pgs": m, "primaries": p}))
                .collect::<Vec<_>>(),
        )?,
        Style::Legacy => {
            let rows: Vec<Vec<String>> = counts
                .iter()
                .map(|(o, (m, _))| vec![o.to_string(), "0".into(), m.to_string()])
                .collect();
            write!(out, "{}", table(&["OSDID", "CORE", "PGNUM"], &rows))?;
        }
        Style::Human => {
            let rows: Vec<Vec<String>> = counts
                .iter()
                .map(|(o, (m, p))| vec![o.to_string(), m.to_string(), p.to_string()])
                .collect();
            write!(out, "{}", table(&["OSD", "PGS", "PREFERRED-LEADER"], &rows))?;
        }
    }
    Ok(())
}

fn print_map(map: &ClusterMap, style: Style, out: &mut dyn Write) -> Result<()> {
    match style {
        Style::Json => json(out, map)?,
        Style::Legacy => {
            for osd in map.osds.values() {
                writeln!(out, "osd info {}", serde_json::to_string(osd)?)?;
            }
            for (pool, pgmap) in &map.pgmaps {
                for (seq, pg) in &pgmap.pgs {
                    writeln!(
                        out,
                        "pool is {pool}, pg is {seq}, osds are {}",
                        members(&pg.osdlist)
                    )?;
                }
            }
        }
        Style::Human => {
            writeln!(out, "epoch {}", map.epoch)?;
            for osd in map.osds.values() {
                let (up, inn) = up_in(osd);
                writeln!(
                    out,
                    "osd.{} {up} {inn} {}:{} host {}",
                    osd.id, osd.address, osd.port, osd.host
                )?;
            }
            for (pool, pgmap) in &map.pgmaps {
                for (seq, pg) in &pgmap.pgs {
                    let target = if pg.newosdlist.is_empty() {
                        String::new()
                    } else {
                        format!(" -> {}", members(&pg.newosdlist))
                    };
                    writeln!(
                        out,
                        "pg {pool}.{seq} {} {}{target}",
                        pg.state,
                        members(&pg.osdlist)
                    )?;
                }
            }
        }
    }
    Ok(())
}

async fn map(client: &MonClient, style: Style, watch: bool, out: &mut dyn Write) -> Result<()> {
    let first = client.map().await?;
    let mut epoch = first.epoch;
    if let Some(m) = &first.map {
        print_map(m, style, out)?;
    }
    if !watch {
        return Ok(());
    }
    loop {
        out.flush()?;
        let next = client.watch_map(epoch, Duration::from_secs(30)).await?;
        if let Some(m) = next.map {
            epoch = Epoch(m.epoch.0.max(epoch.0));
            print_map(&m, style, out)?;
        }
    }
}
