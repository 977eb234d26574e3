//! The CLI's credentials (`--keyring`, `--name`) and the `auth` commands.

use crate::command::{Command, Invocation, Style};
use crate::render::table;
use anyhow::{anyhow, Result};
use fastblock_auth::keyring::resolve_path;
use fastblock_auth::{Caps, EntityName, Keyring, Secret};
use fastblock_monclient::{EntityKey, MonClient};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What the CLI signs with: the entity and key, or why it has none (said when the monitor
/// answers `auth_required`).
pub enum Credentials {
    Key(EntityName, Secret),
    Missing { hint: String },
}

/// Loads `--name`'s key from the keyring. A missing file is not an error (a cluster in auth
/// mode `none` needs none); an unreadable or malformed one, or one without the entity, is.
pub fn credentials(inv: &Invocation) -> Result<Credentials> {
    let entity: EntityName = inv.name.parse().map_err(|e| anyhow!("--name: {e}"))?;
    let path = resolve_path(inv.keyring.as_deref());
    if !path.exists() {
        return Ok(Credentials::Missing {
            hint: format!(
                "no keyring at {} (pass --keyring PATH or set FASTBLOCK_KEYRING)",
                path.display()
            ),
        });
    }
    let ring = Keyring::load(&path)?;
    let key = ring.key_for(&path, &entity)?.clone();
    Ok(Credentials::Key(entity, key))
}

/// Writes (`-o FILE`, mode 0600) or prints the keyring of a key the monitor sent.
fn deliver(k: &EntityKey, output: &Option<PathBuf>, out: &mut dyn Write) -> Result<()> {
    let caps: Option<Caps> = k.caps.parse().ok();
    let ring = Keyring::single(k.entity.clone(), k.key.clone(), caps);
    match output {
        Some(path) => {
            save_refusing_others(&ring, path)?;
            writeln!(
                out,
                "{} (generation {}) written to {}",
                k.entity,
                k.generation,
                path.display()
            )?;
        }
        None => write!(out, "{}", ring.to_text())?,
    }
    Ok(())
}

/// Saves `ring` at `path`, keeping the other entities of a keyring already there.
fn save_refusing_others(ring: &Keyring, path: &Path) -> Result<()> {
    let mut merged = if path.exists() {
        Keyring::load(path)?
    } else {
        Keyring::default()
    };
    merged.entries.extend(ring.entries.clone());
    merged.save(path)?;
    Ok(())
}

/// Runs an `auth` command.
pub async fn execute(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    match &inv.command {
        Command::AuthAdd {
            entity,
            caps,
            output,
        } => deliver(&client.auth_add(entity, caps).await?, output, out)?,
        Command::AuthGetOrCreate {
            entity,
            caps,
            output,
        } => deliver(&client.auth_get_or_create(entity, caps).await?, output, out)?,
        Command::AuthRotate { entity, output } => {
            deliver(&client.auth_rotate(entity).await?, output, out)?
        }
        Command::AuthLs => {
            let list = client.auth_list().await?;
            if inv.style == Style::Json {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|e| {
                        vec![
                            e.entity.clone(),
                            e.caps.clone(),
                            e.generation.to_string(),
                            e.fingerprint.clone(),
                        ]
                    })
                    .collect();
                write!(
                    out,
                    "{}",
                    table(&["ENTITY", "CAPS", "GENERATION", "FINGERPRINT"], &rows)
                )?;
            }
        }
        Command::AuthRm(entity) => {
            let epoch = client.auth_rm(entity).await?;
            writeln!(out, "removed {entity} (epoch {epoch})")?;
        }
        Command::AuthCaps { entity, caps } => {
            let e = client.auth_caps(entity, caps).await?;
            writeln!(
                out,
                "{} caps {:?} (generation {})",
                e.entity, e.caps, e.generation
            )?;
        }
        Command::AuthMode(Some(mode)) => {
            let s = client.auth_set_mode(*mode).await?;
            writeln!(out, "auth mode {} (auth epoch {})", s.mode, s.epoch)?;
        }
        Command::AuthMode(None) => {
            let m = client.map().await?;
            let auth = m.map.map(|m| m.auth).unwrap_or_default();
            if inv.style == Style::Json {
                writeln!(out, "{}", serde_json::to_string_pretty(&auth)?)?;
            } else {
                writeln!(out, "{}", auth.mode)?;
            }
        }
        other => return Err(anyhow!("not an auth command: {other:?}")),
    }
    Ok(())
}
