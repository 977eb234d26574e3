//! Space: a full disk is an admission decision, never a crash.
//!
//! Two things can run out under a shard, and a mutation that needs room is refused with
//! `NoSpace` before either does (reads, deletes, reclaims and aligned discards are never
//! refused for space: they need none, or give space back; a reclaim that cuts an object at
//! an unaligned size rewrites one block, which the reserve holds):
//!
//! - **The data region** (the store's own allocator): the blocks free now plus those flushes
//!   give back (freed since the last flush, or by one still committing) must cover the
//!   reserve ([`ShardConfig::data_reserve_bytes`]), the space the mutations this shard
//!   admitted and has not answered yet may take, the room held for snapshots being received
//!   (`crate::recovery`), and what this mutation may take. That is every block a write or
//!   copy-up piece touches (each is written anew: copy-on-write), the whole object for a
//!   rollback (it may copy every block back from the snapshot), and the partial end blocks
//!   of a discard or write-zeroes (rewritten with zeros; at most two). The mutations in
//!   flight count because each is applied after admission: a burst admitted against the
//!   same free count must still fit, or applying one would fail and stop the shard (every
//!   replica applies the same entry). A discard or write-zeroes may use the reserve, so that
//!   what gives space back goes on while writes are refused, but is refused like a write if
//!   even that cannot hold its partial blocks. Blocks flushes give back count because every
//!   store operation that allocates flushes first when it needs them (`Store`'s
//!   `guard_allocating`), so a client that discards or removes data can write again at once.
//! - **The host file system** holding the shard's metadata (the data file is preallocated,
//!   but the redb metadata grows, and so can anything else on that file system): the runtime
//!   samples its free bytes ([`crate::Input::HostSpace`]); below
//!   [`ShardConfig::host_space_reserve_bytes`] plus what the mutation may take, writes,
//!   copy-ups and rollbacks are refused,
//!   so flushes still find room for the metadata of what was admitted. The next sample that
//!   shows room lets writes in again.
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

    /// Why a mutation that takes up to `space_bytes` of the data region when applied (a
    /// write, copy-up piece or rollback) must be refused for lack of space (the `NoSpace`
    /// message), or `None` when both the data region and the host file system have room.
    pub(crate) fn space_refusal(&self, space_bytes: u64) -> Option<String> {
        self.data_region_refusal(space_bytes, self.cfg.data_reserve_bytes)
            .or_else(|| self.host_space_refusal(space_bytes))
    }

    /// The same for a discard or write-zeroes whose unaligned ends take `space_bytes` (at most
    /// two blocks): it may use the reserve, so that what gives space back goes on while
    /// writes are refused, but never more than the region holds beside what is in flight.
    pub(crate) fn zeroing_refusal(&self, space_bytes: u64) -> Option<String> {
        (space_bytes > 0)
            .then(|| self.data_region_refusal(space_bytes, 0))
            .flatten()
    }

    fn data_region_refusal(&self, space_bytes: u64, reserve: u64) -> Option<String> {
        let osd = self.cfg.osd;
        let (free, pending_free) = {
            let store = self.store.borrow();
            (store.free_data_bytes(), store.pending_free_bytes())
        };
        let available = free.saturating_add(pending_free);
        let in_flight = self.pending_space_bytes;
        let recovery = self.recovery.reserved_bytes();
        let needed = reserve
            .saturating_add(in_flight)
            .saturating_add(recovery)
            .saturating_add(space_bytes);
        (available < needed).then(|| {
            format!(
                "osd.{osd} is full: its data region has {available} bytes free ({pending_free} \
                 of them once flushed), {in_flight} held for mutations in flight and {recovery} \
                 for snapshots being received: no room for {space_bytes} more above its \
                 reserve of {reserve}"
            )
        })
    }

    fn host_space_refusal(&self, space_bytes: u64) -> Option<String> {
        let osd = self.cfg.osd;
        let host_reserve = self.cfg.host_space_reserve_bytes;
        match self.host_free_bytes {
            Some(host_free) if host_free < host_reserve.saturating_add(space_bytes) => {
                Some(format!(
                    "osd.{osd} is full: the file system holding osd.{osd}'s metadata has \
                     {host_free} bytes free, below its reserve of {host_reserve}"
                ))
            }
            _ => None,
        }
    }
}
