//! Checkpoints: a consistent cut of a run's state, written while it runs, from which a restart
//! resumes exactly (DESIGN.md "State" and "Delivery"; CONTRACT.md "Replay", resume).
//!
//! # How a checkpoint is taken
//!
//! The feeder puts a barrier with the checkpoint's epoch into every shard's ring between two
//! events, right after a tick ([`Runtime::checkpoint`](crate::shard::Runtime::checkpoint)), and
//! notes its own state (the tick planner's clocks, its sequence number, the stream counters)
//! and the driver's (where in its input the barrier stands). Each operator instance on each shard
//! snapshots itself when the barrier reaches it in the single-threaded order of shard/tag.rs —
//! at once for operators that read streams, once every upstream instance has promised nothing
//! earlier will come for chained ones (aligned barriers, as Flink's) — so every snapshot is of the
//! same input prefix. Each operator's snapshot goes into the shard's file as it is taken (its
//! state copied once, state/snapshot.rs "Nesting without copies"); once all have passed, an index
//! of them ([`ShardIndex`]) ends the file, which is written, and the collector told. When every shard has, the collector hands the
//! driver the pieces of the [`Manifest`] (with the results that already left for the sinks after
//! the barrier, so that a restart does not emit them twice), and the driver commits it.
//!
//! # Files
//!
//! ```text
//! DIR/EPOCH/shard-N.snap   one per shard, written before the manifest
//! DIR/EPOCH/manifest       written to a temporary name, then renamed
//! ```
//!
//! With `durability = "power"` every file is synced after it is written and the directories after
//! the rename, so a checkpoint survives a power loss; otherwise it survives a process crash or
//! `kill -9` (the page cache keeps it) without a disk flush. `EPOCH` is 20 decimal digits, so names sort by epoch. The checkpoint in use is the highest
//! epoch whose manifest reads back (magic, version, crc, and every shard file too); epochs before
//! the previous one are deleted once a newer one is committed (the previous one stays, for when
//! the newest is found damaged). Every file is `[magic 8 B][version u32][crc32c of
//! the payload u32][payload length u64][zero 8 B][payload: an rkyv archive]` (a shard file's
//! payload: its operators' snapshots, each 16-aligned, then the archive of the index that names
//! where each lies); anything else — another
//! version, a torn or damaged file — is set aside with a message, never misread.
//!
//! # Chains
//!
//! A checkpoint of `braid run` need not copy all the state again: the barrier names a base — the
//! checkpoint before it, once committed — and an operator that can tell what changed since its
//! snapshot there writes a delta of it (state/snapshot.rs, "Deltas"; [`SnapshotEntry::base`]).
//! Reading a delta reads the base's shard file first, and its base's, back to a whole snapshot
//! ([`OperatorSnapshot::earlier`]). After [`MAX_DELTAS`] deltas the next checkpoint is whole
//! again ([`Chain`]; fewer in `braid run` when its journal's retention would not cover the
//! fallback below, [`Chain::within_retention`]), as it is after one that was not committed, at a
//! start, and whenever an operator's notes are not whole. A manifest names the oldest checkpoint its chains reach
//! ([`Manifest::chain_from`]). A damaged file fails every checkpoint whose chain reaches it, so
//! the fallback for a chain is the newest checkpoint before it, with that one's own chain: a
//! commit keeps both chains and deletes the rest, and the service's journal keeps what came
//! after the fallback's barrier (service/checkpoints.rs). With `checkpoint_interval = "1s"` a
//! start may thus replay up to [`MAX_DELTAS`] + 1 seconds of journal more than it would with
//! whole checkpoints only — and only when it found a file damaged. A replay's checkpoints are
//! all whole.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::plan::Plan;
use crate::state::snapshot::{self, InBuffer, SnapshotBuffer, SnapshotBytes, SnapshotError, SnapshotSerializer};
use crate::storage::mapped_file::ScratchBytes;
use crate::storage::quarantine::{Action, Lost, quarantine};

