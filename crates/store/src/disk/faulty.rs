//! Fault injection for tests on real processes: [`FaultyDisk`] wraps any [`Disk`] and, by the
//! rules of a [`FaultPlan`] that another thread may replace at any time, makes its reads,
//! writes and syncs fail (EIO, ENOSPC), wait, or return corrupted bytes.
//!
//! Why a wrapper and not a mode of [`super::SimDisk`]: the simulated disk already has its
//! seeded faults for the simulator; this one is for the real OSD on a real device
//! (`fastblock-osd --fault-injection-file`, test-only, `docs/testing.md`), where the wrapped
//! disk is a [`super::UringDisk`]. With no rule set, every method is one relaxed atomic load
//! and then the wrapped disk's own method, so wrapping changes nothing.
//!
//! How a call meets the rules. A call is a list of accesses: each read, each write, and its
//! sync if it has one (`write_many(.., true)`, `write_durable_with`, `submit_durable`,
//! `sync`). For each access in turn, the rules are tried in order; the first one that matches
//! it (same operation, range overlapping, fire count not used up) and fires (its probability,
//! drawn from the plan's seeded generator) applies to that access:
//! - `Eio` / `Enospc`: the call fails with that OS error before anything reaches the wrapped
//!   disk; later accesses of the call are not tried (they never happen).
//! - `DelayMs(n)`: the call sleeps before it goes to the wrapped disk. The ops of a batch run
//!   at once on a device, so a call waits for its longest delay, not for their sum. A
//!   `submit_durable` is not slept: it goes to the wrapped disk at once, and its completion
//!   is held back from `reap_durable` (and `wait_completion`) until `n` ms after the
//!   submission, as a slow device holds a commit while its caller's thread goes on serving.
//!   Completions are still reported in submission order, so a held one holds later ones.
//! - `Corrupt` (reads only): the read is done, then every byte of the buffer that falls inside
//!   the rule's range is flipped (XOR 0xFF); the device itself is left as it was.
//!
//! A sync has no range of its own. A sync rule without a range matches every sync; one with a
//! range matches the sync of a call that also writes into that range (so "the WAL's syncs
//! fail" can be said by the WAL's range). A bare `sync()` is matched by rules without a range
//! only. Discards, `reap_durable` and `wait_background` are never faulted (a fault decided
//! for a submission is reported by the submission itself).
//!
//! Offsets are those the wrapped disk sees, shifted by the disk's origin
//! ([`FaultyDisk::with_origin`], 0 by default): a rule for a window of a larger device (one
//! shard's region) is written relative to the window.

use super::{
    AlignedBuf, BackgroundRun, DataSync, Disk, OwnedWrite, ReadOp, Reaped, Submitted, WriteOp,
};
use fastblock_types::rng::SplitMix64;
use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest delay one rule may ask for: a test that wants a disk that never answers stops
/// the process instead.
pub const FAULT_DELAY_MS_MAX: u64 = 60_000;
/// Rules one plan may hold: every access tries them in order, under the plan's lock.
pub const FAULT_RULES_MAX: usize = 64;

/// The operation a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Sync,
}

/// What happens to an access a rule fires on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The call fails with EIO (`io::Error::raw_os_error() == Some(libc::EIO)`).
    Eio,
    /// The call fails with ENOSPC.
    Enospc,
    /// The call waits this many milliseconds (at most [`FAULT_DELAY_MS_MAX`]), then runs.
    DelayMs(u64),
    /// Reads only: the read runs, then the bytes of its buffer inside the range are flipped.
    Corrupt,
}

/// One rule of a [`FaultPlan`].
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    pub op: FaultOp,
    pub kind: FaultKind,
    /// The bytes `[start, end)` the rule applies to, relative to the disk's origin; `None`:
    /// all of them.
    pub range: Option<Range<u64>>,
    /// Chance that the rule fires on an access it matches, within `0.0..=1.0`.
    pub probability: f64,
    /// The rule fires at most this many times (`None`: without limit). Counted from the
    /// moment the plan's rules were set.
    pub fires_max: Option<u64>,
}

impl FaultRule {
    /// A rule that fires on every matching access of the whole device, without limit.
    pub fn new(op: FaultOp, kind: FaultKind) -> FaultRule {
        FaultRule {
            op,
            kind,
            range: None,
            probability: 1.0,
            fires_max: None,
        }
    }

    pub fn with_range(mut self, range: Range<u64>) -> FaultRule {
        self.range = Some(range);
        self
    }

    pub fn with_probability(mut self, probability: f64) -> FaultRule {
        self.probability = probability;
        self
    }

    pub fn with_fires_max(mut self, fires_max: u64) -> FaultRule {
        self.fires_max = Some(fires_max);
        self
    }

