//! Space: a full disk is an admission decision, never a crash.
//!
//! Two things can run out under a shard, and a write is refused with `NoSpace` before
//! either does (reads, discards, zeroing, deletes and reclaims are never refused for space:
//! they need none, or give space back):
//!
//! - **The data region** (the store's own allocator): the blocks free now plus those flushes
//!   give back (freed since the last flush, or by one still committing) must cover the
//!   reserve ([`ShardConfig::data_reserve_bytes`]), the writes this shard admitted and has not
//!   answered yet, the room held for snapshots being received (`crate::recovery`), and this
//!   write. The writes in flight
//!   count because each is applied into new blocks (copy-on-write) after admission: a burst
//!   admitted against the same free count must still fit, or applying one would fail and
//!   stop the shard. Blocks flushes give back count because a write that needs them makes
//!   the store flush first (`Store::write_object`), so a client that discards or removes
//!   data can write again at once.
//! - **The host file system** holding the shard's metadata (the data file is preallocated,
//!   but the redb metadata grows, and so can anything else on that file system): the runtime
//!   samples its free bytes ([`crate::Input::HostSpace`]); below
//!   [`ShardConfig::host_space_reserve_bytes`] plus the write's length, writes are refused,
//!   so flushes still find room for the metadata of what was admitted. The next sample that
//!   shows room lets writes in again.
//!
//!
//! A third rule comes from the cluster map: a PG with a member the monitor marks full (past the
//! full ratio, `map.space.full_osds`) takes no writes either ([`ShardCore::full_osd_refusal`]).
//! The monitor decides which OSDs are full from every OSD's space reports
//! (`fastblock_mon_core::capacity`); the PG's leader refuses here, at admission, because a
//! write it admitted must be stored by every member, a full follower included. The same rule
//! as the two above applies: only what needs room is refused.
//!
//! [`ShardConfig::data_reserve_bytes`]: crate::ShardConfig::data_reserve_bytes
//! [`ShardConfig::host_space_reserve_bytes`]: crate::ShardConfig::host_space_reserve_bytes

use crate::core::ShardCore;
use fastblock_store::Disk;

impl<D: Disk + 'static> ShardCore<D> {
    /// `HostSpace`: keeps the sample; logs when writes stop or resume because of it.
    pub(crate) fn on_host_space(&mut self, free_bytes: u64) {
        let reserve = self.cfg.host_space_reserve_bytes;
        let was_low = self.host_free_bytes.is_some_and(|f| f < reserve);
        let low = free_bytes < reserve;
        if low && !was_low {
            tracing::warn!(osd = %self.cfg.osd, shard = self.cfg.index, free_bytes, reserve_bytes = reserve,
                "the file system holding the metadata is below its reserve: refusing writes");
        } else if was_low && !low {
            tracing::info!(osd = %self.cfg.osd, shard = self.cfg.index, free_bytes, reserve_bytes = reserve,
                "the file system holding the metadata has room again: taking writes");
        }
        self.host_free_bytes = Some(free_bytes);
    }

    /// Why a write to `pg` must be refused because the map marks one of its members full (the
    /// `NoSpace` message), or `None`. Every member counts (current, target and learners): each
    /// stores what the leader commits.
    pub(crate) fn full_osd_refusal(&self, pg: fastblock_types::PgId) -> Option<String> {
        let full = &self.map.space.full_osds;
        if full.is_empty() {
            return None;
        }
        let info = self.map.pg(pg)?;
        let osd = info
            .osdlist
            .iter()
            .chain(&info.newosdlist)
            .chain(&info.learners)
            .find(|o| full.contains(o))?;
        Some(format!(
            "pg {pg}: osd.{osd} is full (past the full ratio, {:.1}%): writes are refused \
             until space is freed or the ratio is raised",
            f64::from(self.map.space.full_ratio_ppm) / 10_000.0
        ))
    }

    /// Why a write of `length_bytes` must be refused for lack of space (the `NoSpace`
    /// message), or `None` when both the data region and the host file system have room.
    pub(crate) fn space_refusal(&self, length_bytes: u64) -> Option<String> {
        let osd = self.cfg.osd;
        let (free, pending_free) = {
            let store = self.store.borrow();
            (store.free_data_bytes(), store.pending_free_bytes())
        };
        let available = free.saturating_add(pending_free);
        let reserve = self.cfg.data_reserve_bytes;
        let in_flight = self.pending_mutation_bytes;
        let recovery = self.recovery.reserved_bytes();
        let needed = reserve
            .saturating_add(in_flight)
            .saturating_add(recovery)
            .saturating_add(length_bytes);
        if available < needed {
            return Some(format!(
                "osd.{osd} is full: its data region has {available} bytes free ({pending_free} \
                 of them once flushed), {in_flight} held for writes in flight and {recovery} \
                 for snapshots being received, below its reserve of {reserve}"
            ));
        }
        let host_reserve = self.cfg.host_space_reserve_bytes;
        match self.host_free_bytes {
            Some(host_free) if host_free < host_reserve.saturating_add(length_bytes) => {
                Some(format!(
                    "osd.{osd} is full: the file system holding osd.{osd}'s metadata has \
                     {host_free} bytes free, below its reserve of {host_reserve}"
                ))
            }
            _ => None,
        }
    }
}
