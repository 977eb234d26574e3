//! The monitor's key table: who holds a key, with which capabilities, at which generation, and
//! the cluster's auth mode (`docs/security.md`). Keys are drawn by the caller (the monitor
//! service) and passed in, so every decision here is deterministic.
//!
//! Every change bumps the map's `auth.epoch` (and so, through [`MonState::finish`], the map
//! epoch): OSDs watching the map refetch the table and drop connections whose entity lost its
//! key or whose generation moved.

use crate::{err, MonState, OpResult};
use fastblock_auth::caps::Caps;
use fastblock_auth::{EntityName, Secret};
use fastblock_types::api::ErrorCode;
use fastblock_types::auth::AuthMode;
use std::collections::BTreeMap;

/// One entity's record in the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthEntity {
    pub key: Secret,
    pub caps: Caps,
    /// Rises with every change of the key or caps (starts at 1).
    pub generation: u64,
}

/// The key table. `configured` is false only in a cluster created before authentication
/// existed or not created yet: the first leader then sets it up ([`MonState::auth_bootstrap`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthTable {
    pub configured: bool,
    pub entities: BTreeMap<EntityName, AuthEntity>,
}

impl AuthTable {
    /// The key that signs `entity`'s monitor calls, if it has one.
    pub fn mon_key(&self, entity: &EntityName) -> Option<Secret> {
        self.entities.get(entity).map(|e| e.key.mon_key())
    }

    fn admins(&self) -> usize {
        self.entities.values().filter(|e| e.caps.admin).count()
    }
}

/// Parses an entity name as the API receives it.
pub fn parse_entity(text: &str) -> OpResult<EntityName> {
    text.parse()
        .or_else(|e: fastblock_auth::AuthError| err(ErrorCode::InvalidArgument, e.to_string()))
}

/// Parses caps for `entity`: `osd` belongs to OSD entities only, and an OSD entity holds
/// exactly `osd` (an OSD key that could administer would let a stolen OSD disk take the
/// cluster).
pub fn parse_caps(entity: &EntityName, text: &str) -> OpResult<Caps> {
    let caps: Caps = text
        .parse()
        .or_else(|e: fastblock_auth::AuthError| err(ErrorCode::InvalidArgument, e.to_string()))?;
    match entity {
        EntityName::Osd(_) if caps != Caps::osd() => err(
            ErrorCode::InvalidArgument,
            format!("{entity} may only hold caps \"osd\", not {text:?}"),
        ),
        EntityName::Client(_) if caps.osd => err(
            ErrorCode::InvalidArgument,
            format!("caps \"osd\" belong to osd.N entities, not {entity}"),
        ),
        _ => Ok(caps),
    }
}

impl MonState {
    fn auth_changed(&mut self) {
        self.map.auth.epoch += 1;
    }

    fn auth_entity(&self, entity: &EntityName) -> OpResult<&AuthEntity> {
        match self.auth.entities.get(entity) {
            Some(e) => Ok(e),
            None => err(
                ErrorCode::EntityNotFound,
                format!("{entity} has no key (see `fastblock-client auth ls`)"),
            ),
        }
    }

    /// Sets up authentication of a cluster that has none yet: the mode, and `client.admin`
    /// with `admin_key` if given.
    pub fn auth_bootstrap(&mut self, mode: AuthMode, admin_key: Option<Secret>) -> OpResult<()> {
        if self.auth.configured {
            return err(
                ErrorCode::Conflict,
                "authentication is already set up in this cluster",
            );
        }
        if mode.authenticates() && admin_key.is_none() {
            return err(
                ErrorCode::InvalidArgument,
                format!("auth mode {mode} needs a client.admin key"),
            );
        }
        self.auth.configured = true;
        self.map.auth.mode = mode;
        if let Some(key) = admin_key {
            self.auth.entities.insert(
                EntityName::admin(),
                AuthEntity {
                    key,
                    caps: Caps::admin(),
                    generation: 1,
                },
            );
        }
        self.auth_changed();
        Ok(())
    }

    /// Creates `entity` with `key`.
    pub fn auth_add(&mut self, entity: &EntityName, caps: Caps, key: Secret) -> OpResult<()> {
        if self.auth.entities.contains_key(entity) {
            return err(
                ErrorCode::EntityExists,
                format!("{entity} already has a key (rotate it with `auth rotate`)"),
            );
        }
        self.auth.entities.insert(
            entity.clone(),
            AuthEntity {
                key,
                caps,
                generation: 1,
            },
        );
        self.auth_changed();
        Ok(())
    }

