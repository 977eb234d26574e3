//! The reference system's flag syntax (Go `flag` package rules): `-op=createpool
//! -poolname=P -pgcount=8`, `--flag=value`, `-flag value`, and bare booleans (`-detail`).
//! Every op of the reference CLI is accepted except the `fake*` simulation ops.

use crate::command::{default_monitors, Command, Invocation, Style, DEFAULT_ENTITY};
use fastblock_types::map::FailureDomain;
use fastblock_types::units::parse_size;
use fastblock_types::OsdId;
use std::collections::BTreeMap;
use std::time::Duration;

const VALUE_FLAGS: &[&str] = &[
    "op",
    "set",
    "unset",
    "poolname",
    "poolid",
    "osdid",
    "port",
    "pgcount",
    "pgsize",
    "failure_domain",
    "hostname",
    "address",
    "size",
    "uuid",
    "osdcount",
    "hostcount",
    "version",
    "imagename",
    "imagesize",
    "objectsize",
    "endpoint",
    "conf",
    "timeout",
    "keyring",
    "auth_floor",
    "name",
];
const BOOL_FLAGS: &[&str] = &["detail", "force", "allow_shrink", "json"];

fn flag_name(arg: &str) -> Option<&str> {
    let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    Some(body.split_once('=').map_or(body, |(name, _)| name))
}

/// True when the arguments use the reference syntax (an `-op`, `-set` or `-unset` flag).
pub fn is_legacy(argv: &[String]) -> bool {
    argv.iter()
        .any(|a| matches!(flag_name(a), Some("op" | "set" | "unset")))
}

fn collect(argv: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut flags = BTreeMap::new();
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        let name = flag_name(arg).ok_or_else(|| format!("unexpected argument {arg:?}"))?;
        let inline = arg.split_once('=').map(|(_, v)| v.to_string());
        let value = if BOOL_FLAGS.contains(&name) {
            inline.unwrap_or_else(|| "true".to_string())
        } else if VALUE_FLAGS.contains(&name) {
            match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    argv.get(i)
                        .cloned()
                        .ok_or_else(|| format!("flag -{name} needs a value"))?
                }
            }
        } else {
            return Err(format!("unknown flag -{name}"));
        };
        flags.insert(name.to_string(), value);
        i += 1;
    }
    Ok(flags)
}

struct Flags(BTreeMap<String, String>);

impl Flags {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn require(&self, name: &str, op: &str) -> Result<&str, String> {
        self.get(name)
            .ok_or_else(|| format!("-op={op} needs -{name}"))
    }

    fn number<T: std::str::FromStr>(&self, name: &str, op: &str) -> Result<T, String> {
        let v = self.require(name, op)?;
        v.parse()
            .map_err(|_| format!("-{name}={v} is not a valid number"))
    }

    fn boolean(&self, name: &str) -> Result<bool, String> {
        match self.get(name) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(v) => Err(format!("-{name}={v} is not a boolean")),
        }
    }

    fn size(&self, name: &str, op: &str) -> Result<u64, String> {
        parse_size(self.require(name, op)?).map_err(|e| format!("-{name}: {e}"))
    }
}

/// Parses the reference syntax into an invocation rendered in the reference's output shapes.
pub fn parse(argv: &[String]) -> Result<Invocation, String> {
    let f = Flags(collect(argv)?);
    let known = |flag: &str| {
        flag.parse::<fastblock_types::map::Flag>()
            .map(|_| flag.to_string())
    };
    let command = if let Some(flag) = f.get("set") {
        Command::Flag {
            flag: known(flag)?,
            set: true,
        }
    } else if let Some(flag) = f.get("unset") {
        Command::Flag {
            flag: known(flag)?,
            set: false,
        }
    } else {
        let op = f.require("op", "")?;
        op_command(op, &f)?
    };
    let monitors = match f.get("endpoint") {
        Some(e) => e.split(',').map(str::to_string).collect(),
        None => default_monitors(),
    };
    let timeout = match f.get("timeout") {
        Some(t) => Duration::from_millis(
            fastblock_types::units::parse_duration_ms(t).map_err(|e| e.to_string())?,
        ),
        None => Duration::from_secs(30),
    };
    let style = if f.boolean("json")? {
        Style::Json
    } else {
        Style::Legacy
    };
    Ok(Invocation {
        command,
        style,
        monitors,
        timeout,
        keyring: f.get("keyring").map(std::path::PathBuf::from),
        auth_floor: match f
            .get("auth_floor")
            .map(str::to_string)
            .or_else(|| std::env::var("FASTBLOCK_AUTH_FLOOR").ok())
        {
            Some(text) => Some(text.parse().map_err(|e| format!("-auth_floor: {e}"))?),
            None => None,
        },
        name: f.get("name").unwrap_or(DEFAULT_ENTITY).to_string(),
    })
}

