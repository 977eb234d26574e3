//! Read-only views of the core's state between steps, for the simulator's checks and tools.
//! Nothing here changes state.

use crate::config::ShardConfig;
use crate::core::ShardCore;
use crate::error::ShardFailure;
use fastblock_pg::PgReplica;
use fastblock_store::{Disk, ObjectId, PgStorage, Store};
use fastblock_types::PgId;

impl<D: Disk + 'static> ShardCore<D> {
    pub fn failure(&self) -> Option<&ShardFailure> {
        self.failed.as_ref()
    }

    pub fn config(&self) -> &ShardConfig {
        &self.cfg
    }

    /// The store, for tools and the simulator's checks between steps.
    pub fn store(&self) -> std::cell::Ref<'_, Store<D>> {
        self.store.borrow()
    }

    /// The replica of `pg`, if hosted (read-only: for the simulator's checks).
    pub fn replica(&self, pg: PgId) -> Option<&PgReplica<PgStorage<D>>> {
        self.pgs.get(&pg).map(|h| &h.replica)
    }

    pub fn hosted(&self) -> impl Iterator<Item = PgId> + '_ {
        self.pgs.keys().copied()
    }

    pub fn map_epoch(&self) -> fastblock_types::Epoch {
        self.map.epoch
    }

    /// Objects of `pg` in this replica's store (the simulator compares replicas).
    pub fn list_objects(&self, pg: PgId) -> fastblock_store::Result<Vec<ObjectId>> {
        self.store.borrow_mut().list_objects(pg)
    }

    /// Reads applied data of `pg` straight from the store, past the PG (no read barrier, no
    /// admission): the simulator's final check of every block and of replica equality.
    pub fn read_object(
        &self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> fastblock_store::Result<()> {
        self.store
            .borrow_mut()
            .read_object(pg, object, offset_bytes, buf)
    }
}
