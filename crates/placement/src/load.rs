//! Per-OSD counts of members and preferred leaders.

use fastblock_types::OsdId;
use std::collections::BTreeMap;

/// Per-OSD counts `(members, primaries)` of a set of member lists, where a primary is the
/// preferred leader at position 0. Every OSD that appears in some list has an entry; OSDs that
/// appear nowhere have none (callers that need zeros for idle OSDs add them).
pub fn load(targets: &BTreeMap<u32, Vec<OsdId>>) -> BTreeMap<OsdId, (u32, u32)> {
    let mut counts: BTreeMap<OsdId, (u32, u32)> = BTreeMap::new();
    for list in targets.values() {
        for (position, &osd) in list.iter().enumerate() {
            let entry = counts.entry(osd).or_default();
            entry.0 += 1;
            if position == 0 {
                entry.1 += 1;
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_members_and_primaries() {
        let targets = BTreeMap::from([
            (0, vec![OsdId(1), OsdId(2)]),
            (1, vec![OsdId(2), OsdId(3)]),
            (2, vec![]),
        ]);
        let counts = load(&targets);
        assert_eq!(counts[&OsdId(1)], (1, 1));
        assert_eq!(counts[&OsdId(2)], (2, 1));
        assert_eq!(counts[&OsdId(3)], (1, 0));
        assert_eq!(counts.len(), 3);
    }
}
