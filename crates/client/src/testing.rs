//! Test support (feature `test-util`): an in-memory fake OSD that speaks the wire protocol, and
//! builders for the map and image a test injects with [`crate::Cluster::with_map`].
//!
//! The fake OSD answers `GetLeader` with a configurable hint (itself by default) and serves
//! Write/Read/Discard/WriteZeroes from an in-memory object table, so a whole image can be
//! written and read back. A test scripts failures with [`FakeOsd::push_replies`] (answers for
//! the next IO requests, in order) or [`FakeOsd::set_handler`] (a function of every request).
//! It is a test double, not a model of an OSD: no Raft, no leases, no durability.

use bytes::{Bytes, BytesMut};
use fastblock_types::map::{
    ClusterMap, FailureDomain, ImageInfo, OsdInfo, PgInfo, PgMap, PoolInfo,
};
use fastblock_types::{Epoch, ImageId, OsdId, PgState, PoolId};
use fastblock_wire::{AllocatedRange, FrameDecoder, LeaderHint, Reply, Request, Status};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The pool every builder map has.
pub const POOL: PoolId = PoolId(1);
/// Its name.
pub const POOL_NAME: &str = "fb";

type Handler = Box<dyn Fn(&Request) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct FakeState {
    objects: HashMap<(ImageId, u64), Vec<u8>>,
    scripted: VecDeque<Reply>,
    handler: Option<Handler>,
    leader: Option<LeaderHint>,
    requests: Vec<Request>,
    /// IO requests are recorded and never answered (a leader cut off from the network).
    silent: bool,
}

/// The term a fake OSD's leader hints name (it does not fence mutations by term).
pub const FAKE_TERM: u64 = 1;

/// A fake OSD listening on 127.0.0.1 (a random port). Stops when dropped.
pub struct FakeOsd {
    pub id: OsdId,
    address: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    task: JoinHandle<()>,
}

fn lock(state: &Mutex<FakeState>) -> MutexGuard<'_, FakeState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeOsd {
    /// Starts a fake OSD with id `id`; it answers `GetLeader` naming itself.
    pub async fn start(id: u32) -> FakeOsd {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a test port");
        let address = listener.local_addr().expect("local address");
        let state = Arc::new(Mutex::new(FakeState {
            leader: Some(LeaderHint {
                osd: OsdId(id),
                address: address.ip().to_string(),
                port: address.port(),
                term: FAKE_TERM,
            }),
            ..FakeState::default()
        }));
        let accept_state = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, accept_state.clone()));
            }
        });
        FakeOsd {
            id: OsdId(id),
            address,
            state,
            task,
        }
    }

    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// The hint this OSD gives for "who leads?" (this OSD's own by default).
    pub fn hint(&self) -> LeaderHint {
        LeaderHint {
            osd: self.id,
            address: self.address.ip().to_string(),
            port: self.address.port(),
            term: FAKE_TERM,
        }
    }

    /// What `GetLeader` answers: `None` answers "unknown" (osd 0).
    pub fn set_leader(&self, leader: Option<LeaderHint>) {
        lock(&self.state).leader = leader;
    }

    /// Answers for the next IO requests (not `GetLeader`), in order; afterwards the OSD serves
    /// normally again.
    pub fn push_replies(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.state).scripted.extend(replies);
    }

    /// A function consulted for every request before anything else; `None` lets the request
    /// through to the script and the object table.
    pub fn set_handler(&self, handler: impl Fn(&Request) -> Option<Reply> + Send + Sync + 'static) {
        lock(&self.state).handler = Some(Box::new(handler));
    }

    /// Whether IO requests (not `GetLeader`) go unanswered, as on a leader whose replies are
    /// lost; they are still recorded.
    pub fn set_silent(&self, silent: bool) {
        lock(&self.state).silent = silent;
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.state).requests.clone()
    }

    /// IO requests (not `GetLeader`) received so far.
    pub fn io_count(&self) -> usize {
        lock(&self.state)
            .requests
            .iter()
            .filter(|r| !matches!(r, Request::GetLeader { .. }))
            .count()
    }
}