    /// Checks the rule on its own; `index` is its place in the plan, for the message.
    fn validate(&self, index: usize) -> Result<(), FaultRuleError> {
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(FaultRuleError::Probability {
                index,
                probability: self.probability,
            });
        }
        if let Some(range) = &self.range {
            if range.start >= range.end {
                return Err(FaultRuleError::EmptyRange {
                    index,
                    start: range.start,
                    end: range.end,
                });
            }
        }
        match self.kind {
            FaultKind::Corrupt if self.op != FaultOp::Read => {
                Err(FaultRuleError::CorruptNotRead { index, op: self.op })
            }
            FaultKind::DelayMs(delay_ms) if delay_ms > FAULT_DELAY_MS_MAX => {
                Err(FaultRuleError::DelayTooLong { index, delay_ms })
            }
            _ => Ok(()),
        }
    }

    /// Whether the rule's range meets `[start, end)` (after shifting by `origin`); the part
    /// that does. A rule without a range meets all of it.
    fn overlap(&self, origin: u64, access: &Range<u64>) -> Option<Range<u64>> {
        let (start, end) = match &self.range {
            None => (access.start, access.end),
            // A range shifted past the end of the address space meets nothing a disk has.
            Some(r) => (
                origin.saturating_add(r.start).max(access.start),
                origin.saturating_add(r.end).min(access.end),
            ),
        };
        (start < end).then_some(start..end)
    }
}

/// A rule the plan refuses (the plan is left as it was).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultRuleError {
    #[error("rule {index}: probability {probability} is not within 0..=1")]
    Probability { index: usize, probability: f64 },
    #[error("rule {index}: the range {start}..{end} is empty")]
    EmptyRange { index: usize, start: u64, end: u64 },
    #[error("rule {index}: corrupt applies to reads only, not to {op:?}")]
    CorruptNotRead { index: usize, op: FaultOp },
    #[error("rule {index}: a delay of {delay_ms} ms exceeds the limit of {FAULT_DELAY_MS_MAX} ms")]
    DelayTooLong { index: usize, delay_ms: u64 },
    #[error("{count} rules exceed the limit of {FAULT_RULES_MAX}")]
    TooManyRules { count: usize },
}

/// How many times faults of each kind fired, since the plan was made (setting new rules does
/// not reset them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub eio: u64,
    pub enospc: u64,
    pub delay: u64,
    pub corrupt: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.eio + self.enospc + self.delay + self.corrupt
    }
}

/// The rules shared by one or more [`FaultyDisk`]s; clones share them. Rules are set and
/// cleared from any thread, and take effect at the next call of each disk.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    shared: Arc<PlanShared>,
}

#[derive(Debug)]
struct PlanShared {
    /// True while the plan has no rule: all a call without faults reads. Relaxed is enough:
    /// the rules themselves are read under the lock, and a disk that sees new rules one call
    /// late is as good as one that saw them one call earlier.
    empty: AtomicBool,
    state: Mutex<PlanState>,
    eio: AtomicU64,
    enospc: AtomicU64,
    delay: AtomicU64,
    corrupt: AtomicU64,
}

#[derive(Debug)]
struct PlanState {
    /// Each rule with the number of times it fired since it was set.
    rules: Vec<(FaultRule, u64)>,
    rng: SplitMix64,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan::new()
    }
}

impl FaultPlan {
    /// A plan without rules.
    pub fn new() -> FaultPlan {
        FaultPlan {
            shared: Arc::new(PlanShared {
                empty: AtomicBool::new(true),
                state: Mutex::new(PlanState {
                    rules: Vec::new(),
                    rng: SplitMix64::new(0),
                }),
                eio: AtomicU64::new(0),
                enospc: AtomicU64::new(0),
                delay: AtomicU64::new(0),
                corrupt: AtomicU64::new(0),
            }),
        }
    }

    /// Replaces the rules (an empty list clears them). `seed` restarts the generator the
    /// rules' probabilities draw from, so the same rules, seed and calls fire the same way.
    /// A refused rule leaves the plan as it was.
    pub fn set_rules(&self, seed: u64, rules: Vec<FaultRule>) -> Result<(), FaultRuleError> {
        FaultPlan::check_rules(&rules)?;
        let mut state = self.lock();
        let empty = rules.is_empty();
        state.rules = rules.into_iter().map(|r| (r, 0)).collect();
        state.rng = SplitMix64::new(seed);
        self.shared.empty.store(empty, Ordering::Relaxed);
        Ok(())
    }

    /// Whether [`FaultPlan::set_rules`] would take `rules` (to check several plans' rules
    /// before setting any of them).
    pub fn check_rules(rules: &[FaultRule]) -> Result<(), FaultRuleError> {
        if rules.len() > FAULT_RULES_MAX {
            return Err(FaultRuleError::TooManyRules { count: rules.len() });
        }
        for (index, rule) in rules.iter().enumerate() {
            rule.validate(index)?;
        }
        Ok(())
    }