fn op_command(op: &str, f: &Flags) -> Result<Command, String> {
    let pool = || f.require("poolname", op).map(str::to_string);
    let image = || f.require("imagename", op).map(str::to_string);
    let osd = || f.number::<u32>("osdid", op).map(OsdId);
    Ok(match op {
        "status" => Command::Status,
        "getosdmap" => Command::OsdLs {
            detail: f.boolean("detail")?,
        },
        "getpgmap" => Command::PgLs {
            pool: f.get("poolname").map(str::to_string),
        },
        "getpgosds" => {
            let pool_id = match f.get("poolid") {
                None | Some("0") => None,
                Some(_) => Some(f.number::<u32>("poolid", op)?),
            };
            Command::OsdPgs {
                pool: None,
                pool_id,
            }
        }
        "listpools" => Command::PoolLs,
        "createpool" => Command::PoolCreate {
            name: pool()?,
            pg_count: f.number("pgcount", op)?,
            size: if f.get("pgsize").is_some() {
                f.number("pgsize", op)?
            } else {
                3
            },
            failure_domain: f
                .get("failure_domain")
                .unwrap_or("osd")
                .parse::<FailureDomain>()?,
        },
        "deletepool" => Command::PoolRm {
            name: pool()?,
            force: f.boolean("force")?,
        },
        "createimage" => Command::ImageCreate {
            pool: pool()?,
            name: image()?,
            size_bytes: f.size("imagesize", op)?,
            object_size_bytes: match f.get("objectsize") {
                Some(_) => Some(f.size("objectsize", op)?),
                None => None,
            },
        },
        "removeimage" => Command::ImageRm {
            pool: pool()?,
            name: image()?,
        },
        "resizeimage" => Command::ImageResize {
            pool: pool()?,
            name: image()?,
            size_bytes: f.size("imagesize", op)?,
            allow_shrink: f.boolean("allow_shrink")?,
        },
        "getimage" => Command::ImageInfo {
            pool: pool()?,
            name: image()?,
        },
        "outosd" => Command::OsdOut(osd()?),
        "inosd" => Command::OsdIn(osd()?),
        "showconfig" => Command::OsdConfig(osd()?),
        "getclustermap" => Command::Map { watch: false },
        "watchclustermap" | "watchosdmap" | "watchpgmap" => Command::Map { watch: true },
        other if other.starts_with("fake") => {
            return Err(format!(
                "-op={other} is a simulation op of the reference system and is not supported"
            ))
        }
        other => return Err(format!("unknown op {other:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Invocation, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn parses_reference_createpool() {
        let inv = p(&[
            "-op=createpool",
            "-poolname=P",
            "-pgcount=8",
            "-pgsize=3",
            "-failure_domain=host",
            "-endpoint=127.0.0.1:4444",
        ])
        .unwrap();
        assert_eq!(
            inv.command,
            Command::PoolCreate {
                name: "P".into(),
                pg_count: 8,
                size: 3,
                failure_domain: FailureDomain::Host
            }
        );
        assert_eq!(inv.monitors, vec!["127.0.0.1:4444".to_string()]);
        assert_eq!(inv.style, Style::Legacy);
    }

    #[test]
    fn accepts_go_flag_forms() {
        let inv = p(&["--op", "getosdmap", "-detail"]).unwrap();
        assert_eq!(inv.command, Command::OsdLs { detail: true });
        let inv = p(&["-set=noReblance"]).unwrap();
        assert_eq!(
            inv.command,
            Command::Flag {
                flag: "noReblance".into(),
                set: true
            }
        );
    }

    #[test]
    fn rejects_bad_input_clearly() {
        assert_eq!(
            p(&["-op=createpool", "-pgcount=8"]).unwrap_err(),
            "-op=createpool needs -poolname"
        );
        assert!(p(&["-op=createpool", "-poolname=x", "-pgcount=abc"])
            .unwrap_err()
            .contains("not a valid number"));
        assert!(p(&["-op=fakeapplyid", "-uuid=x"])
            .unwrap_err()
            .contains("not supported"));
        assert!(p(&["-op=frobnicate"]).unwrap_err().contains("unknown op"));
        assert!(p(&["-set=foo"])
            .unwrap_err()
            .contains("expected noout or norebalance"));
        assert!(p(&["-op=status", "-bogus=1"])
            .unwrap_err()
            .contains("unknown flag"));
        assert!(p(&["-op=outosd", "-osdid"])
            .unwrap_err()
            .contains("needs a value"));
    }

    #[test]
    fn detects_legacy_syntax() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_legacy(&v(&["-op=status"])));
        assert!(is_legacy(&v(&["-unset", "noout"])));
        assert!(!is_legacy(&v(&["status"])));
        assert!(!is_legacy(&v(&["pool", "create", "x", "--pg-count", "8"])));
    }
}