    /// Returns `entity`'s record, creating it with `caps` and `key` if it has none. An
    /// existing entity with other caps is refused rather than silently changed.
    pub fn auth_get_or_create(
        &mut self,
        entity: &EntityName,
        caps: Caps,
        key: Secret,
    ) -> OpResult<AuthEntity> {
        if let Some(e) = self.auth.entities.get(entity) {
            if e.caps != caps {
                return err(
                    ErrorCode::EntityExists,
                    format!(
                        "{entity} exists with caps {:?}, not {:?} (change them with `auth caps`)",
                        e.caps.to_string(),
                        caps.to_string()
                    ),
                );
            }
            return Ok(e.clone());
        }
        self.auth_add(entity, caps, key)?;
        Ok(self.auth.entities[entity].clone())
    }

    /// Gives `entity` new caps (generation + 1). The last admin cannot lose `admin`.
    pub fn auth_caps(&mut self, entity: &EntityName, caps: Caps) -> OpResult<AuthEntity> {
        let e = self.auth_entity(entity)?;
        if e.caps.admin && !caps.admin && self.auth.admins() == 1 {
            return err(
                ErrorCode::InvalidArgument,
                format!("{entity} is the last entity with caps admin: nobody could administer the cluster"),
            );
        }
        if e.caps == caps {
            return Ok(e.clone());
        }
        let e = self.auth.entities.get_mut(entity).expect("checked above");
        e.caps = caps;
        e.generation += 1;
        let out = e.clone();
        self.auth_changed();
        Ok(out)
    }

    /// Replaces `entity`'s key (generation + 1): the old key stops working.
    pub fn auth_rotate(&mut self, entity: &EntityName, key: Secret) -> OpResult<AuthEntity> {
        self.auth_entity(entity)?;
        let e = self.auth.entities.get_mut(entity).expect("checked above");
        e.key = key;
        e.generation += 1;
        let out = e.clone();
        self.auth_changed();
        Ok(out)
    }

    /// Removes `entity`'s key. The last admin cannot be removed.
    pub fn auth_rm(&mut self, entity: &EntityName) -> OpResult<()> {
        let e = self.auth_entity(entity)?;
        if e.caps.admin && self.auth.admins() == 1 {
            return err(
                ErrorCode::InvalidArgument,
                format!("{entity} is the last entity with caps admin: nobody could administer the cluster"),
            );
        }
        self.auth.entities.remove(entity);
        self.auth_changed();
        Ok(())
    }