/// Bumped whenever any snapshot layout changes: a checkpoint of another version is not read.
/// 3: operator counters count expired rows; operator hosts keep the written-at times `ttl` needs.
/// 4: join quality and operator counters count expired rows per input; absence keys can expire
///    (free slots, each key's waiting rows).
/// 5: a shard file holds its operators' snapshots one after the other, then an index of where
///    each lies ([`ShardIndex`]), instead of an archive holding copies of them.
/// 6: a snapshot may be a delta of the one before it ([`SnapshotEntry::base`]); a manifest names
///    the oldest checkpoint its chains reach ([`Manifest::chain_from`]).
pub const FORMAT_VERSION: u32 = 6;
/// The oldest version still read: version 4's shard files are one archive holding copies of the
/// snapshots ([`ShardFile`]'s own layout), version 5's an index without bases, and both
/// versions' manifests one without `chain_from` ([`v5`]); their snapshots are all whole.
const OLDEST_READ: u32 = 4;
/// Magic, version, crc, payload length, zeros: 32 bytes, so the archive after it is 16-aligned.
const HEADER: usize = 32;
const SHARD_MAGIC: &[u8; 8] = b"braidshd";
const MANIFEST_MAGIC: &[u8; 8] = b"braidckp";

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
}

/// One operator's snapshot on one shard, with what it was a snapshot of.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OperatorSnapshot {
    pub name: String,
    /// [`definition_hash`] of the operator that wrote it.
    pub definition: u64,
    pub state: Vec<u8>,
    /// When `state` is a delta: the snapshots it applies to, the whole one first, each delta
    /// after the one it applies to ("Chains"). Filled by the loader; never in a file.
    #[rkyv(with = rkyv::with::Skip)]
    pub earlier: Vec<Vec<u8>>,
}

impl OperatorSnapshot {
    /// The whole snapshot and the deltas after it, `state` last.
    pub fn chain(&self) -> Vec<&[u8]> {
        self.earlier.iter().chain(std::iter::once(&self.state)).map(Vec::as_slice).collect()
    }
}

/// Where one operator's snapshot lies in its shard file's payload.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SnapshotEntry {
    pub name: String,
    /// [`definition_hash`] of the operator that wrote it.
    pub definition: u64,
    pub start: u64,
    pub len: u64,
    /// 0: a whole snapshot. Else a delta of this operator's snapshot in checkpoint `base` (the
    /// one before), which is read first ("Chains").
    pub base: u64,
}

impl SnapshotEntry {
    /// The entry of a snapshot written at `level` of a [`CheckpointDir::shard_buffer`]; `base`
    /// as [`SnapshotEntry::base`].
    pub fn new(name: String, definition: u64, level: InBuffer, base: u64) -> SnapshotEntry {
        SnapshotEntry { name, definition, start: (level.start - HEADER) as u64, len: level.len as u64, base }
    }
}

/// The archive that ends a shard's file, after its operators' snapshots: what they are and
/// where they lie.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ShardIndex {
    pub epoch: u64,
    pub shard: u32,
    pub shards: u32,
    pub operators: Vec<SnapshotEntry>,
}

/// What one shard wrote for a checkpoint, read back (and, archived, a version 4 shard file).
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ShardFile {
    pub epoch: u64,
    pub shard: u32,
    pub shards: u32,
    pub operators: Vec<OperatorSnapshot>,
}

/// A result or late row that reached the sinks after its operator passed the barrier but before
/// the checkpoint was complete: a restart from the checkpoint produces it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Early {
    pub op: u32,
    /// Which output ([`Side::code`](crate::operator::Side::code)): a result, a late or an expired row.
    pub input: u32,
    pub id: u64,
}

/// What the runtime hands the driver when every shard has written its snapshot.
#[derive(Clone, Debug)]
pub struct Completed {
    pub epoch: u64,
    /// The feeder's state at the barrier (tick planner, sequence, counters).
    pub feeder: Vec<u8>,
    /// What the driver gave [`Runtime::checkpoint`](crate::shard::Runtime::checkpoint).
    pub driver: Vec<u8>,
    pub early: Vec<Early>,
}