impl Drop for FakeOsd {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, state: Arc<Mutex<FakeState>>) {
    let mut decoder = FrameDecoder::default();
    let mut buffer = BytesMut::with_capacity(64 << 10);
    let mut out = BytesMut::new();
    loop {
        loop {
            let frame = match decoder.decode(&mut buffer) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => return,
            };
            let reply = match Request::decode(&frame) {
                Ok(request) => answer(&state, request),
                Err(e) => Some(Reply::error(Status::InvalidArgument, None, e.to_string())),
            };
            if let Some(reply) = reply {
                reply.encode(frame.request_id, &mut out);
            }
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        buffer.reserve(64 << 10);
        match stream.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The reply to `request`, `None` for none at all (a silent OSD).
fn answer(state: &Mutex<FakeState>, request: Request) -> Option<Reply> {
    let mut state = lock(state);
    state.requests.push(request.clone());
    if state.silent && !matches!(request, Request::GetLeader { .. }) {
        return None;
    }
    Some(reply_to(&mut state, request))
}

fn reply_to(state: &mut FakeState, request: Request) -> Reply {
    if let Some(reply) = state.handler.as_ref().and_then(|h| h(&request)) {
        return reply;
    }
    if let Request::GetLeader { .. } = request {
        let hint = state.leader.clone().unwrap_or(LeaderHint {
            osd: OsdId(0),
            address: String::new(),
            port: 0,
            term: 0,
        });
        return Reply::Leader(hint);
    }
    if let Some(reply) = state.scripted.pop_front() {
        return reply;
    }
    let object = |addr: &fastblock_wire::ObjectAddr| (addr.image, addr.object_index);
    match request {
        Request::Write {
            addr, offset, data, ..
        } => {
            let bytes = state.objects.entry(object(&addr)).or_default();
            let end = offset as usize + data.len();
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[offset as usize..end].copy_from_slice(&data);
            Reply::Ok
        }
        Request::Read {
            addr,
            offset,
            length,
            ..
        } => {
            let mut data = vec![0u8; length as usize];
            if let Some(bytes) = state.objects.get(&object(&addr)) {
                let start = (offset as usize).min(bytes.len());
                let end = (offset as usize + length as usize).min(bytes.len());
                data[..end - start].copy_from_slice(&bytes[start..end]);
            }
            Reply::Data(Bytes::from(data))
        }
        Request::Discard {
            addr,
            offset,
            length,
            ..
        }
        | Request::WriteZeroes {
            addr,
            offset,
            length,
            ..
        } => {
            if let Some(bytes) = state.objects.get_mut(&object(&addr)) {
                let start = (offset as usize).min(bytes.len());
                let end = (offset as usize + length as usize).min(bytes.len());
                bytes[start..end].fill(0);
            }
            Reply::Ok
        }
        // The fake stores objects as plain bytes: a 4 KiB block holding any non-zero byte
        // counts as allocated, so discarded and never-written blocks are holes.
        Request::Allocation {
            addr,
            offset,
            length,
            ..
        } => {
            let bytes = state.objects.get(&object(&addr));
            let end = u64::from(offset) + u64::from(length);
            let mut ranges: Vec<AllocatedRange> = Vec::new();
            let mut block = u64::from(offset) / 4096;
            while block * 4096 < end {
                let lo = (block * 4096).max(u64::from(offset));
                let hi = ((block + 1) * 4096).min(end);
                let data = bytes.map_or(&[][..], |b| {
                    &b[(lo as usize).min(b.len())..(hi as usize).min(b.len())]
                });
                if data.iter().any(|x| *x != 0) {
                    match ranges.last_mut() {
                        Some(r) if u64::from(r.offset + r.length) == lo => {
                            r.length += (hi - lo) as u32
                        }
                        _ => ranges.push(AllocatedRange {
                            offset: lo as u32,
                            length: (hi - lo) as u32,
                        }),
                    }
                }
                block += 1;
            }
            Reply::Allocated(ranges)
        }
        _ => Reply::error(Status::UnknownOp, None, "the fake OSD does not serve this"),
    }
}

/// Builds a map with pool [`POOL`] ("fb") of `pg_count` PGs, all on the same members.
pub struct MapBuilder {
    map: ClusterMap,
    pg_count: u32,
    members: Vec<OsdId>,
}

impl MapBuilder {
    pub fn new(pg_count: u32) -> Self {
        let mut map = ClusterMap {
            epoch: Epoch(1),
            ..ClusterMap::default()
        };
        map.pools.insert(
            POOL,
            PoolInfo {
                id: POOL,
                name: POOL_NAME.to_string(),
                pg_count,
                size: 3,
                failure_domain: FailureDomain::Osd,
                created_epoch: Epoch(1),
            },
        );
        MapBuilder {
            map,
            pg_count,
            members: Vec::new(),
        }
    }

    /// An up OSD on 127.0.0.1 with one shard on `port`.
    pub fn osd(mut self, id: u32, port: u16) -> Self {
        std::sync::Arc::make_mut(&mut self.map.osds).insert(
            OsdId(id),
            OsdInfo {
                id: OsdId(id),
                uuid: format!("fake-{id}"),
                host: format!("host{id}"),
                address: "127.0.0.1".to_string(),
                port,
                shards: 1,
                capacity_bytes: 1 << 40,
                up: true,
                is_in: true,
                pending_create: false,
                boot_epoch: Epoch(1),
                config: String::new(),
                lease_timing: None,
            },
        );
        self
    }

    /// Every PG's members (the first one is recorded as leader).
    pub fn members(mut self, ids: &[u32]) -> Self {
        self.members = ids.iter().map(|id| OsdId(*id)).collect();
        self
    }

    pub fn epoch(mut self, epoch: u64) -> Self {
        self.map.epoch = Epoch(epoch);
        self
    }

    pub fn build(mut self) -> ClusterMap {
        let pgs: BTreeMap<u32, PgInfo> = (0..self.pg_count)
            .map(|seq| {
                let info = PgInfo {
                    version: 1,
                    state: PgState::ACTIVE,
                    osdlist: self.members.clone(),
                    newosdlist: Vec::new(),
                    learners: Vec::new(),
                    joint_voters: Vec::new(),
                    released: Vec::new(),
                    restored: false,
                    leader: self.members.first().copied(),
                    leader_term: Default::default(),
                    conf_index: Default::default(),
                };
                (seq, info)
            })
            .collect();
        self.map.pgmaps.insert(
            POOL,
            PgMap {
                pool: POOL,
                version: 1,
                pgs: pgs.into(),
            },
        );
        self.map
    }
}

/// An image of pool [`POOL`].
pub fn image_info(id: u64, name: &str, size_bytes: u64, object_size_bytes: u64) -> ImageInfo {
    ImageInfo {
        id: ImageId(id),
        pool: POOL,
        pool_name: POOL_NAME.to_string(),
        name: name.to_string(),
        size_bytes,
        object_size_bytes,
        created_epoch: Epoch(1),
        snap_seq: 0,
        parent: None,
    }
}