    /// Sets the cluster's auth mode. A mode that authenticates needs an admin key first,
    /// or nobody could call the monitor again.
    pub fn auth_set_mode(&mut self, mode: AuthMode) -> OpResult<()> {
        if mode.authenticates() && self.auth.admins() == 0 {
            return err(
                ErrorCode::InvalidArgument,
                format!("auth mode {mode} needs an entity with caps admin first (`auth add client.admin --caps admin`)"),
            );
        }
        if self.map.auth.mode == mode && self.auth.configured {
            return Ok(());
        }
        self.auth.configured = true;
        self.map.auth.mode = mode;
        self.auth_changed();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Secret {
        Secret::from_bytes([b; 32])
    }

    fn boot() -> MonState {
        let mut s = MonState::default();
        let before = s.clone();
        s.auth_bootstrap(AuthMode::Sign, Some(key(1))).unwrap();
        assert!(s.finish(&before));
        s
    }

    fn apply<T>(s: &mut MonState, op: impl FnOnce(&mut MonState) -> OpResult<T>) -> OpResult<T> {
        let before = s.clone();
        let out = op(s);
        match out {
            Ok(v) => {
                s.finish(&before);
                Ok(v)
            }
            Err(e) => {
                *s = before;
                Err(e)
            }
        }
    }

    #[test]
    fn bootstrap_creates_the_admin_once_and_every_change_bumps_both_epochs() {
        let mut s = boot();
        assert_eq!(s.map.auth.mode, AuthMode::Sign);
        assert_eq!(s.auth.mon_key(&EntityName::admin()), Some(key(1).mon_key()));
        assert_eq!(
            apply(&mut s, |s| s.auth_bootstrap(AuthMode::None, None))
                .unwrap_err()
                .code,
            ErrorCode::Conflict
        );
        let vm: EntityName = "client.vm".parse().unwrap();
        let mut last = (s.map.epoch, s.map.auth.epoch);
        type Step = Box<dyn Fn(&mut MonState) -> OpResult<()>>;
        let steps: Vec<Step> = vec![
            Box::new(|s| {
                s.auth_add(
                    &"client.vm".parse().unwrap(),
                    "pool=a".parse().unwrap(),
                    key(2),
                )
            }),
            Box::new(|s| {
                s.auth_caps(&"client.vm".parse().unwrap(), "pool=b".parse().unwrap())
                    .map(|_| ())
            }),
            Box::new(|s| {
                s.auth_rotate(&"client.vm".parse().unwrap(), key(3))
                    .map(|_| ())
            }),
            Box::new(|s| s.auth_set_mode(AuthMode::Secure)),
            Box::new(|s| s.auth_rm(&"client.vm".parse().unwrap())),
        ];
        for (i, step) in steps.iter().enumerate() {
            apply(&mut s, step).unwrap();
            assert!(
                s.map.epoch > last.0 && s.map.auth.epoch > last.1,
                "step {i}"
            );
            last = (s.map.epoch, s.map.auth.epoch);
            if i == 2 {
                let e = &s.auth.entities[&vm];
                assert_eq!((e.generation, &e.key), (3, &key(3)));
            }
        }
        assert!(!s.auth.entities.contains_key(&vm));
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = boot();
        let admin = EntityName::admin();
        let before = s.clone();
        let codes = [
            apply(&mut s, |s| s.auth_add(&admin, Caps::admin(), key(9)))
                .unwrap_err()
                .code,
            apply(&mut s, |s| s.auth_rm(&admin)).unwrap_err().code,
            apply(&mut s, |s| {
                s.auth_caps(&admin, "pool=*".parse().unwrap()).map(|_| ())
            })
            .unwrap_err()
            .code,
            apply(&mut s, |s| s.auth_rm(&"client.nobody".parse().unwrap()))
                .unwrap_err()
                .code,
            apply(&mut s, |s| {
                s.auth_get_or_create(&admin, "pool=a".parse().unwrap(), key(9))
                    .map(|_| ())
            })
            .unwrap_err()
            .code,
        ];
        assert_eq!(
            codes,
            [
                ErrorCode::EntityExists,
                ErrorCode::InvalidArgument,
                ErrorCode::InvalidArgument,
                ErrorCode::EntityNotFound,
                ErrorCode::EntityExists
            ]
        );
        assert_eq!(s, before);
        // get-or-create of an existing entity with its caps returns its key unchanged.
        let got = apply(&mut s, |s| {
            s.auth_get_or_create(&admin, Caps::admin(), key(9))
        })
        .unwrap();
        assert_eq!(got.key, key(1));
        assert_eq!(s, before);
        // A second admin makes removing the first possible.
        apply(&mut s, |s| {
            s.auth_add(&"client.ops".parse().unwrap(), Caps::admin(), key(4))
        })
        .unwrap();
        apply(&mut s, |s| s.auth_rm(&admin)).unwrap();
    }

    #[test]
    fn caps_fit_the_entity_and_modes_need_an_admin() {
        let osd: EntityName = "osd.3".parse().unwrap();
        let vm: EntityName = "client.vm".parse().unwrap();
        assert!(parse_caps(&osd, "osd").is_ok());
        assert!(parse_caps(&osd, "admin").is_err());
        assert!(parse_caps(&osd, "osd pool=*").is_err());
        assert!(parse_caps(&vm, "osd").is_err());
        assert!(parse_caps(&vm, "pool=a pool=b").is_ok());
        assert!(parse_entity("mon.a").is_err());
        let mut s = MonState::default();
        assert!(apply(&mut s, |s| s.auth_bootstrap(AuthMode::Sign, None)).is_err());
        apply(&mut s, |s| s.auth_bootstrap(AuthMode::None, None)).unwrap();
        assert_eq!(
            apply(&mut s, |s| s.auth_set_mode(AuthMode::Sign))
                .unwrap_err()
                .code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(s.map.auth.mode, AuthMode::None);
    }
}