/// The commit record of a checkpoint: it exists only once every shard file is written.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Manifest {
    pub epoch: u64,
    pub shards: u32,
    /// The feeder's state at the barrier.
    pub feeder: Vec<u8>,
    /// The driver's (replay: input position and outputs; service: journal and sinks).
    pub driver: Vec<u8>,
    /// The oldest checkpoint a delta in this one may reach back to ("Chains"): kept while this
    /// one is. `epoch` itself when every snapshot in it is whole.
    pub chain_from: u64,
}

/// A committed checkpoint read back.
pub struct Loaded {
    pub manifest: Manifest,
    /// By shard.
    pub shards: Vec<ShardFile>,
}

/// Identifies an operator's definition: its kind and settings, its output schema, its inputs by
/// name and their schemas. A snapshot is restored only into an operator with the same hash (a reload keeps the
/// state of operators whose definition did not change).
pub fn definition_hash(plan: &Plan, op: usize) -> u64 {
    let def = &plan.operators[op];
    let inputs: Vec<(&str, String)> =
        def.inputs.iter().map(|&node| (plan.node_name(node), format!("{:?}", plan.node_schema(node)))).collect();
    let text = format!("{FORMAT_VERSION}|{:?}|{:?}|{inputs:?}", def.spec, def.output);
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// Deltas a chain holds at most after its whole checkpoint: the next is whole again, so a
/// restart reads at most this many more files per shard, and the checkpoints kept on disk stay
/// few ("Chains").
pub const MAX_DELTAS: u64 = 4;

/// Which checkpoint the next one's deltas may apply to ("Chains"): the last one, once it is
/// committed, while its chain holds fewer deltas than its bound ([`MAX_DELTAS`] by default);
/// else none (whole snapshots).
#[derive(Debug)]
pub struct Chain {
    /// The last committed checkpoint and the oldest its chain reaches.
    committed: Option<(u64, u64)>,
    /// The checkpoint under way and the oldest its chain reaches.
    under_way: Option<(u64, u64)>,
    max_deltas: u64,
}

impl Default for Chain {
    fn default() -> Chain {
        Chain::with_max_deltas(MAX_DELTAS)
    }
}

impl Chain {
    /// Chains of at most `max_deltas` deltas (0: every checkpoint whole).
    pub fn with_max_deltas(max_deltas: u64) -> Chain {
        Chain { committed: None, under_way: None, max_deltas }
    }

    /// The longest chains whose fallback's input a journal keeping `retention_ms` still holds,
    /// with a checkpoint every `interval_ms`: a start that falls back past a chain replays the
    /// journal from the barrier of the checkpoint before it, up to `max_deltas + 2` intervals
    /// back (one more for the margin), and the journal lets go of entries older than its
    /// retention whatever the checkpoints do. At most [`MAX_DELTAS`].
    pub fn within_retention(retention_ms: i64, interval_ms: i64) -> Chain {
        let intervals = if interval_ms > 0 { retention_ms / interval_ms } else { 0 };
        Chain::with_max_deltas(u64::try_from(intervals.saturating_sub(3)).unwrap_or(0).min(MAX_DELTAS))
    }

    /// The base checkpoint `epoch` may write deltas of (0: none), noting it under way.
    pub fn begin(&mut self, epoch: u64) -> u64 {
        let base = match self.committed {
            Some((last, from)) if last + 1 == epoch && last - from < self.max_deltas => last,
            _ => 0,
        };
        let from = if base == 0 { epoch } else { self.committed.map_or(epoch, |(_, from)| from) };
        self.under_way = Some((epoch, from));
        base
    }

    /// [`Manifest::chain_from`] of checkpoint `epoch`.
    pub fn chain_from(&self, epoch: u64) -> u64 {
        self.under_way.filter(|&(e, _)| e == epoch).map_or(epoch, |(_, from)| from)
    }

    /// Checkpoint `epoch` is committed.
    pub fn committed(&mut self, epoch: u64) {
        self.committed = Some((epoch, self.chain_from(epoch)));
    }
}

/// The checkpoints of one run under a directory.
#[derive(Clone, Debug)]
pub struct CheckpointDir {
    root: PathBuf,
    /// `durability = "power"`: files and directories are synced (a process crash or `kill -9`
    /// leaves the page cache alone, so without it a checkpoint costs no disk flush).
    sync: bool,
}

impl CheckpointDir {
    pub fn new(root: PathBuf, sync: bool) -> CheckpointDir {
        CheckpointDir { root, sync }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn epoch_dir(&self, epoch: u64) -> PathBuf {
        self.root.join(format!("{epoch:020}"))
    }

    fn shard_path(&self, epoch: u64, shard: u32) -> PathBuf {
        self.epoch_dir(epoch).join(format!("shard-{shard}.snap"))
    }

    /// A buffer for a shard's file: the shard's operators write their snapshots into it as the
    /// barrier passes them, then [`shard_file_in`](Self::shard_file_in) ends it.
    pub fn shard_buffer() -> SnapshotBuffer {
        SnapshotBuffer::with_header(HEADER)
    }

    /// [`shard_buffer`](Self::shard_buffer) in the pages of the shard's last checkpoint when it
    /// has them ([`SnapshotBuffer::kept`]).
    pub fn shard_buffer_in(last: Option<ScratchBytes>) -> SnapshotBuffer {
        SnapshotBuffer::kept(HEADER, last)
    }

    /// One shard's snapshots of checkpoint `file.epoch` as a file, and where it goes (its
    /// directory is made); the shard writes it through io_uring from its own thread without
    /// waiting for the disk, or with [`write_file`] under the legacy driver (shard/file_write.rs).
    /// `buffer` came from [`shard_buffer`](Self::shard_buffer) and holds the snapshots `index` names.
    pub fn shard_file_in(
        &self,
        index: &ShardIndex,
        buffer: SnapshotBuffer,
    ) -> Result<(PathBuf, SnapshotBytes), CheckpointError> {
        let dir = self.epoch_dir(index.epoch);
        std::fs::create_dir_all(&dir).map_err(|error| CheckpointError::Io { path: dir.clone(), error })?;
        Ok((self.shard_path(index.epoch, index.shard), framed_in(SHARD_MAGIC, index, buffer)?))
    }

    /// [`shard_file_in`](Self::shard_file_in) of snapshots held apart.
    pub fn shard_file(&self, file: &ShardFile) -> Result<(PathBuf, SnapshotBytes), CheckpointError> {
        let mut buffer = Self::shard_buffer();
        let operators = file
            .operators
            .iter()
            .map(|o| Ok(SnapshotEntry::new(o.name.clone(), o.definition, buffer.append(&o.state)?, 0)))
            .collect::<Result<_, SnapshotError>>()?;
        let index = ShardIndex { epoch: file.epoch, shard: file.shard, shards: file.shards, operators };
        self.shard_file_in(&index, buffer)
    }

    /// Whether files are synced after they are written (`durability = "power"`).
    pub fn syncs(&self) -> bool {
        self.sync
    }

    /// Commits checkpoint `manifest.epoch` (its shard files are written): the manifest goes to
    /// a temporary name, is synced, renamed and the directory synced; then older epochs go.
    pub fn commit(&self, manifest: &Manifest) -> Result<(), CheckpointError> {
        let dir = self.epoch_dir(manifest.epoch);
        std::fs::create_dir_all(&dir).map_err(|error| CheckpointError::Io { path: dir.clone(), error })?;
        let tmp = dir.join("manifest.tmp");
        write_file(&tmp, &framed_in(MANIFEST_MAGIC, manifest, SnapshotBuffer::with_header(HEADER))?, self.sync)?;
        let path = dir.join("manifest");
        std::fs::rename(&tmp, &path).map_err(|error| CheckpointError::Io { path: path.clone(), error })?;
        if self.sync {
            sync_dir(&dir)?;
            sync_dir(&self.root)?;
        }
        // This one's chain stays, and so does the newest committed checkpoint before it with its
        // own chain: the one a start falls back to when a file of this chain is found damaged
        // ("Chains"; for a whole checkpoint, the one before it).
        let committed = |e: u64| self.epoch_dir(e).join("manifest").exists();
        let fallback = self.epochs().into_iter().filter(|&e| e < manifest.chain_from && committed(e)).max();
        let fallback_from = fallback.map(|e| self.read_manifest(e).ok().flatten().map_or(e, |m| m.chain_from));
        let keep_from = fallback_from.map_or(manifest.chain_from, |from| from.min(manifest.chain_from));
        self.remove_epochs(|e| e < manifest.epoch && (e < keep_from || !committed(e)));
        Ok(())
    }

    /// Bytes the files of checkpoint `epoch` take.
    pub fn epoch_bytes(&self, epoch: u64) -> u64 {
        let Ok(entries) = std::fs::read_dir(self.epoch_dir(epoch)) else { return 0 };
        entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
    }

    /// Deletes every checkpoint (a finished replay keeps none). Best effort.
    pub fn clear(&self) {
        self.remove_epochs(|_| true);
    }

    fn remove_epochs(&self, remove: impl Fn(u64) -> bool) {
        for epoch in self.epochs() {
            if remove(epoch) {
                let dir = self.epoch_dir(epoch);
                if let Err(error) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(path = %dir.display(), %error, "Cannot delete an old checkpoint");
                }
            }
        }
    }

    /// Epochs with a directory, lowest first.
    pub fn epochs(&self) -> Vec<u64> {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return Vec::new() };
        let mut epochs: Vec<u64> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().filter(|n| n.len() == 20).and_then(|n| n.parse().ok()))
            .collect();
        epochs.sort_unstable();
        epochs
    }

    /// The newest committed checkpoint that reads back whole; the ones that do not are reported
    /// and quarantined, and the one before is tried (storage/quarantine.rs).
    pub fn latest(&self) -> Option<Loaded> {
        self.latest_valid(|_| Ok(())).map(|(loaded, ())| loaded)
    }

    /// [`latest`](Self::latest), where `check` must also accept the checkpoint (the service
    /// decodes its part of the manifest): one it refuses is quarantined like a damaged one.
    pub fn latest_valid<T>(&self, check: impl Fn(&Loaded) -> Result<T, String>) -> Option<(Loaded, T)> {
        for epoch in self.epochs().into_iter().rev() {
            let manifest = self.epoch_dir(epoch).join("manifest");
            let (reason, culprit) = match self.load(epoch) {
                Ok(Some(loaded)) => match check(&loaded) {
                    Ok(checked) => return Some((loaded, checked)),
                    Err(reason) => (reason, None),
                },
                Ok(None) => continue,
                Err(error) => {
                    let culprit = match &error {
                        CheckpointError::Io { path, .. } | CheckpointError::Unreadable { path, .. } => {
                            Some(path.clone())
                        }
                        CheckpointError::Snapshot(_) => None,
                    };
                    (error.to_string(), culprit)
                }
            };
            let lost =
                Lost { records: 0, detail: format!("checkpoint {epoch}: the start falls back to the one before it") };
            // The manifest goes in any case: without it the epoch no longer counts as committed
            // (its taken.log stays, taken.rs still reads it).
            if let Some(culprit) = culprit.filter(|c| *c != manifest && c.exists()) {
                quarantine(&culprit, "checkpoint shard file", &reason, &lost, Action::Move);
            }
            quarantine(&manifest, "checkpoint manifest", &reason, &lost, Action::Move);
        }
        None
    }

    /// Checkpoint `epoch`, or `None` when it was never committed.
    fn load(&self, epoch: u64) -> Result<Option<Loaded>, CheckpointError> {
        let Some(manifest) = self.read_manifest(epoch)? else { return Ok(None) };
        let shards = (0..manifest.shards)
            .map(|shard| self.load_shard(epoch, shard, manifest.shards, &mut HashMap::new()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Loaded { manifest, shards }))
    }

    /// The manifest of checkpoint `epoch`, or `None` when it has none.
    fn read_manifest(&self, epoch: u64) -> Result<Option<Manifest>, CheckpointError> {
        let path = self.epoch_dir(epoch).join("manifest");
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(CheckpointError::Io { path, error }),
        };
        Ok(Some(match unframed(MANIFEST_MAGIC, &bytes, &path)? {
            (..=5, payload) => snapshot::decode::<v5::Manifest>(payload)?.into(),
            (_, payload) => snapshot::decode(payload)?,
        }))
    }

    /// Shard `shard`'s file of checkpoint `epoch` (of `shards`), each delta in it with the
    /// snapshots it applies to ([`OperatorSnapshot::earlier`]); `read` holds the files of
    /// earlier checkpoints already read for this shard.
    fn load_shard(
        &self,
        epoch: u64,
        shard: u32,
        shards: u32,
        read: &mut HashMap<u64, ShardFile>,
    ) -> Result<ShardFile, CheckpointError> {
        let path = self.shard_path(epoch, shard);
        let (mut file, bases) = read_shard_file(&path)?;
        if file.epoch != epoch || file.shard != shard || file.shards != shards {
            return Err(CheckpointError::Unreadable { path, reason: "another checkpoint's shard file".into() });
        }
        for (operator, base) in file.operators.iter_mut().zip(bases) {
            if base == 0 {
                continue;
            }
            if base >= epoch {
                let reason = format!("operator {}'s snapshot is a delta of a later checkpoint", operator.name);
                return Err(CheckpointError::Unreadable { path, reason });
            }
            if !read.contains_key(&base) {
                let earlier = self.load_shard(base, shard, shards, read)?;
                read.insert(base, earlier);
            }
            let of_base = read.get(&base).and_then(|file| file.operators.iter().find(|o| o.name == operator.name));
            let Some(of_base) = of_base.filter(|o| o.definition == operator.definition) else {
                let reason =
                    format!("operator {}'s delta has no snapshot in checkpoint {base} to apply to", operator.name);
                return Err(CheckpointError::Unreadable { path, reason });
            };
            operator.earlier = of_base.chain().into_iter().map(<[u8]>::to_vec).collect();
        }
        Ok(file)
    }
}