    /// Removes every rule: the disks behave as the ones they wrap again.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.rules.clear();
        self.shared.empty.store(true, Ordering::Relaxed);
    }

    /// Whether the plan has no rule (one relaxed load).
    pub fn is_empty(&self) -> bool {
        self.shared.empty.load(Ordering::Relaxed)
    }

    /// The rules as set.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.lock().rules.iter().map(|(r, _)| r.clone()).collect()
    }

    /// Faults fired so far, per kind.
    pub fn fired(&self) -> FaultCounts {
        let s = &self.shared;
        FaultCounts {
            eio: s.eio.load(Ordering::Relaxed),
            enospc: s.enospc.load(Ordering::Relaxed),
            delay: s.delay.load(Ordering::Relaxed),
            corrupt: s.corrupt.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PlanState> {
        // A panic elsewhere while holding the lock leaves the rules whole (each update is a
        // single assignment): go on with them.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, kind: FaultKind) {
        let counter = match kind {
            FaultKind::Eio => &self.shared.eio,
            FaultKind::Enospc => &self.shared.enospc,
            FaultKind::DelayMs(_) => &self.shared.delay,
            FaultKind::Corrupt => &self.shared.corrupt,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// What the rules do to a call made of `accesses` (in the disk's own offsets; `origin`
    /// shifts the rules' ranges).
    fn decide(&self, origin: u64, accesses: &[Access]) -> Decision {
        let mut decision = Decision::default();
        let mut state = self.lock();
        let PlanState { rules, rng } = &mut *state;
        for (index, access) in accesses.iter().enumerate() {
            for (rule, fired) in rules.iter_mut() {
                if rule.op != access.op || rule.fires_max.is_some_and(|max| *fired >= max) {
                    continue;
                }
                let Some(overlap) = access_overlap(rule, origin, access) else {
                    continue;
                };
                if !draw(rng, rule.probability) {
                    continue;
                }
                *fired += 1;
                self.count(rule.kind);
                match rule.kind {
                    FaultKind::Eio | FaultKind::Enospc => {
                        decision.error = Some(rule.kind);
                        return decision;
                    }
                    FaultKind::DelayMs(ms) => decision.delay_ms = decision.delay_ms.max(ms),
                    FaultKind::Corrupt => decision.corrupt.push((index, overlap)),
                }
                break;
            }
        }
        decision
    }
}

/// Whether `rule` matches `access`: for a read or write, the bytes where they meet; for a
/// sync (which has no bytes of its own), an empty range.
fn access_overlap(rule: &FaultRule, origin: u64, access: &Access) -> Option<Range<u64>> {
    if access.op != FaultOp::Sync {
        return rule.overlap(origin, &access.range);
    }
    match &rule.range {
        None => Some(0..0),
        Some(_) => access
            .covers
            .iter()
            .find_map(|w| rule.overlap(origin, w))
            .map(|_| 0..0),
    }
}

/// True with chance `probability` (no draw for 0 or 1, so certain rules use no randomness).
fn draw(rng: &mut SplitMix64, probability: f64) -> bool {
    if probability >= 1.0 {
        return true;
    }
    if probability <= 0.0 {
        return false;
    }
    // 53 random bits: a uniform f64 in [0, 1).
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    unit < probability
}

/// One access of a call as the rules see it.
struct Access {
    op: FaultOp,
    /// The bytes read or written (empty for a sync).
    range: Range<u64>,
    /// A sync: the bytes of the writes it makes durable (empty for a bare `sync()`).
    covers: Vec<Range<u64>>,
}

impl Access {
    fn read(offset: u64, len: usize) -> Access {
        Access {
            op: FaultOp::Read,
            range: offset..offset.saturating_add(len as u64),
            covers: Vec::new(),
        }
    }

    fn write(offset: u64, len: usize) -> Access {
        Access {
            op: FaultOp::Write,
            ..Access::read(offset, len)
        }
    }

    fn sync(covers: Vec<Range<u64>>) -> Access {
        Access {
            op: FaultOp::Sync,
            range: 0..0,
            covers,
        }
    }
}

/// What a call does before and after it reaches the wrapped disk.
#[derive(Debug, Default)]
struct Decision {
    /// `Eio` or `Enospc`: the call fails without reaching the disk.
    error: Option<FaultKind>,
    delay_ms: u64,
    /// Reads to corrupt: (index of the access, bytes of the disk).
    corrupt: Vec<(usize, Range<u64>)>,
}

impl Decision {
    /// Sleeps the delay, then returns the error if there is one.
    fn before(&self) -> io::Result<()> {
        if self.delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.delay_ms));
        }
        match self.error {
            Some(FaultKind::Enospc) => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(_) => Err(io::Error::from_raw_os_error(libc::EIO)),
            None => Ok(()),
        }
    }
}

/// A [`Disk`] that fails, delays or corrupts the operations of the disk it wraps as its
/// [`FaultPlan`] says (see the module doc).
#[derive(Debug)]
pub struct FaultyDisk<D: Disk> {
    inner: D,
    plan: FaultPlan,
    origin_bytes: u64,
    /// The durable submissions in flight or not yet reported, oldest first: when each may be
    /// reported (None: as soon as the wrapped disk completed it).
    reports: VecDeque<Option<Instant>>,
    /// How many of the oldest of `reports` the wrapped disk has completed.
    completed: usize,
}

impl<D: Disk> FaultyDisk<D> {
    pub fn new(inner: D, plan: FaultPlan) -> FaultyDisk<D> {
        FaultyDisk {
            inner,
            plan,
            origin_bytes: 0,
            reports: VecDeque::new(),
            completed: 0,
        }
    }

