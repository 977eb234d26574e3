//! [`OsdTable`]: the map's OSDs by id, each shared between copies of the table.
//!
//! Why not a `BTreeMap<OsdId, OsdInfo>`: every holder of the map (each OSD, each client, the
//! monitor at every operation) copies its map to apply an epoch, and an epoch that marks OSDs
//! down or out changes the table. A deep copy of 1,000 OSDs is some 5,000 allocations (each
//! `OsdInfo` holds its uuid, host, address and reported configuration); here a copy costs one
//! reference count per OSD, and only the OSDs an epoch changes are copied. At 1,000 OSDs that
//! deep copy was the largest part of what the scale harness's simulated daemons did when a
//! host went down (`docs/scale.md`).
//!
//! It reads and writes as JSON exactly as the map it replaces, `{"<id>": OsdInfo, ...}`.

use crate::ids::OsdId;
use crate::map::OsdInfo;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The OSDs of a map by id (see the module documentation).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct OsdTable {
    osds: BTreeMap<OsdId, Arc<OsdInfo>>,
}

impl OsdTable {
    pub fn new() -> Self {
        OsdTable::default()
    }

    pub fn len(&self) -> usize {
        self.osds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.osds.is_empty()
    }

    pub fn get(&self, id: &OsdId) -> Option<&OsdInfo> {
        self.osds.get(id).map(|o| &**o)
    }

    pub fn contains_key(&self, id: &OsdId) -> bool {
        self.osds.contains_key(id)
    }

    /// The OSD to change, copied first if another table shares it.
    pub fn get_mut(&mut self, id: &OsdId) -> Option<&mut OsdInfo> {
        self.osds.get_mut(id).map(Arc::make_mut)
    }

    pub fn insert(&mut self, id: OsdId, osd: OsdInfo) -> Option<OsdInfo> {
        self.osds
            .insert(id, Arc::new(osd))
            .map(Arc::unwrap_or_clone)
    }

    pub fn remove(&mut self, id: &OsdId) -> Option<OsdInfo> {
        self.osds.remove(id).map(Arc::unwrap_or_clone)
    }

    /// Every OSD in id order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&OsdId, &OsdInfo)> + Clone + '_ {
        self.osds.iter().map(|(id, o)| (id, &**o))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &OsdId> + Clone + '_ {
        self.osds.keys()
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &OsdInfo> + Clone + '_ {
        self.osds.values().map(|o| &**o)
    }

    /// Whether the two tables hold the same OSD at `id` by sharing it (then equal without a
    /// look).
    pub fn shares(&self, other: &OsdTable, id: &OsdId) -> bool {
        match (self.osds.get(id), other.osds.get(id)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Which OSDs are up, by id, for lookups without searching the OSD table: the monitor's
/// decisions look up every member of every PG they derive, and each simulated OSD of the
/// scale harness the members of each of its PGs at every map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpOsds(Vec<bool>);

impl UpOsds {
    pub fn of(osds: &OsdTable) -> UpOsds {
        UpOsds::from_ids(
            &osds
                .values()
                .filter(|o| o.up)
                .map(|o| o.id)
                .collect::<Vec<_>>(),
        )
    }

    pub fn from_ids(ids: &[OsdId]) -> UpOsds {
        let len = ids.iter().map(|o| o.0 as usize + 1).max().unwrap_or(0);
        let mut up = vec![false; len];
        for id in ids {
            up[id.0 as usize] = true;
        }
        UpOsds(up)
    }

    pub fn is_up(&self, id: OsdId) -> bool {
        self.0.get(id.0 as usize).copied().unwrap_or(false)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for OsdTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(OsdId, OsdInfo)> for OsdTable {
    fn from_iter<I: IntoIterator<Item = (OsdId, OsdInfo)>>(iter: I) -> Self {
        OsdTable {
            osds: iter.into_iter().map(|(id, o)| (id, Arc::new(o))).collect(),
        }
    }
}

impl From<BTreeMap<OsdId, OsdInfo>> for OsdTable {
    fn from(map: BTreeMap<OsdId, OsdInfo>) -> Self {
        map.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a OsdTable {
    type Item = (&'a OsdId, &'a OsdInfo);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a OsdId, &'a OsdInfo)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::ops::Index<&OsdId> for OsdTable {
    type Output = OsdInfo;
    fn index(&self, id: &OsdId) -> &OsdInfo {
        self.get(id).expect("no OSD of that id")
    }
}

impl Serialize for OsdTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.osds.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for OsdTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(OsdTable {
            osds: BTreeMap::deserialize(deserializer)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn osd(id: u32, host: &str) -> OsdInfo {
        serde_json::from_value(serde_json::json!({
            "id": id, "uuid": format!("u{id}"), "host": host, "address": "127.0.0.1",
            "port": 1, "shards": 1, "capacity_bytes": 1, "up": true, "in": true,
            "pending_create": false, "boot_epoch": 1, "config": ""
        }))
        .expect("an OsdInfo")
    }

    /// Goal: a copy shares every OSD until one is changed, the change copies that OSD alone
    /// and never shows in the original, and the JSON is the plain map's. Method: a table of
    /// three, a copy with one OSD changed and one removed, against a `BTreeMap` model.
    #[test]
    fn a_copy_shares_its_osds_until_one_changes_and_reads_as_a_plain_map() {
        let model: BTreeMap<OsdId, OsdInfo> = (1..=3).map(|i| (OsdId(i), osd(i, "h"))).collect();
        let table = OsdTable::from(model.clone());
        let mut copy = table.clone();
        assert!((1..=3).all(|i| copy.shares(&table, &OsdId(i))));
        copy.get_mut(&OsdId(2)).expect("osd.2").up = false;
        assert_eq!(copy.remove(&OsdId(3)).map(|o| o.id), Some(OsdId(3)));
        assert!(copy.shares(&table, &OsdId(1)));
        assert!(!copy.shares(&table, &OsdId(2)));
        assert!(
            table.get(&OsdId(2)).expect("osd.2").up,
            "the original is unchanged"
        );
        assert_eq!(
            table
                .iter()
                .map(|(i, o)| (*i, o.clone()))
                .collect::<BTreeMap<_, _>>(),
            model
        );
        assert_eq!(
            copy.keys().copied().collect::<Vec<_>>(),
            [OsdId(1), OsdId(2)]
        );
        assert_ne!(copy, table);
        let json = serde_json::to_value(&table).expect("json");
        assert_eq!(json, serde_json::to_value(&model).expect("json"));
        let back: OsdTable = serde_json::from_value(json).expect("read back");
        assert_eq!(back, table);
        assert_eq!(
            serde_json::from_str::<OsdTable>("[1]").map_err(|e| e.is_data()),
            Err(true),
            "not a map: refused"
        );
    }
}