/// A shard file read and checked, and each of its snapshots' [`SnapshotEntry::base`].
fn read_shard_file(path: &Path) -> Result<(ShardFile, Vec<u64>), CheckpointError> {
    let bytes = std::fs::read(path).map_err(|error| CheckpointError::Io { path: path.to_owned(), error })?;
    match unframed(SHARD_MAGIC, &bytes, path)? {
        (4, payload) => {
            let file = snapshot::decode::<ShardFile>(payload)?;
            let bases = vec![0; file.operators.len()];
            Ok((file, bases))
        }
        (5, payload) => read_snapshots(snapshot::decode::<v5::ShardIndex>(payload)?.into(), payload, path),
        (_, payload) => read_snapshots(snapshot::decode(payload)?, payload, path),
    }
}

/// The snapshots `index` names, taken out of `payload`, and their bases.
fn read_snapshots(index: ShardIndex, payload: &[u8], path: &Path) -> Result<(ShardFile, Vec<u64>), CheckpointError> {
    let bases = index.operators.iter().map(|entry| entry.base).collect();
    let operators = index
        .operators
        .into_iter()
        .map(|entry| {
            let range = usize::try_from(entry.start).ok().zip(usize::try_from(entry.len).ok());
            let state = range.and_then(|(start, len)| payload.get(start..start.checked_add(len)?));
            let Some(state) = state else {
                let reason = format!("operator {}'s snapshot lies outside the file", entry.name);
                return Err(CheckpointError::Unreadable { path: path.to_owned(), reason });
            };
            let (name, definition, state) = (entry.name, entry.definition, state.to_vec());
            Ok(OperatorSnapshot { name, definition, state, earlier: Vec::new() })
        })
        .collect::<Result<_, _>>()?;
    Ok((ShardFile { epoch: index.epoch, shard: index.shard, shards: index.shards, operators }, bases))
}

