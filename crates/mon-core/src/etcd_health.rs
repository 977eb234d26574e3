//! The health checks about the monitors' etcd (`MON_ETCD_NEARFULL`, `MON_ETCD_NOSPACE`),
//! from what the monitor last saw of it (`fastblock_types::etcd::EtcdStatus`).

use crate::health::{check, percent, Health};
use fastblock_types::api::Severity;
use fastblock_types::etcd::{EtcdMemberStatus, EtcdStatus, ETCD_ALARM_NOSPACE};
use fastblock_types::units::format_size;

impl Health {
    /// Adds `MON_ETCD_NOSPACE` (ERR: etcd raised its out-of-space alarm and refuses every
    /// write, so no map change can be made) or, short of it, `MON_ETCD_NEARFULL` (WARN: a
    /// member's database file reached the nearfull share of the quota). Each names the way
    /// out, which depends on why the file is big: history kept because compaction is off, free
    /// pages a defragmentation gives back, or data that fills the quota by itself.
    pub fn add_etcd(&mut self, etcd: &EtcdStatus) {
        if etcd.quota_bytes == 0 || etcd.observed_unix_ms == 0 {
            return;
        }
        let ratio =
            |bytes: u64| (u128::from(bytes) * 1_000_000 / u128::from(etcd.quota_bytes)) as u32;
        let nearfull = |bytes: u64| ratio(bytes) >= etcd.nearfull_ratio_ppm;
        let member_line = |m: &EtcdMemberStatus| {
            format!(
                "etcd member {}: database {} of the {} quota ({}), {} in use",
                m.name,
                format_size(m.db_size_bytes),
                format_size(etcd.quota_bytes),
                percent(ratio(m.db_size_bytes)),
                format_size(m.db_size_in_use_bytes)
            )
        };
        let data_fills = etcd
            .members
            .iter()
            .any(|m| m.error.is_none() && nearfull(m.db_size_in_use_bytes));
        let way_out = if etcd.compact_interval_ms == 0 {
            "compaction is off: turn it on on the leading monitor (`fastblock-client config set \
             mon.NAME etcd_compact_interval 10s`) and it compacts, defragments and clears the \
             alarm"
                .to_string()
        } else if data_fills {
            "the data alone fills the quota: raise --etcd-quota-bytes on every monitor (one at \
             a time), or remove pools, images or snapshots"
                .to_string()
        } else {
            "the monitor compacts the history and defragments the members one at a time; it \
             clears the alarm once room is made"
                .to_string()
        };
        if etcd.nospace() {
            let members: Vec<&str> = etcd
                .alarms
                .iter()
                .filter(|a| a.alarm == ETCD_ALARM_NOSPACE)
                .map(|a| a.member.as_str())
                .collect();
            let summary = format!(
                "etcd is out of space (NOSPACE raised by {}): every map change fails; {way_out}",
                members.join(", ")
            );
            let mut lines: Vec<String> = etcd.members.iter().map(member_line).collect();
            if let Some(recovery) = &etcd.recovery {
                lines.push(recovery.clone());
            }
            self.push(check("MON_ETCD_NOSPACE", Severity::Err, summary, lines));
            return;
        }
        let full: Vec<&EtcdMemberStatus> = etcd
            .members
            .iter()
            .filter(|m| m.error.is_none() && nearfull(m.db_size_bytes))
            .collect();
        let Some(biggest) = full.iter().max_by_key(|m| m.db_size_bytes) else {
            return;
        };
        let summary = format!(
            "etcd database at {} of its quota ({} of {}, nearfull at {}); {way_out}",
            percent(ratio(biggest.db_size_bytes)),
            format_size(biggest.db_size_bytes),
            format_size(etcd.quota_bytes),
            percent(etcd.nearfull_ratio_ppm)
        );
        let lines = full.iter().map(|m| member_line(m)).collect();
        self.push(check("MON_ETCD_NEARFULL", Severity::Warn, summary, lines));
    }
}

#[cfg(test)]
mod tests {
    use crate::health::health;
    use crate::MonState;
    use fastblock_types::api::Severity;
    use fastblock_types::etcd::{EtcdAlarm, EtcdMemberStatus, EtcdStatus};
    use fastblock_types::units::MIB;

    fn etcd(db_mib: u64, in_use_mib: u64, compact_interval_ms: u64) -> EtcdStatus {
        EtcdStatus {
            members: vec![EtcdMemberStatus {
                name: "a".into(),
                endpoint: "http://127.0.0.1:2379".into(),
                db_size_bytes: db_mib * MIB,
                db_size_in_use_bytes: in_use_mib * MIB,
                is_leader: true,
                error: None,
            }],
            quota_bytes: 100 * MIB,
            nearfull_ratio_ppm: 800_000,
            revision: 10,
            compact_interval_ms,
            observed_unix_ms: 1,
            ..EtcdStatus::default()
        }
    }

    fn checks(e: &EtcdStatus) -> Vec<(String, Severity, String)> {
        let mut h = health(&MonState::default(), &[]);
        h.add_etcd(e);
        h.checks
            .into_iter()
            .map(|c| (c.code, c.severity, c.summary))
            .collect()
    }

    #[test]
    fn below_nearfull_nothing_is_raised_and_an_unobserved_etcd_says_nothing() {
        assert!(checks(&etcd(79, 10, 10_000)).is_empty());
        let mut unseen = etcd(99, 99, 0);
        unseen.observed_unix_ms = 0;
        assert!(checks(&unseen).is_empty());
    }

    #[test]
    fn nearfull_names_the_way_out_by_cause() {
        let c = checks(&etcd(80, 10, 10_000));
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].0.as_str(), c[0].1),
            ("MON_ETCD_NEARFULL", Severity::Warn)
        );
        assert!(c[0].2.contains("80.0% of its quota"), "{}", c[0].2);
        assert!(c[0].2.contains("defragments"), "{}", c[0].2);
        let off = checks(&etcd(80, 79, 0));
        assert!(off[0].2.contains("compaction is off"), "{}", off[0].2);
        assert!(off[0].2.contains("etcd_compact_interval"), "{}", off[0].2);
        let data = checks(&etcd(90, 85, 10_000));
        assert!(data[0].2.contains("--etcd-quota-bytes"), "{}", data[0].2);
    }

    #[test]
    fn nospace_is_an_error_and_replaces_nearfull() {
        let mut e = etcd(101, 101, 0);
        e.alarms.push(EtcdAlarm {
            member: "a".into(),
            alarm: "NOSPACE".into(),
        });
        e.recovery = Some("compacted to revision 9".into());
        let mut h = health(&MonState::default(), &[]);
        h.add_etcd(&e);
        assert_eq!(h.status, "HEALTH_ERR");
        assert_eq!(h.checks.len(), 1);
        let c = &h.checks[0];
        assert_eq!(
            (c.code.as_str(), c.severity),
            ("MON_ETCD_NOSPACE", Severity::Err)
        );
        assert!(c.summary.contains("NOSPACE raised by a"), "{}", c.summary);
        assert!(c.summary.contains("compaction is off"), "{}", c.summary);
        assert!(c
            .detail
            .iter()
            .any(|l| l.contains("compacted to revision 9")));
        assert!(
            c.detail[0].contains("etcd member a: database 101 MiB of the 100 MiB quota"),
            "{:?}",
            c.detail
        );
    }
}
