//! A model of the writes a workload issued to an image, against which every read is checked
//! (the partition and chaos tests): per-unit linearizability of a register, where a unit is a
//! 4 KiB block ([`Model::default`]) or any smaller power-of-two piece of one, say a 512-byte
//! sector for workloads with unaligned IO ([`Model::new`]).
//!
//! Each write of a unit carries a generation, and the unit then holds
//! [`Model::content`]`(unit, generation)`, bytes that depend on both, so a stale or misplaced
//! unit never passes for the right one. A unit has one writer at a time (the workload gives
//! every unit to one task), so its writes are ordered: issued, then acknowledged or failed.
//!
//! A read that started after write `w` of its unit was acknowledged must return `w` or a later
//! write of that unit (acknowledged, failed or still in flight: all were issued before the read
//! ended, since the model is consulted after it); zeros only if no write was acknowledged
//! before it started. Anything older is a stale read; anything else is data the workload never
//! wrote. A failed write may or may not have happened, but not after a later write of its
//! unit was acknowledged: the checker holds the store to that too.

use super::{stamped, BLOCK};
use std::collections::{BTreeMap, VecDeque};

/// One write the model knows of: its generation, how it ended so far, and when it was issued
/// and ended (UTC wall clock), so that a violation's report places the writes it names on the
/// daemons' log timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    pub generation: u64,
    pub outcome: Outcome,
    pub issued: WallClock,
    pub ended: Option<WallClock>,
}

/// A UTC time of day in milliseconds, shown as the daemons' logs show it (`17:40:37.853`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct WallClock(u64);