/// Version 5's manifest and shard index, as they were before chains: read, never written.
mod v5 {
    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    pub struct Manifest {
        pub epoch: u64,
        pub shards: u32,
        pub feeder: Vec<u8>,
        pub driver: Vec<u8>,
    }

    impl From<Manifest> for super::Manifest {
        fn from(m: Manifest) -> super::Manifest {
            super::Manifest {
                epoch: m.epoch,
                shards: m.shards,
                feeder: m.feeder,
                driver: m.driver,
                chain_from: m.epoch,
            }
        }
    }

    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    pub struct SnapshotEntry {
        pub name: String,
        pub definition: u64,
        pub start: u64,
        pub len: u64,
    }

    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    pub struct ShardIndex {
        pub epoch: u64,
        pub shard: u32,
        pub shards: u32,
        pub operators: Vec<SnapshotEntry>,
    }

    impl From<ShardIndex> for super::ShardIndex {
        fn from(index: ShardIndex) -> super::ShardIndex {
            let operators = index
                .operators
                .into_iter()
                .map(|e| super::SnapshotEntry {
                    name: e.name,
                    definition: e.definition,
                    start: e.start,
                    len: e.len,
                    base: 0,
                })
                .collect();
            super::ShardIndex { epoch: index.epoch, shard: index.shard, shards: index.shards, operators }
        }
    }
}