    /// Rule ranges are relative to this offset of the wrapped disk (the start of the window
    /// of it that the rules are written for).
    pub fn with_origin(mut self, origin_bytes: u64) -> FaultyDisk<D> {
        self.origin_bytes = origin_bytes;
        self
    }

    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The wrapped disk, for what only it offers; what is done through it is never faulted.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Decides the faults of a call of writes (and its sync when `sync` is given: the ranges
    /// it makes durable).
    fn decide_writes(
        &self,
        writes: impl Iterator<Item = (u64, usize)>,
        sync: Option<Vec<Range<u64>>>,
    ) -> Decision {
        let mut accesses: Vec<Access> = writes.map(|(o, l)| Access::write(o, l)).collect();
        if let Some(covers) = sync {
            accesses.push(Access::sync(covers));
        }
        self.plan.decide(self.origin_bytes, &accesses)
    }

    /// Decides and runs the faults of a call of writes. `Ok`: the call goes on to the wrapped
    /// disk.
    fn before_writes(
        &self,
        writes: impl Iterator<Item = (u64, usize)>,
        sync: Option<Vec<Range<u64>>>,
    ) -> io::Result<()> {
        self.decide_writes(writes, sync).before()
    }

    /// How many of the completed submissions may be reported now, oldest first; with `wait`,
    /// all of them, after sleeping until the last one's hold ends.
    fn releasable(&self, wait: bool) -> usize {
        let mut count = 0;
        while count < self.completed {
            if let Some(at) = self.reports[count] {
                let now = Instant::now();
                if at > now {
                    if !wait {
                        break;
                    }
                    std::thread::sleep(at - now);
                }
            }
            count += 1;
        }
        count
    }

    fn corrupt_reads(&self, reads: &mut [ReadOp<'_>], corrupt: &[(usize, Range<u64>)]) {
        for (index, bytes) in corrupt {
            let read = &mut reads[*index];
            // `bytes` lies within the read: it is where the read and the rule met.
            let start = (bytes.start - read.offset_bytes) as usize;
            let end = (bytes.end - read.offset_bytes) as usize;
            for b in &mut read.buf[start..end] {
                *b ^= 0xFF;
            }
        }
    }
}

fn ranges(writes: &[WriteOp<'_>]) -> Vec<Range<u64>> {
    writes
        .iter()
        .map(|w| w.offset_bytes..w.offset_bytes.saturating_add(w.buf.len() as u64))
        .collect()
}

impl FaultyDisk<super::UringDisk> {
    /// [`super::UringDisk::commits_reportable`], or a completion reported by the wrapped disk
    /// whose hold ended.
    pub fn commits_reportable(&mut self) -> bool {
        self.releasable(false) > 0 || self.inner.commits_reportable()
    }

    /// [`super::UringDisk::wait_completion`], never faulted: it only waits.
    ///
    /// A completion the wrapped disk reported already but a delay holds back counts as ready
    /// once its hold ends: the wait ends then at the latest.
    pub fn wait_completion(
        &mut self,
        timeout: Duration,
    ) -> io::Result<Option<super::CompletionWait>> {
        if self.completed == 0 {
            return self.inner.wait_completion(timeout);
        }
        let now = Instant::now();
        let at = match self.reports[0] {
            Some(at) if at > now => at,
            _ => {
                return Ok(Some(super::CompletionWait {
                    ready: true,
                    signalled: false,
                }))
            }
        };
        let slice = timeout.min(at - now);
        let waited = match self.inner.wait_completion(slice)? {
            Some(w) => w,
            None => {
                std::thread::sleep(slice);
                super::CompletionWait {
                    ready: false,
                    signalled: false,
                }
            }
        };
        Ok(Some(super::CompletionWait {
            ready: waited.ready || Instant::now() >= at,
            signalled: waited.signalled,
        }))
    }
}

/// A [`FaultyDisk`]'s [`DataSync`]: the plan's sync rules apply to it as to a bare
/// [`Disk::sync`], on the thread that calls it (a delay holds the flusher, not the shard).
struct FaultySync {
    inner: Box<dyn DataSync>,
    plan: FaultPlan,
    origin_bytes: u64,
}

impl DataSync for FaultySync {
    fn sync(&mut self) -> io::Result<()> {
        if !self.plan.is_empty() {
            self.plan
                .decide(self.origin_bytes, &[Access::sync(Vec::new())])
                .before()?;
        }
        self.inner.sync()
    }
}

impl<D: Disk> Disk for FaultyDisk<D> {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn data_sync(&self) -> Option<Box<dyn DataSync>> {
        let inner = self.inner.data_sync()?;
        Some(Box::new(FaultySync {
            inner,
            plan: self.plan.clone(),
            origin_bytes: self.origin_bytes,
        }))
    }

    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()> {
        if self.plan.is_empty() {
            return self.inner.read_many(reads);
        }
        let accesses: Vec<Access> = reads
            .iter()
            .map(|r| Access::read(r.offset_bytes, r.buf.len()))
            .collect();
        let decision = self.plan.decide(self.origin_bytes, &accesses);
        decision.before()?;
        self.inner.read_many(reads)?;
        self.corrupt_reads(reads, &decision.corrupt);
        Ok(())
    }

    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> io::Result<()> {
        if self.plan.is_empty() {
            return self.inner.write_many(writes, sync);
        }
        let each = writes.iter().map(|w| (w.offset_bytes, w.buf.len()));
        self.before_writes(each, sync.then(|| ranges(writes)))?;
        self.inner.write_many(writes, sync)
    }

    fn write_durable_with(
        &mut self,
        durable: &[WriteOp<'_>],
        background: &[WriteOp<'_>],
    ) -> io::Result<()> {
        if self.plan.is_empty() {
            return self.inner.write_durable_with(durable, background);
        }
        let each = durable
            .iter()
            .chain(background)
            .map(|w| (w.offset_bytes, w.buf.len()));
        self.before_writes(each, Some(ranges(durable)))?;
        self.inner.write_durable_with(durable, background)
    }

    fn write_background(&mut self, buf: AlignedBuf, runs: &[BackgroundRun]) -> io::Result<()> {
        if self.plan.is_empty() {
            return self.inner.write_background(buf, runs);
        }
        let each = runs.iter().map(|r| (r.disk_offset_bytes, r.len));
        self.before_writes(each, None)?;
        self.inner.write_background(buf, runs)
    }

    fn submit_durable(&mut self, writes: Vec<OwnedWrite>) -> io::Result<Submitted> {
        let mut delay_ms = 0;
        if !self.plan.is_empty() {
            let covers: Vec<Range<u64>> = writes
                .iter()
                .map(|w| w.offset_bytes..w.offset_bytes.saturating_add(w.buf.len() as u64))
                .collect();
            let each = writes.iter().map(|w| (w.offset_bytes, w.buf.len()));
            let decision = self.decide_writes(each, Some(covers));
            delay_ms = decision.delay_ms;
            // The error alone: the delay holds the completion instead (see the module doc).
            Decision {
                delay_ms: 0,
                ..decision
            }
            .before()?;
        }
        let submitted = self.inner.submit_durable(writes)?;
        match submitted {
            Submitted::InFlight => {
                let hold = (delay_ms > 0).then(|| Instant::now() + Duration::from_millis(delay_ms));
                self.reports.push_back(hold);
            }
            // Synchronous: the call itself is the wait.
            Submitted::Durable(_) => {
                if delay_ms > 0 {
                    std::thread::sleep(Duration::from_millis(delay_ms));
                }
            }
        }
        Ok(submitted)
    }

    fn reap_durable(&mut self, wait: bool) -> io::Result<Reaped> {
        let mut reaped = self.inner.reap_durable(wait)?;
        self.completed += reaped.count;
        assert!(
            self.completed <= self.reports.len(),
            "{} completions of {} submissions",
            self.completed,
            self.reports.len()
        );
        let count = self.releasable(wait);
        self.reports.drain(..count);
        self.completed -= count;
        // The buffers go back at once: the wrapped disk is done with them.
        reaped.count = count;
        Ok(reaped)
    }

    fn wait_background(&mut self) -> io::Result<()> {
        self.inner.wait_background()
    }

    fn background_mark(&self) -> u64 {
        self.inner.background_mark()
    }

    fn background_written(&mut self, mark: u64) -> io::Result<bool> {
        self.inner.background_written(mark)
    }

    fn sync(&mut self) -> io::Result<()> {
        if self.plan.is_empty() {
            return self.inner.sync();
        }
        self.before_writes(std::iter::empty(), Some(Vec::new()))?;
        self.inner.sync()
    }

    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.discard(offset_bytes, len_bytes)
    }

    fn read(&mut self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.plan.is_empty() {
            return self.inner.read(offset_bytes, buf);
        }
        self.read_many(&mut [ReadOp { offset_bytes, buf }])
    }

    fn write(&mut self, offset_bytes: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        if self.plan.is_empty() {
            return self.inner.write(offset_bytes, buf, sync);
        }
        self.write_many(&[WriteOp { offset_bytes, buf }], sync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::SimDisk;
    use std::time::Instant;

    const SECTOR: usize = 512;
    const DISK_BYTES: u64 = 64 * 1024;

    fn disk() -> (FaultyDisk<SimDisk>, SimDisk, FaultPlan) {
        let sim = SimDisk::new(DISK_BYTES);
        let plan = FaultPlan::new();
        (FaultyDisk::new(sim.clone(), plan.clone()), sim, plan)
    }

    fn errno(result: io::Result<()>) -> Option<i32> {
        result.err().and_then(|e| e.raw_os_error())
    }

    fn filled(byte: u8, len: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(len);
        buf.fill(byte);
        buf
    }

    #[test]
    fn without_rules_the_wrapped_disk_is_untouched() {
        let (mut d, sim, plan) = disk();
        assert!(plan.is_empty());
        assert_eq!(d.size_bytes(), DISK_BYTES);
        d.write(0, &filled(7, SECTOR), true).unwrap();
        d.write_durable_with(
            &[WriteOp {
                offset_bytes: 512,
                buf: &filled(8, SECTOR),
            }],
            &[WriteOp {
                offset_bytes: 1024,
                buf: &filled(9, SECTOR),
            }],
        )
        .unwrap();
        let runs = [BackgroundRun {
            buf_offset: 0,
            len: SECTOR,
            disk_offset_bytes: 1536,
        }];
        d.write_background(filled(10, SECTOR), &runs).unwrap();
        d.wait_background().unwrap();
        let submitted = d
            .submit_durable(vec![OwnedWrite {
                offset_bytes: 2048,
                buf: filled(11, SECTOR),
            }])
            .unwrap();
        assert!(matches!(submitted, Submitted::Durable(_)));
        assert_eq!(d.reap_durable(true).unwrap().count, 0);
        d.sync().unwrap();
        d.discard(4096, 4096).unwrap();
        let mut buf = vec![0u8; 5 * SECTOR];
        d.read(0, &mut buf).unwrap();
        for (i, expected) in [7u8, 8, 9, 10, 11].into_iter().enumerate() {
            assert!(buf[i * SECTOR..(i + 1) * SECTOR]
                .iter()
                .all(|b| *b == expected));
        }
        assert_eq!(sim.image().pending_writes(), 0, "every write was synced");
        assert_eq!(plan.fired(), FaultCounts::default());
    }

    #[test]
    fn eio_on_writes_fails_before_the_device_sees_them() {
        let (mut d, sim, plan) = disk();
        plan.set_rules(1, vec![FaultRule::new(FaultOp::Write, FaultKind::Eio)])
            .unwrap();
        assert!(!plan.is_empty());
        let writes_before = sim.image().writes;
        assert_eq!(
            errno(d.write(0, &filled(1, SECTOR), false)),
            Some(libc::EIO)
        );
        let runs = [BackgroundRun {
            buf_offset: 0,
            len: SECTOR,
            disk_offset_bytes: 0,
        }];
        assert_eq!(
            errno(d.write_background(filled(1, SECTOR), &runs)),
            Some(libc::EIO)
        );
        let submitted = d.submit_durable(vec![OwnedWrite {
            offset_bytes: 0,
            buf: filled(1, SECTOR),
        }]);
        assert_eq!(
            submitted.err().and_then(|e| e.raw_os_error()),
            Some(libc::EIO)
        );
        assert_eq!(
            sim.image().writes,
            writes_before,
            "nothing reached the disk"
        );
        // Reads and syncs are other operations.
        d.read(0, &mut [0u8; SECTOR]).unwrap();
        d.sync().unwrap();
        assert_eq!(plan.fired().eio, 3);
        assert_eq!(plan.fired().total(), 3);
    }

    #[test]
    fn enospc_applies_within_its_range_only() {
        let (mut d, _sim, plan) = disk();
        let rule = FaultRule::new(FaultOp::Write, FaultKind::Enospc).with_range(4096..8192);
        plan.set_rules(1, vec![rule]).unwrap();
        d.write(0, &filled(1, 4096), false).unwrap();
        d.write(8192, &filled(1, 4096), false).unwrap();
        assert_eq!(
            errno(d.write(7680, &filled(1, 1024), false)),
            Some(libc::ENOSPC),
            "a write that overlaps the range"
        );
        // A batch with one write in the range fails as a whole.
        let a = filled(2, SECTOR);
        let b = filled(3, SECTOR);
        let batch = [
            WriteOp {
                offset_bytes: 0,
                buf: &a,
            },
            WriteOp {
                offset_bytes: 4096,
                buf: &b,
            },
        ];
        assert_eq!(errno(d.write_many(&batch, false)), Some(libc::ENOSPC));
        let mut buf = [0u8; SECTOR];
        d.read(0, &mut buf).unwrap();
        assert!(
            buf.iter().all(|b| *b == 1),
            "the failed batch wrote nothing"
        );
        assert_eq!(plan.fired().enospc, 2);
    }

    #[test]
    fn eio_on_syncs_spares_unsynced_writes() {
        let (mut d, sim, plan) = disk();
        plan.set_rules(1, vec![FaultRule::new(FaultOp::Sync, FaultKind::Eio)])
            .unwrap();
        d.write(0, &filled(1, SECTOR), false).unwrap();
        assert_eq!(errno(d.sync()), Some(libc::EIO));
        assert_eq!(errno(d.write(0, &filled(1, SECTOR), true)), Some(libc::EIO));
        let durable = [WriteOp {
            offset_bytes: 512,
            buf: &filled(1, SECTOR),
        }];
        assert_eq!(errno(d.write_durable_with(&durable, &[])), Some(libc::EIO));
        assert_eq!(sim.image().syncs, 0);
        assert_eq!(plan.fired().eio, 3);
    }

    #[test]
    fn a_sync_rule_with_a_range_matches_the_syncs_of_writes_into_it() {
        let (mut d, _sim, plan) = disk();
        let rule = FaultRule::new(FaultOp::Sync, FaultKind::Eio).with_range(0..4096);
        plan.set_rules(1, vec![rule]).unwrap();
        d.write(8192, &filled(1, SECTOR), true).unwrap();
        d.sync().unwrap();
        let background = [WriteOp {
            offset_bytes: 0,
            buf: &filled(1, SECTOR),
        }];
        let durable = [WriteOp {
            offset_bytes: 8192,
            buf: &filled(1, SECTOR),
        }];
        d.write_durable_with(&durable, &background)
            .expect("the sync covers the durable writes only");
        assert_eq!(
            errno(d.write(512, &filled(1, SECTOR), true)),
            Some(libc::EIO)
        );
        let submitted = d.submit_durable(vec![OwnedWrite {
            offset_bytes: 1024,
            buf: filled(1, SECTOR),
        }]);
        assert!(submitted.is_err());
        assert_eq!(plan.fired().eio, 2);
    }

    #[test]
    fn eio_on_reads() {
        let (mut d, _sim, plan) = disk();
        let rule = FaultRule::new(FaultOp::Read, FaultKind::Eio).with_range(512..1024);
        plan.set_rules(1, vec![rule]).unwrap();
        let mut buf = [0u8; SECTOR];
        d.read(0, &mut buf).unwrap();
        assert_eq!(errno(d.read(512, &mut buf)), Some(libc::EIO));
        d.write(512, &filled(1, SECTOR), true).unwrap();
        assert_eq!(plan.fired().eio, 1);
    }

    #[test]
    fn a_delay_waits_then_does_the_operation() {
        let (mut d, _sim, plan) = disk();
        let rules = vec![
            FaultRule::new(FaultOp::Write, FaultKind::DelayMs(30)),
            FaultRule::new(FaultOp::Write, FaultKind::DelayMs(1)),
        ];
        plan.set_rules(1, rules).unwrap();
        let a = filled(4, SECTOR);
        let batch = [
            WriteOp {
                offset_bytes: 0,
                buf: &a,
            },
            WriteOp {
                offset_bytes: 512,
                buf: &a,
            },
        ];
        let started = Instant::now();
        d.write_many(&batch, false).unwrap();
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        // Both writes were delayed by the first rule; a batch waits for its longest delay.
        assert!(waited < Duration::from_millis(1000), "{waited:?}");
        let mut buf = [0u8; 2 * SECTOR];
        d.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|b| *b == 4));
        assert_eq!(plan.fired().delay, 2);
    }

    #[test]
    fn corrupt_flips_the_bytes_read_within_the_range_and_leaves_the_disk() {
        let (mut d, _sim, plan) = disk();
        d.write(0, &filled(0x5A, 2048), true).unwrap();
        let rule = FaultRule::new(FaultOp::Read, FaultKind::Corrupt).with_range(1000..1100);
        plan.set_rules(1, vec![rule]).unwrap();
        let mut a = vec![0u8; 1024];
        let mut b = vec![0u8; 1024];
        d.read_many(&mut [
            ReadOp {
                offset_bytes: 0,
                buf: &mut a,
            },
            ReadOp {
                offset_bytes: 1024,
                buf: &mut b,
            },
        ])
        .unwrap();
        assert!(a[..1000].iter().all(|x| *x == 0x5A));
        assert!(a[1000..].iter().all(|x| *x == !0x5A));
        assert!(b[..76].iter().all(|x| *x == !0x5A));
        assert!(b[76..].iter().all(|x| *x == 0x5A));
        assert_eq!(plan.fired().corrupt, 2, "one per read it met");
        plan.clear();
        let mut clean = vec![0u8; 2048];
        d.read(0, &mut clean).unwrap();
        assert!(clean.iter().all(|x| *x == 0x5A), "the device is intact");
    }

    #[test]
    fn a_rule_fires_at_most_its_count_then_the_next_one_applies() {
        let (mut d, _sim, plan) = disk();
        let rules = vec![
            FaultRule::new(FaultOp::Write, FaultKind::Eio).with_fires_max(2),
            FaultRule::new(FaultOp::Write, FaultKind::Enospc).with_fires_max(1),
        ];
        plan.set_rules(1, rules).unwrap();
        let outcomes: Vec<Option<i32>> = (0..5)
            .map(|_| errno(d.write(0, &filled(1, SECTOR), false)))
            .collect();
        assert_eq!(
            outcomes,
            vec![
                Some(libc::EIO),
                Some(libc::EIO),
                Some(libc::ENOSPC),
                None,
                None
            ]
        );
        assert_eq!(
            plan.fired(),
            FaultCounts {
                eio: 2,
                enospc: 1,
                ..FaultCounts::default()
            }
        );
        // Setting the rules again starts their counts over.
        plan.set_rules(
            1,
            vec![FaultRule::new(FaultOp::Write, FaultKind::Eio).with_fires_max(1)],
        )
        .unwrap();
        assert!(d.write(0, &filled(1, SECTOR), false).is_err());
        assert!(d.write(0, &filled(1, SECTOR), false).is_ok());
    }

    #[test]
    fn probability_is_deterministic_by_seed() {
        let pattern = |seed: u64, probability: f64| -> Vec<bool> {
            let (mut d, _sim, plan) = disk();
            let rule = FaultRule::new(FaultOp::Read, FaultKind::Eio).with_probability(probability);
            plan.set_rules(seed, vec![rule]).unwrap();
            (0..1000)
                .map(|_| d.read(0, &mut [0u8; SECTOR]).is_err())
                .collect()
        };
        let a = pattern(42, 0.5);
        assert_eq!(a, pattern(42, 0.5), "same seed, same faults");
        assert_ne!(a, pattern(43, 0.5), "another seed, other faults");
        let fired = a.iter().filter(|f| **f).count();
        assert!((350..650).contains(&fired), "{fired} of 1000 at 0.5");
        assert!(pattern(42, 0.0).iter().all(|f| !f));
        assert!(pattern(42, 1.0).iter().all(|f| *f));
    }

    #[test]
    fn refused_rules_leave_the_plan_as_it_was() {
        let plan = FaultPlan::new();
        let good = FaultRule::new(FaultOp::Write, FaultKind::Eio);
        plan.set_rules(1, vec![good.clone()]).unwrap();
        let bad = [
            (
                good.clone().with_probability(1.5),
                FaultRuleError::Probability {
                    index: 1,
                    probability: 1.5,
                },
            ),
            (
                good.clone().with_range(8..8),
                FaultRuleError::EmptyRange {
                    index: 1,
                    start: 8,
                    end: 8,
                },
            ),
            (
                FaultRule::new(FaultOp::Write, FaultKind::Corrupt),
                FaultRuleError::CorruptNotRead {
                    index: 1,
                    op: FaultOp::Write,
                },
            ),
            (
                FaultRule::new(FaultOp::Sync, FaultKind::DelayMs(FAULT_DELAY_MS_MAX + 1)),
                FaultRuleError::DelayTooLong {
                    index: 1,
                    delay_ms: FAULT_DELAY_MS_MAX + 1,
                },
            ),
        ];
        for (rule, error) in bad {
            assert_eq!(plan.set_rules(1, vec![good.clone(), rule]), Err(error));
        }
        let nan = good.clone().with_probability(f64::NAN);
        assert!(matches!(
            plan.set_rules(1, vec![nan]),
            Err(FaultRuleError::Probability { index: 0, .. })
        ));
        assert!(matches!(
            plan.set_rules(1, vec![good.clone(); FAULT_RULES_MAX + 1]),
            Err(FaultRuleError::TooManyRules { .. })
        ));
        assert_eq!(plan.rules(), vec![good]);
    }

    #[test]
    fn rules_set_by_another_thread_apply_at_the_next_call() {
        let (mut d, _sim, plan) = disk();
        d.write(0, &filled(1, SECTOR), false).unwrap();
        let setter = plan.clone();
        std::thread::spawn(move || {
            setter
                .set_rules(1, vec![FaultRule::new(FaultOp::Write, FaultKind::Eio)])
                .unwrap();
        })
        .join()
        .unwrap();
        assert_eq!(
            errno(d.write(0, &filled(1, SECTOR), false)),
            Some(libc::EIO)
        );
        let clearer = plan.clone();
        std::thread::spawn(move || clearer.clear()).join().unwrap();
        assert!(plan.is_empty());
        d.write(0, &filled(1, SECTOR), false).unwrap();
        assert_eq!(plan.fired().eio, 1, "counters outlive the rules");
    }

    #[test]
    fn ranges_are_relative_to_the_origin() {
        let sim = SimDisk::new(DISK_BYTES);
        let plan = FaultPlan::new();
        let mut d = FaultyDisk::new(sim, plan.clone()).with_origin(32 * 1024);
        let rule = FaultRule::new(FaultOp::Write, FaultKind::Eio).with_range(0..4096);
        plan.set_rules(1, vec![rule]).unwrap();
        d.write(0, &filled(1, SECTOR), false)
            .expect("before the origin");
        assert_eq!(
            errno(d.write(32 * 1024, &filled(1, SECTOR), false)),
            Some(libc::EIO)
        );
        d.write(36 * 1024, &filled(1, SECTOR), false)
            .expect("past the range");
        // A range shifted past the end of the address space meets nothing.
        let far = FaultRule::new(FaultOp::Write, FaultKind::Eio).with_range(u64::MAX - 1..u64::MAX);
        plan.set_rules(1, vec![far]).unwrap();
        d.write(32 * 1024, &filled(1, SECTOR), false).unwrap();
    }

    /// A disk whose durable submissions are written at once but reported only by the next
    /// `reap_durable`, as a ring reports its completions.
    struct InFlightDisk {
        sim: SimDisk,
        pending: usize,
    }

    impl Disk for InFlightDisk {
        fn size_bytes(&self) -> u64 {
            self.sim.size_bytes()
        }
        fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()> {
            self.sim.read_many(reads)
        }
        fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> io::Result<()> {
            self.sim.write_many(writes, sync)
        }
        fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
            self.sim.discard(offset_bytes, len_bytes)
        }
        fn submit_durable(&mut self, writes: Vec<OwnedWrite>) -> io::Result<Submitted> {
            let ops: Vec<WriteOp<'_>> = writes
                .iter()
                .map(|w| WriteOp {
                    offset_bytes: w.offset_bytes,
                    buf: &w.buf,
                })
                .collect();
            self.sim.write_many(&ops, true)?;
            self.pending += 1;
            Ok(Submitted::InFlight)
        }
        fn reap_durable(&mut self, _wait: bool) -> io::Result<Reaped> {
            let count = std::mem::take(&mut self.pending);
            Ok(Reaped {
                count,
                bufs: Vec::new(),
            })
        }
    }

    fn submit(d: &mut FaultyDisk<InFlightDisk>, offset_bytes: u64) {
        let submitted = d
            .submit_durable(vec![OwnedWrite {
                offset_bytes,
                buf: filled(3, SECTOR),
            }])
            .unwrap();
        assert!(matches!(submitted, Submitted::InFlight));
    }

    #[test]
    fn a_delayed_commit_is_held_back_in_order_without_holding_the_caller() {
        let plan = FaultPlan::new();
        let inner = InFlightDisk {
            sim: SimDisk::new(DISK_BYTES),
            pending: 0,
        };
        let mut d = FaultyDisk::new(inner, plan.clone());
        let delay = Duration::from_millis(300);
        let rule = FaultRule::new(FaultOp::Sync, FaultKind::DelayMs(300)).with_fires_max(1);
        plan.set_rules(1, vec![rule.clone()]).unwrap();

        // The first submission is delayed, the second is not but is reported after it.
        let t = Instant::now();
        submit(&mut d, 0);
        submit(&mut d, 512);
        assert!(t.elapsed() < delay / 2, "the submission slept");
        assert_eq!(d.reap_durable(false).unwrap().count, 0);
        std::thread::sleep(delay / 3);
        assert_eq!(d.reap_durable(false).unwrap().count, 0);
        while t.elapsed() < delay {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(d.reap_durable(false).unwrap().count, 2);
        assert_eq!(plan.fired().delay, 1);

        // Waiting for every commit waits out the hold.
        plan.set_rules(2, vec![rule]).unwrap();
        let t = Instant::now();
        submit(&mut d, 1024);
        assert_eq!(d.reap_durable(true).unwrap().count, 1);
        assert!(t.elapsed() >= delay, "reported after {:?}", t.elapsed());

        // Without rules, completions are reported as they come.
        plan.set_rules(3, Vec::new()).unwrap();
        submit(&mut d, 1536);
        assert_eq!(d.reap_durable(false).unwrap().count, 1);
    }
}