impl WallClock {
    pub fn now() -> WallClock {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        WallClock(ms % 86_400_000)
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0;
        write!(
            f,
            "{:02}:{:02}:{:02}.{:03}",
            ms / 3_600_000,
            ms / 60_000 % 60,
            ms / 1000 % 60,
            ms % 1000
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    InFlight,
    Acked,
    /// Failed or timed out: it may or may not have been applied.
    Failed,
}

/// What a read may not be older than: the position, in its unit's writes (counted from the
/// first, also once dropped from the history), of the last write acknowledged when the read
/// started (`None`: none yet, zeros allowed).
pub type Floor = Option<usize>;

/// The writes of one unit the model still holds: the last [`HISTORY_MAX`] at most.
#[derive(Default)]
struct History {
    /// Writes of the unit dropped from the front so far (positions count from the first).
    dropped: usize,
    writes: VecDeque<Write>,
}

/// Writes kept per unit. A read is checked against the writes from its floor on; one whose
/// unit got more writes than this while it ran (hundreds of writes to one unit during one
/// read, far beyond any IO's deadline) would see its floor dropped and could be misjudged.
/// The bound keeps a long run's model small: 1,024 writes of 16 bytes per unit.
pub const HISTORY_MAX: usize = 1024;

/// The writes issued to every unit, in order, and the verdict on every read checked against
/// them.
pub struct Model {
    unit_bytes: u64,
    units: BTreeMap<u64, History>,
    /// Units checked (one per call of [`Model::check`]).
    pub reads_checked: u64,
    pub violations: Vec<String>,
}

/// A model of 4 KiB blocks.
impl Default for Model {
    fn default() -> Self {
        Model::new(BLOCK)
    }
}

impl Model {
    /// A model whose units are `unit_bytes` long: unit `u` covers the image's bytes
    /// `u * unit_bytes .. (u + 1) * unit_bytes`.
    pub fn new(unit_bytes: u64) -> Model {
        assert!(unit_bytes.is_power_of_two(), "unit of {unit_bytes} bytes");
        assert!(unit_bytes <= BLOCK, "unit of {unit_bytes} bytes");
        Model {
            unit_bytes,
            units: BTreeMap::new(),
            reads_checked: 0,
            violations: Vec::new(),
        }
    }

    pub fn unit_bytes(&self) -> u64 {
        self.unit_bytes
    }

    /// The bytes unit `unit` holds once generation `generation` of it is written. For 4 KiB
    /// units that is `stamped_block(unit * BLOCK, generation)`.
    pub fn content(&self, unit: u64, generation: u64) -> bytes::Bytes {
        stamped(unit * self.unit_bytes, generation, self.unit_bytes)
    }

    pub fn issue(&mut self, unit: u64, generation: u64) {
        let issued = WallClock::now();
        let history = self.units.entry(unit).or_default();
        let writes = &mut history.writes;
        assert!(
            writes.back().is_none_or(|w| w.outcome != Outcome::InFlight),
            "unit {unit}: two writes in flight at once"
        );
        assert!(
            writes.back().is_none_or(|w| w.generation < generation),
            "unit {unit}: generation {generation} not above the last one"
        );
        if writes.len() == HISTORY_MAX {
            writes.pop_front();
            history.dropped += 1;
        }
        writes.push_back(Write {
            generation,
            outcome: Outcome::InFlight,
            issued,
            ended: None,
        });
    }

    pub fn complete(&mut self, unit: u64, generation: u64, outcome: Outcome) {
        let ended = WallClock::now();
        let last = self
            .units
            .get_mut(&unit)
            .and_then(|h| h.writes.back_mut())
            .expect("a write in flight");
        assert_eq!(last.generation, generation, "unit {unit}");
        assert_eq!(last.outcome, Outcome::InFlight, "unit {unit}");
        last.outcome = outcome;
        last.ended = Some(ended);
    }

    pub fn floor(&self, unit: u64) -> Floor {
        let history = self.units.get(&unit)?;
        let at = history
            .writes
            .iter()
            .rposition(|w| w.outcome == Outcome::Acked)?;
        Some(history.dropped + at)
    }

    /// Checks what a read of `unit` that started at `floor` returned; records a violation.
    pub fn check(&mut self, unit: u64, floor: Floor, got: &[u8], what: &str) {
        assert_eq!(got.len() as u64, self.unit_bytes, "{what} of unit {unit}");
        self.reads_checked += 1;
        let empty = History::default();
        let history = self.units.get(&unit).unwrap_or(&empty);
        let writes = &history.writes;
        let is = |w: &&Write| got == &self.content(unit, w.generation)[..];
        // Positions in `writes`; a floor among the dropped writes allows all that are kept.
        let from = floor.unwrap_or(0).saturating_sub(history.dropped);
        if writes.range(from..).any(|w| is(&w)) || (floor.is_none() && got.iter().all(|b| *b == 0))
        {
            return;
        }
        let floor_generation = floor
            .and_then(|f| writes.get(f.checked_sub(history.dropped)?))
            .map(|w| w.generation);
        let older = writes.range(..from).rev().find(is);
        let verdict = match older {
            Some(w) => format!(
                "STALE: generation {} ({:?}), older than generation {floor_generation:?}, \
                 acknowledged before the read started",
                w.generation, w.outcome
            ),
            None if got.iter().all(|b| *b == 0) => format!(
                "STALE: zeros, but generation {floor_generation:?} was acknowledged before \
                 the read started"
            ),
            None => "data the workload never wrote to this unit".to_string(),
        };
        let bytes = unit * self.unit_bytes;
        self.violations.push(format!(
            "{what} of unit {unit} (bytes {bytes}..{}): {verdict}",
            bytes + self.unit_bytes
        ));
    }

    pub fn stale_reads(&self) -> usize {
        self.violations
            .iter()
            .filter(|v| v.contains("STALE"))
            .count()
    }

    /// The generation `unit` holds for sure: that of its last write, if it was acknowledged
    /// (`None`: never written, or its last write failed or is in flight).
    pub fn settled(&self, unit: u64) -> Option<u64> {
        let last = self.units.get(&unit)?.writes.back()?;
        (last.outcome == Outcome::Acked).then_some(last.generation)
    }

    /// The last `n` writes of `unit` the model holds, oldest first, with their positions
    /// (those of [`Floor`]): what a report of a violation shows.
    pub fn recent(&self, unit: u64, n: usize) -> Vec<(usize, Write)> {
        let Some(history) = self.units.get(&unit) else {
            return Vec::new();
        };
        let skip = history.writes.len().saturating_sub(n);
        history
            .writes
            .iter()
            .enumerate()
            .skip(skip)
            .map(|(i, w)| (history.dropped + i, *w))
            .collect()
    }

    /// Writes issued so far, over all units.
    pub fn writes_issued(&self) -> usize {
        self.units
            .values()
            .map(|h| h.dropped + h.writes.len())
            .sum()
    }
}