/// `value` encoded after the snapshots in `buffer` (which began with [`HEADER`] zero bytes), then
/// the header filled in: one buffer, the archive 16-aligned in it (and so in a buffer the file is
/// read back into).
fn framed_in<T>(magic: &[u8; 8], value: &T, mut buffer: SnapshotBuffer) -> Result<SnapshotBytes, SnapshotError>
where
    T: for<'a> rkyv::Serialize<SnapshotSerializer<'a>>,
{
    let (_, archive_crc) = buffer.end(HEADER, value)?;
    let mut bytes = buffer.into_bytes();
    let payload = &bytes[HEADER..];
    // The payload is that archive and its crc: its crc goes on from the archive's over those 4
    // bytes (one pass over a shard's state fewer; crc32c was a shard's largest checkpoint cost).
    let crc = crc32c::crc32c_append(archive_crc, &payload[payload.len() - 4..]);
    let len = payload.len() as u64;
    bytes[..8].copy_from_slice(magic);
    bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    bytes[16..24].copy_from_slice(&len.to_le_bytes());
    Ok(bytes)
}

/// The format version and payload of a file [`framed_in`] wrote, checked.
fn unframed<'a>(magic: &[u8; 8], bytes: &'a [u8], path: &Path) -> Result<(u32, &'a [u8]), CheckpointError> {
    let bad = |reason: String| CheckpointError::Unreadable { path: path.to_owned(), reason };
    if bytes.len() < HEADER || &bytes[..8] != magic {
        return Err(bad("not a checkpoint file of this kind".into()));
    }
    let word = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let version = word(8);
    if !(OLDEST_READ..=FORMAT_VERSION).contains(&version) {
        return Err(bad(format!("format version {version}, this braid reads {OLDEST_READ} to {FORMAT_VERSION}")));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let payload = &bytes[HEADER..];
    if u64::from_le_bytes(len) != payload.len() as u64 || crc32c::crc32c(payload) != word(12) {
        return Err(bad("torn or damaged (length or crc)".into()));
    }
    Ok((version, payload))
}

/// How failed checkpoint writes are reported (storage/write_faults.rs); a commit clears it.
pub const CHECKPOINT_SITE: &str = "checkpoint";
pub const CHECKPOINT_MEANWHILE: &str =
    "no checkpoint is committed: the previous one and the journal after it stay (a restart takes longer)";

/// Writes `bytes` to `path`, and syncs the file when asked (`durability = "power"`).
pub fn write_file(path: &Path, bytes: &[u8], sync: bool) -> Result<(), CheckpointError> {
    let io = |error| CheckpointError::Io { path: path.to_owned(), error };
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    if sync {
        file.sync_all().map_err(io)?;
    }
    Ok(())
}

/// Syncs a directory, so that the names created or renamed in it survive a power loss.
pub fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    let io = |error| CheckpointError::Io { path: dir.to_owned(), error };
    std::fs::File::open(dir).map_err(io)?.sync_all().map_err(io)
}

#[cfg(test)]
mod tests;
