//! Snapshots of in-memory state, for checkpoints (DESIGN.md "State", issue "Checkpoints").
//!
//! Everything an operator's output depends on — its stored rows with their handles and matched
//! flags, timers, open windows and aggregates, per-key state, its clock and counters — is written
//! into a snapshot when a checkpoint barrier passes it, and read back into a freshly built
//! instance of the same operator at a restart. A snapshot is an rkyv archive of a plain struct
//! (vectors, not maps or heaps: the containers rebuild their order on restore), followed by the
//! crc32c of the archive (4 bytes, little endian). Reading checks the crc, then the archive with
//! bytecheck, so a damaged snapshot — truncated, a byte flipped anywhere — or a foreign one is an
//! error, never a misread: bytecheck alone would take a flipped byte inside a number for another
//! number. (Snapshots nest — an operator's inside its host's — so inner ones are checked twice;
//! crc32c runs at several GB/s, a small price for every layer checking what it reads. Writing
//! sums each byte once: a level's crc combines its inner levels' ([`SnapshotWriter`]).)
//!
//! # Stored rows
//!
//! Rows an operator keeps in a [`KeyedStore`] go into its snapshot as a [`SavedStore`] — per row
//! the handle its timers name the row by, the matched flag, the row's archive — in the store's
//! [`export`](KeyedStore::export) order ([`save_store`]), and come back with the same handles
//! ([`check_store`], then [`load_store`]), so timers and other references restored with them
//! still name the same rows; handles the store hands out later are new ones, past every handle
//! the snapshotted store had handed out ([`SavedStore::issued`]), so a handle an operator kept
//! for a row removed before the snapshot never names a later row. Rows are restored into an empty store: an arena directory
//! restored into is a fresh one (the rows are written anew; an arena keeps no pointer into old
//! files). A snapshot of arena rows restores into a memory store and the other way round.
//!
//! # Nesting without copies
//!
//! Snapshots nest: a store's rows in an operator's, an operator's in its kind tag, that in its
//! host's, every host's of a shard in the shard's checkpoint file. Each level used to be encoded
//! into a `Vec<u8>` of its own that the next level copied into its archive, so a checkpoint held
//! its state twice at every step (a shard's peak memory at every checkpoint). Now a level is
//! serialized in place, inside the archive that holds it ([`Nest`]): its archive, 16-aligned, and
//! its crc32c are written where the outer archive's `Vec<u8>` bytes go, and a store's rows are
//! read from the store as they are written ([`StoreView`]). The bytes of each level are what
//! [`encode`] would have given, so reading is unchanged: [`decode`] one level, take its bytes,
//! decode the next. A host's snapshot is written straight into its shard's file
//! ([`SnapshotBuffer`]; checkpoint/mod.rs), so a shard's checkpoint costs one buffer of its
//! state's size, its rows copied once. (Kinds other than the interval join still encode their
//! own level apart and have it copied in.)
//!
//! # Deltas
//!
//! A checkpoint need not copy every stored row each time: a store notes the handles of the rows
//! that leave it and of those that become matched since its last snapshot
//! ([`KeyedStore::note_changes`]), its operator knows the rows it stored since, and a delta
//! ([`StoreDelta`]) names just those — the rows stored since copied, the rest by handle. A delta
//! applies to the snapshot before it ([`apply_deltas`]); a restart reads the chain back to the whole
//! snapshot it starts from (checkpoint/mod.rs, "Chains"). Notes are bounded
//! ([`StoreChanges`](super::StoreChanges)); when they are not whole, or the checkpoint asks for
//! it, the snapshot is a whole one. Only the interval join writes deltas so far (its state is
//! what grows with the traffic); every other kind writes whole snapshots, which a chain takes as
//! they are.
//!
//! # Restoring
//!
//! `restore` takes a snapshot into a freshly built instance of the same operator spec. Each kind
//! decodes and checks everything — lengths against its spec (inputs, slots, aggregates),
//! positions and numbers that index its own tables, row handles — before it changes anything,
//! so a snapshot that does not fit is refused with [`SnapshotError::Mismatch`] or
//! [`SnapshotError::Decode`] and the instance stays as built. What the operator does not keep
//! (its spec, scratch buffers) comes from the instance, never from the snapshot.

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::vec::{ArchivedVec, VecResolver};
use thiserror::Error;

use super::{KeyedStore, RowHandle};
use crate::storage::mapped_file::ScratchBytes;

/// Bytes of the crc32c after the archive.
const CRC_LEN: usize = 4;
/// The alignment an archive is read at (rkyv's, and [`AlignedVec`]'s default).
const ARCHIVE_ALIGN: usize = 16;

#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The bytes are not a snapshot of this kind (damaged, or written by another version).
    #[error("snapshot does not decode: {0}")]
    Decode(String),
    /// A snapshot of something else: another kind of operator, another number of inputs.
    #[error("snapshot is of {found}, expected {expected}")]
    Mismatch { expected: String, found: String },
    #[error("encoding a snapshot: {0}")]
    Encode(String),
}

/// Encodes `value` as an rkyv archive followed by its crc32c.
///
/// The archive is written straight into the `Vec` it is returned in (the bytes are those an
/// `AlignedVec` would get: positions count from the buffer's start); the alignment matters only
/// to whoever reads the archive in place, and [`decode`] copies a misaligned one.
pub fn encode<T>(value: &T) -> Result<Vec<u8>, SnapshotError>
where
    T: for<'a> rkyv::Serialize<HighSerializer<Vec<u8>, ArenaHandle<'a>, rancor::Error>>,
{
    let mut bytes = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, Vec::new())
        .map_err(|e| SnapshotError::Encode(e.to_string()))?;
    let crc = archive_crc(&bytes);
    bytes.extend_from_slice(&crc);
    Ok(bytes)
}

/// [`encode`] for a value that nests others in place ([`Nest`]), which needs the aligned writer
/// (and copies the result out of it: for snapshots taken apart, not a checkpoint's).
pub fn encode_nesting<T>(value: &T) -> Result<Vec<u8>, SnapshotError>
where
    T: for<'a> rkyv::Serialize<SnapshotSerializer<'a>>,
{
    let mut buffer = SnapshotBuffer::with_header(0);
    let level = buffer.write(value)?;
    Ok(buffer.bytes(level).to_vec())
}

/// The crc32c that follows an archive, as [`decode`] checks it.
fn archive_crc(archive: &[u8]) -> [u8; CRC_LEN] {
    crc32c::crc32c(archive).to_le_bytes()
}

/// Decodes what [`encode`] wrote, checking its crc and then the archive (any alignment of
/// `bytes`).
pub fn decode<T>(bytes: &[u8]) -> Result<T, SnapshotError>
where
    T: rkyv::Archive,
    T::Archived:
        for<'a> CheckBytes<HighValidator<'a, rancor::Error>> + rkyv::Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let Some((archive, crc)) = bytes.split_last_chunk::<CRC_LEN>() else {
        return Err(SnapshotError::Decode(format!("{} bytes is too short for a snapshot", bytes.len())));
    };
    if archive_crc(archive) != *crc {
        return Err(SnapshotError::Decode("checksum mismatch (damaged or truncated)".into()));
    }
    let decoded = if archive.as_ptr().align_offset(ARCHIVE_ALIGN) == 0 {
        // A snapshot nested in another (its bytes a `Vec` the outer one decoded into, which the
        // allocator aligns) or a buffer read whole: read in place, no copy.
        rkyv::from_bytes::<T, rancor::Error>(archive)
    } else {
        let mut aligned = AlignedVec::<ARCHIVE_ALIGN>::with_capacity(archive.len());
        aligned.extend_from_slice(archive);
        rkyv::from_bytes::<T, rancor::Error>(&aligned)
    };
    decoded.map_err(|e| SnapshotError::Decode(e.to_string()))
}

/// Snapshots written one after another into one buffer, each level after the levels it holds
/// (module doc, "Nesting without copies").
pub struct SnapshotBuffer {
    writer: SnapshotWriter,
}

/// What snapshots nesting in place are serialized with ([`SnapshotBuffer`], [`Nest`]).
pub type SnapshotSerializer<'a> = HighSerializer<SnapshotWriter, ArenaHandle<'a>, rancor::Error>;

/// The bytes of a [`SnapshotBuffer`], and the crc32c of each level written into them so far that
/// no level around it has summed yet: a level's crc is its inner levels' crcs combined with
/// those of the bytes between them (`crc32c_combine`), so a checkpoint passes over each byte of a
/// shard's state once, not once per level around it (four: the operator's, its kind's, its
/// host's, the file's). rkyv only appends, so every level summed since a level began lies inside
/// it.
#[derive(Default)]
pub struct SnapshotWriter {
    bytes: SnapshotBytes,
    /// (start, end, crc) of summed levels, in order, none inside another.
    summed: Vec<(usize, usize, u32)>,
}

/// Where a [`SnapshotBuffer`]'s bytes are: on the heap, or in a shard's [`ScratchBytes`], which
/// keeps its pages from one checkpoint to the next (a fresh buffer's page faults cost a shard
/// more than the copy into it).
pub enum SnapshotBytes {
    Heap(AlignedVec),
    Kept(ScratchBytes),
}

impl Default for SnapshotBytes {
    fn default() -> SnapshotBytes {
        SnapshotBytes::Heap(AlignedVec::new())
    }
}

impl SnapshotBytes {
    fn len(&self) -> usize {
        match self {
            SnapshotBytes::Heap(bytes) => bytes.len(),
            SnapshotBytes::Kept(bytes) => bytes.len(),
        }
    }

    fn extend_from_slice(&mut self, more: &[u8]) -> std::io::Result<()> {
        match self {
            SnapshotBytes::Heap(bytes) => bytes.extend_from_slice(more),
            SnapshotBytes::Kept(bytes) => bytes.extend_from_slice(more)?,
        }
        Ok(())
    }

    fn zero_fill_to(&mut self, len: usize) -> std::io::Result<()> {
        match self {
            SnapshotBytes::Heap(bytes) => bytes.resize(len.max(bytes.len()), 0),
            SnapshotBytes::Kept(bytes) => bytes.zero_fill_to(len)?,
        }
        Ok(())
    }
}

impl std::ops::Deref for SnapshotBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            SnapshotBytes::Heap(bytes) => bytes,
            SnapshotBytes::Kept(bytes) => bytes.as_slice(),
        }
    }
}

impl AsRef<[u8]> for SnapshotBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::ops::DerefMut for SnapshotBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            SnapshotBytes::Heap(bytes) => bytes,
            SnapshotBytes::Kept(bytes) => bytes.as_mut_slice(),
        }
    }
}

/// A buffer that could not grow: the checkpoint fails, the run goes on.
fn no_room(error: std::io::Error) -> SnapshotError {
    SnapshotError::Encode(format!("no memory for the snapshot: {error}"))
}

impl SnapshotWriter {
    /// Pads to a 16-byte boundary, where the next level begins.
    fn begin(&mut self) -> std::io::Result<usize> {
        let padded = self.bytes.len().next_multiple_of(ARCHIVE_ALIGN);
        self.bytes.zero_fill_to(padded)?;
        Ok(padded)
    }

    /// The crc32c of the bytes from `start` to the end, which from now on stands for the levels
    /// it covers.
    fn crc_from(&mut self, start: usize) -> u32 {
        let inner = self.summed.partition_point(|&(at, _, _)| at < start);
        let (mut crc, mut at) = (0, start);
        for &(from, to, summed) in &self.summed[inner..] {
            crc = crc32c::crc32c_append(crc, &self.bytes[at..from]);
            crc = crc32c::crc32c_combine(crc, summed, to - from);
            at = to;
        }
        crc = crc32c::crc32c_append(crc, &self.bytes[at..]);
        debug_assert_eq!(crc, crc32c::crc32c(&self.bytes[start..]), "combined crc of {start}..");
        self.summed.truncate(inner);
        self.summed.push((start, self.bytes.len(), crc));
        crc
    }

    /// Ends the level that began at `start`: appends its crc32c ([`crc_from`](Self::crc_from)).
    fn seal(&mut self, start: usize) -> std::io::Result<(InBuffer, u32)> {
        let crc = self.crc_from(start);
        self.bytes.extend_from_slice(&crc.to_le_bytes())?;
        Ok((InBuffer { start, len: self.bytes.len() - start }, crc))
    }
}

impl rkyv::ser::Positional for SnapshotWriter {
    fn pos(&self) -> usize {
        self.bytes.len()
    }
}

impl<E: rancor::Source> rkyv::ser::Writer<E> for SnapshotWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        self.bytes.extend_from_slice(bytes).map_err(E::new)
    }
}

/// Where a snapshot lies in a [`SnapshotBuffer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InBuffer {
    pub start: usize,
    pub len: usize,
}

/// A snapshot nested in the one being serialized, written where its `Vec<u8>` bytes go: its
/// archive (16-aligned) and crc32c, as [`encode`] would have returned them, without a buffer of
/// its own to copy from (module doc, "Nesting without copies").
pub struct Nest<T>(pub T);

pub struct NestResolver {
    start: usize,
    len: usize,
}

impl NestResolver {
    /// `bytes`, a snapshot encoded on its own, copied in where a nested one would be written.
    pub fn copy<S>(bytes: &[u8], serializer: &mut S) -> Result<NestResolver, S::Error>
    where
        S: rancor::Fallible + rkyv::ser::Writer + ?Sized,
    {
        let start = serializer.pos();
        serializer.write(bytes)?;
        Ok(NestResolver { start, len: bytes.len() })
    }

    /// The `Vec<u8>` that holds the nested snapshot.
    pub fn resolve(self, out: rkyv::Place<ArchivedVec<u8>>) {
        ArchivedVec::<u8>::resolve_from_len(self.len, VecResolver::from_pos(self.start), out);
    }
}

impl<T> rkyv::Archive for Nest<T> {
    type Archived = ArchivedVec<u8>;
    type Resolver = NestResolver;

    fn resolve(&self, resolver: NestResolver, out: rkyv::Place<ArchivedVec<u8>>) {
        resolver.resolve(out);
    }
}

impl<'a, T> rkyv::Serialize<SnapshotSerializer<'a>> for Nest<T>
where
    T: rkyv::Serialize<SnapshotSerializer<'a>>,
{
    fn serialize(&self, serializer: &mut SnapshotSerializer<'a>) -> Result<NestResolver, rancor::Error> {
        nest(&self.0, serializer)
    }
}

/// What [`Nest`] of `value` writes, from a reference to it.
pub fn nest<'a, T>(value: &T, serializer: &mut SnapshotSerializer<'a>) -> Result<NestResolver, rancor::Error>
where
    T: rkyv::Serialize<SnapshotSerializer<'a>>,
{
    use rkyv::SerializeUnsized;
    let start = serializer.writer.begin().map_err(rancor::Source::new)?;
    value.serialize_unsized(serializer)?;
    let (level, _) = serializer.writer.seal(start).map_err(rancor::Source::new)?;
    Ok(NestResolver { start, len: level.len })
}

impl SnapshotBuffer {
    /// A buffer whose first `header` bytes (a multiple of 16) are zero, for a file's header.
    pub fn with_header(header: usize) -> SnapshotBuffer {
        let mut bytes = AlignedVec::new();
        bytes.resize(header, 0);
        SnapshotBuffer::after_header(header, SnapshotBytes::Heap(bytes))
    }

    /// [`with_header`](Self::with_header) for a shard's next checkpoint: in the pages of its
    /// last one (`last`) when it has them, else in a new memory file, else — no memory file can
    /// be made or grown — on the heap, as before.
    pub fn kept(header: usize, last: Option<ScratchBytes>) -> SnapshotBuffer {
        let kept = last.map_or_else(ScratchBytes::new, Ok).and_then(|mut kept| {
            kept.reuse();
            kept.zero_fill_to(header)?;
            Ok(kept)
        });
        match kept {
            Ok(kept) => SnapshotBuffer::after_header(header, SnapshotBytes::Kept(kept)),
            Err(error) => {
                tracing::debug!(%error, "no memory file for a checkpoint's buffer; writing it on the heap");
                SnapshotBuffer::with_header(header)
            }
        }
    }

    fn after_header(header: usize, bytes: SnapshotBytes) -> SnapshotBuffer {
        debug_assert!(header.is_multiple_of(ARCHIVE_ALIGN), "an archive after {header} bytes is not aligned");
        SnapshotBuffer { writer: SnapshotWriter { bytes, summed: Vec::new() } }
    }

    /// Writes `value`'s snapshot (its archive, 16-aligned, with the levels it nests in place, and
    /// its crc32c) after what the buffer holds.
    pub fn write<T>(&mut self, value: &T) -> Result<InBuffer, SnapshotError>
    where
        T: for<'a> rkyv::Serialize<SnapshotSerializer<'a>>,
    {
        let start = self.writer.begin().map_err(no_room)?;
        Ok(self.end(start, value)?.0)
    }

    /// Appends a snapshot encoded on its own, 16-aligned.
    pub fn append(&mut self, snapshot: &[u8]) -> Result<InBuffer, SnapshotError> {
        let start = self.writer.begin().map_err(no_room)?;
        self.writer.bytes.extend_from_slice(snapshot).map_err(no_room)?;
        Ok(InBuffer { start, len: snapshot.len() })
    }

    /// Appends `value`'s archive and the crc32c of everything from `start` on: a snapshot, or a
    /// file's payload whose archive comes after the snapshots it indexes. Returns where it lies
    /// and the crc it appended (a file's header crc goes on from it, not over the bytes again).
    pub fn end<T>(&mut self, start: usize, value: &T) -> Result<(InBuffer, u32), SnapshotError>
    where
        T: for<'a> rkyv::Serialize<SnapshotSerializer<'a>>,
    {
        let writer = std::mem::take(&mut self.writer);
        self.writer = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, writer)
            .map_err(|e| SnapshotError::Encode(e.to_string()))?;
        self.writer.seal(start).map_err(no_room)
    }

    /// The bytes of `level`.
    pub fn bytes(&self, level: InBuffer) -> &[u8] {
        &self.writer.bytes[level.start..level.start + level.len]
    }

    pub fn into_bytes(self) -> SnapshotBytes {
        self.writer.bytes
    }
}

/// A [`KeyedStore`] as a snapshot keeps it: its live rows in export order (module doc, "Stored
/// rows") and the bounds of the handles it handed out. A row is kept as its archive — the bytes
/// an arena record holds (`RowEncoder`'s) — so taking and restoring a snapshot copies bytes,
/// never decodes and re-encodes a row; the archives lie one after another in `archives`.
#[derive(Clone, Debug, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SavedStore {
    pub rows: Vec<SavedRow>,
    pub archives: Vec<u8>,
    pub issued: Vec<RowHandle>,
}

/// One stored row of a [`SavedStore`]: the handle the operator's timers name it by, its matched
/// flag and the length of its archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SavedRow {
    pub handle: RowHandle,
    pub len: u32,
    pub matched: bool,
}

impl SavedStore {
    /// About the bytes its archive takes.
    pub fn bytes(&self) -> usize {
        self.archives.len() + self.rows.len() * std::mem::size_of::<SavedRow>() + self.issued.len() * 8
    }

    /// Each row's handle, matched flag and archive, in order. [`check_store`] has made sure the
    /// lengths add up; a store that does not stops early (and `import` then reports it).
    pub fn iter(&self) -> impl Iterator<Item = (RowHandle, bool, &[u8])> + '_ {
        let mut at = 0usize;
        self.rows.iter().map_while(move |row| {
            let archive = self.archives.get(at..at.checked_add(row.len as usize)?)?;
            at += row.len as usize;
            Some((row.handle, row.matched, archive))
        })
    }
}

/// Every live row of `store` and the bounds of its handles.
pub fn save_store(store: &dyn KeyedStore) -> Result<SavedStore, SnapshotError> {
    let mut saved = SavedStore {
        rows: Vec::with_capacity(store.rows()),
        archives: Vec::with_capacity(store.bytes()),
        issued: store.handles_issued(),
    };
    store
        .export(&mut |handle, matched, archive| {
            saved.rows.push(SavedRow { handle, len: archive.len() as u32, matched });
            saved.archives.extend_from_slice(archive);
        })
        .map_err(|e| SnapshotError::Encode(e.to_string()))?;
    Ok(saved)
}

/// A [`KeyedStore`] serialized as its [`SavedStore`], the rows' archives copied from the store
/// into the archive being written, not into a vector first. The list of rows before them comes
/// from [`export_lens`](KeyedStore::export_lens), which an arena answers from its index: each
/// row's record is read once, by the copy (reading every record for its length first cost a
/// shard's snapshot as much again, `benches/store_snapshot.rs`). (The archive and serialize impls of
/// the views are written out: derived ones with `as` do not resolve through a lifetime.)
pub struct StoreView<'a> {
    rows: Vec<SavedRow>,
    archives: StoreArchives<'a>,
    issued: Vec<RowHandle>,
}

/// The archives of a store's rows, in export order, serialized as the `Vec<u8>` they fill.
pub struct StoreArchives<'a>(&'a dyn KeyedStore);

impl<'a> StoreView<'a> {
    pub fn of(store: &'a dyn KeyedStore) -> Result<StoreView<'a>, SnapshotError> {
        let mut rows = Vec::with_capacity(store.rows());
        store
            .export_lens(&mut |handle, matched, len| rows.push(SavedRow { handle, len: len as u32, matched }))
            .map_err(|e| SnapshotError::Encode(e.to_string()))?;
        Ok(StoreView { rows, archives: StoreArchives(store), issued: store.handles_issued() })
    }
}

impl rkyv::Archive for StoreView<'_> {
    type Archived = ArchivedSavedStore;
    type Resolver = (VecResolver, NestResolver, VecResolver);

    fn resolve(&self, (rows, archives, issued): Self::Resolver, out: rkyv::Place<ArchivedSavedStore>) {
        rkyv::munge::munge!(let ArchivedSavedStore { rows: out_rows, archives: out_archives, issued: out_issued } = out);
        rkyv::Archive::resolve(&self.rows, rows, out_rows);
        archives.resolve(out_archives);
        rkyv::Archive::resolve(&self.issued, issued, out_issued);
    }
}

impl<S> rkyv::Serialize<S> for StoreView<'_>
where
    S: rancor::Fallible + rkyv::ser::Writer + rkyv::ser::Allocator + ?Sized,
    S::Error: rancor::Source,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        Ok((self.rows.serialize(serializer)?, self.archives.serialize(serializer)?, self.issued.serialize(serializer)?))
    }
}

impl rkyv::Archive for StoreArchives<'_> {
    type Archived = ArchivedVec<u8>;
    type Resolver = NestResolver;

    fn resolve(&self, resolver: NestResolver, out: rkyv::Place<ArchivedVec<u8>>) {
        resolver.resolve(out);
    }
}

impl<S> rkyv::Serialize<S> for StoreArchives<'_>
where
    S: rancor::Fallible + rkyv::ser::Writer + ?Sized,
    S::Error: rancor::Source,
{
    fn serialize(&self, serializer: &mut S) -> Result<NestResolver, S::Error> {
        let start = serializer.pos();
        let mut written = Ok(());
        self.0
            .export(&mut |_, _, archive| {
                if written.is_ok() {
                    written = serializer.write(archive);
                }
            })
            .map_err(<S::Error as rancor::Source>::new)?;
        written?;
        Ok(NestResolver { start, len: serializer.pos() - start })
    }
}

/// What changed in a store since its last snapshot (module doc, "Deltas"): the rows that left
/// and the rows that became matched, by handle, and the rows stored since that are still there,
/// as a [`SavedStore`] of them (its `issued` the store's, as a whole snapshot's).
#[derive(Clone, Debug, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct StoreDelta {
    pub removed: Vec<RowHandle>,
    pub matched: Vec<RowHandle>,
    pub added: SavedStore,
}

/// A [`StoreDelta`] as a snapshot writes it, the rows stored since copied from the store into the
/// archive being written (as [`StoreView`] does for a whole store), not into vectors first.
pub struct StoreDeltaView<'a> {
    store: &'a dyn KeyedStore,
    changes: &'a super::StoreChanges,
    /// The rows stored since that are still there, in the order they were stored, and their
    /// key hashes.
    rows: Vec<SavedRow>,
    key_hashes: Vec<u64>,
}

impl<'a> StoreDeltaView<'a> {
    /// The delta of `store` since its last snapshot, whose operator names the rows it stored
    /// since (`added`: key hash and handle, in the order they were stored; rows that left since
    /// are skipped). `None` when the store's notes are not whole ([`KeyedStore::changes`]): the
    /// snapshot must be a whole one.
    pub fn of(store: &'a dyn KeyedStore, added: impl Iterator<Item = (u64, RowHandle)>) -> Option<StoreDeltaView<'a>> {
        let changes = store.changes()?;
        let (mut rows, mut key_hashes) = (Vec::new(), Vec::new());
        for (key_hash, handle) in added {
            if let Some((matched, len)) = store.stored_len(key_hash, handle) {
                rows.push(SavedRow { handle, len: len as u32, matched });
                key_hashes.push(key_hash);
            }
        }
        Some(StoreDeltaView { store, changes, rows, key_hashes })
    }

    /// The handles of the rows stored since that are still there, in the order they were stored.
    pub fn added(&self) -> impl Iterator<Item = RowHandle> + '_ {
        self.rows.iter().map(|row| row.handle)
    }
}

pub struct DeltaViewResolver {
    removed: VecResolver,
    matched: VecResolver,
    rows: VecResolver,
    archives: NestResolver,
    issued: VecResolver,
    issued_len: usize,
}

impl rkyv::Archive for StoreDeltaView<'_> {
    type Archived = ArchivedStoreDelta;
    type Resolver = DeltaViewResolver;

    fn resolve(&self, resolver: DeltaViewResolver, out: rkyv::Place<ArchivedStoreDelta>) {
        rkyv::munge::munge!(let ArchivedStoreDelta { removed, matched, added } = out);
        ArchivedVec::resolve_from_len(self.changes.removed.len(), resolver.removed, removed);
        ArchivedVec::resolve_from_len(self.changes.matched.len(), resolver.matched, matched);
        rkyv::munge::munge!(let ArchivedSavedStore { rows, archives, issued } = added);
        ArchivedVec::resolve_from_len(self.rows.len(), resolver.rows, rows);
        resolver.archives.resolve(archives);
        ArchivedVec::resolve_from_len(resolver.issued_len, resolver.issued, issued);
    }
}

impl<S> rkyv::Serialize<S> for StoreDeltaView<'_>
where
    S: rancor::Fallible + rkyv::ser::Writer + rkyv::ser::Allocator + ?Sized,
    S::Error: rancor::Source,
{
    /// In the order of the fields, as validation reads them: each field's bytes after the last's.
    fn serialize(&self, serializer: &mut S) -> Result<DeltaViewResolver, S::Error> {
        let removed = ArchivedVec::serialize_from_slice(&self.changes.removed, serializer)?;
        let matched = ArchivedVec::serialize_from_slice(&self.changes.matched, serializer)?;
        let rows = ArchivedVec::serialize_from_slice(&self.rows, serializer)?;
        let start = serializer.pos();
        let mut written = Ok(());
        for (row, &key_hash) in self.rows.iter().zip(&self.key_hashes) {
            let found = self
                .store
                .export_row(key_hash, row.handle, &mut |_, archive| {
                    if written.is_ok() {
                        written = serializer.write(archive);
                    }
                })
                .map_err(<S::Error as rancor::Source>::new)?;
            if !found {
                return Err(<S::Error as rancor::Source>::new(SnapshotError::Encode("a stored row left".into())));
            }
        }
        written?;
        let archives = NestResolver { start, len: serializer.pos() - start };
        let expected: usize = self.rows.iter().map(|row| row.len as usize).sum();
        if archives.len != expected {
            return Err(<S::Error as rancor::Source>::new(SnapshotError::Encode("a stored row changed".into())));
        }
        let issued = self.store.handles_issued();
        Ok(DeltaViewResolver {
            removed,
            matched,
            rows,
            archives,
            issued: ArchivedVec::serialize_from_slice(&issued, serializer)?,
            issued_len: issued.len(),
        })
    }
}

/// `base` with `deltas` applied, in one pass: the rows that left dropped, the ones that became
/// matched marked, each delta's rows stored since after those before them (so each key's rows
/// keep their order: a row stored later has a greater handle, and lies after every row of its
/// key stored before). A delta names only rows stored before it, never later ones, so its
/// handles apply to all that came before at once. Handles a delta names that nothing before it
/// holds are rows that came and went between two snapshots.
pub fn apply_deltas(base: &SavedStore, deltas: &[&StoreDelta]) -> SavedStore {
    let Some(last) = deltas.last() else { return base.clone() };
    let removed: std::collections::HashSet<RowHandle> = deltas.iter().flat_map(|d| d.removed.iter().copied()).collect();
    let matched: std::collections::HashSet<RowHandle> = deltas.iter().flat_map(|d| d.matched.iter().copied()).collect();
    let rows = base.rows.len() + deltas.iter().map(|d| d.added.rows.len()).sum::<usize>();
    let bytes = base.archives.len() + deltas.iter().map(|d| d.added.archives.len()).sum::<usize>();
    let mut applied = SavedStore {
        rows: Vec::with_capacity(rows.saturating_sub(removed.len())),
        archives: Vec::with_capacity(bytes),
        issued: last.added.issued.clone(),
    };
    for (handle, was_matched, archive) in
        std::iter::once(base).chain(deltas.iter().map(|d| &d.added)).flat_map(SavedStore::iter)
    {
        if !removed.contains(&handle) {
            let matched = was_matched || matched.contains(&handle);
            applied.rows.push(SavedRow { handle, len: archive.len() as u32, matched });
            applied.archives.extend_from_slice(archive);
        }
    }
    applied
}

/// Checks that `saved` can be imported into `store`: the store is empty (a freshly built
/// instance's), the archives' lengths add up, and the handles are distinct and such as a store
/// hands out (not `u64::MAX`, so a store can count on past every one). Each archive is checked
/// as it is imported.
pub fn check_store(store: &dyn KeyedStore, saved: &SavedStore) -> Result<(), SnapshotError> {
    if store.rows() > 0 {
        return Err(SnapshotError::Mismatch {
            expected: "a freshly built instance (empty stores)".into(),
            found: format!("a store holding {} rows", store.rows()),
        });
    }
    let lengths: u64 = saved.rows.iter().map(|r| u64::from(r.len)).sum();
    if lengths != saved.archives.len() as u64 {
        return Err(SnapshotError::Decode(format!(
            "stored rows of {lengths} bytes in {} bytes of archives",
            saved.archives.len()
        )));
    }
    if saved.issued.contains(&RowHandle::MAX) {
        return Err(SnapshotError::Decode("stored row handle out of range".into()));
    }
    // Sorted rather than hashed: a restart checks hundreds of thousands of handles. The
    // greatest comes last, so one look tells whether any is out of range.
    let mut handles: Vec<RowHandle> = saved.rows.iter().map(|r| r.handle).collect();
    handles.sort_unstable();
    if handles.last() == Some(&RowHandle::MAX) {
        return Err(SnapshotError::Decode("stored row handle out of range".into()));
    }
    if let Some(pair) = handles.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(SnapshotError::Decode(format!("two stored rows with handle {:#x}", pair[0])));
    }
    Ok(())
}

/// Imports what [`check_store`] accepted; an archive that is not a row is an error, and the
/// store, half filled, is then to be dropped with the instance it belongs to.
pub fn load_store(store: &mut dyn KeyedStore, saved: &SavedStore) -> Result<(), SnapshotError> {
    store.import(saved)
}

/// Copies `archive` (any alignment) into `scratch` and reads it as a row, checked.
pub fn access_row<'a>(
    scratch: &'a mut AlignedVec<16>,
    archive: &[u8],
) -> Result<&'a crate::record::ArchivedRow, SnapshotError> {
    scratch.clear();
    scratch.extend_from_slice(archive);
    crate::record::frame::access(scratch).map_err(|e| SnapshotError::Decode(format!("a stored row: {e}")))
}

/// [`SnapshotError::Mismatch`] unless `found == expected` (a count: inputs, slots, aggregates).
pub fn expect_len(what: &str, expected: usize, found: usize) -> Result<(), SnapshotError> {
    if expected == found {
        return Ok(());
    }
    Err(SnapshotError::Mismatch { expected: format!("{expected} {what}"), found: format!("{found} {what}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Sample {
        a: u64,
        b: Vec<(i128, bool)>,
    }

    #[test]
    fn the_archive_in_a_vec_is_the_aligned_one_byte_for_byte() {
        // i128 fields need 16-byte alignment: padding is where the two could differ.
        let sample = Sample { a: 7, b: (0..100).map(|i| (i128::from(i) << 70, i % 3 == 0)).collect() };
        let aligned = encode_nesting(&sample).unwrap();
        let in_vec = encode(&sample).unwrap();
        assert_eq!(in_vec, aligned.as_slice());
        assert_eq!(decode::<Sample>(&in_vec).unwrap(), sample);
        // Read from a misaligned copy too.
        let mut shifted = vec![0u8; 1];
        shifted.extend_from_slice(&in_vec);
        assert_eq!(decode::<Sample>(&shifted[1..]).unwrap(), sample);
    }

    #[test]
    fn round_trip_and_damage_is_an_error() {
        let sample = Sample { a: 7, b: vec![(-3, true), (i128::MAX, false)] };
        let bytes = encode(&sample).unwrap();
        assert_eq!(decode::<Sample>(&bytes).unwrap(), sample);
        for shift in 1..16 {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(&bytes);
            assert_eq!(decode::<Sample>(&shifted[shift..]).unwrap(), sample, "read at an offset of {shift}");
        }
        for len in 0..bytes.len() {
            assert!(decode::<Sample>(&bytes[..len]).is_err(), "truncated to {len}");
        }
        for at in 0..bytes.len() {
            for bit in [0x01, 0x80] {
                let mut damaged = bytes.clone();
                damaged[at] ^= bit;
                assert!(decode::<Sample>(&damaged).is_err(), "bit {bit:#x} of byte {at} flipped");
            }
        }
    }

    #[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Outer {
        name: String,
        inner: Vec<u8>,
        store: SavedStore,
    }

    /// `Outer` as a snapshot that nests in place writes it.
    struct OuterView<'a> {
        name: String,
        inner: Nest<Sample>,
        store: StoreView<'a>,
    }

    impl rkyv::Archive for OuterView<'_> {
        type Archived = ArchivedOuter;
        type Resolver = (rkyv::string::StringResolver, NestResolver, <StoreView<'static> as rkyv::Archive>::Resolver);

        fn resolve(&self, (name, inner, store): Self::Resolver, out: rkyv::Place<ArchivedOuter>) {
            rkyv::munge::munge!(let ArchivedOuter { name: out_name, inner: out_inner, store: out_store } = out);
            rkyv::Archive::resolve(&self.name, name, out_name);
            inner.resolve(out_inner);
            rkyv::Archive::resolve(&self.store, store, out_store);
        }
    }

    impl<'a> rkyv::Serialize<SnapshotSerializer<'a>> for OuterView<'_> {
        fn serialize(&self, serializer: &mut SnapshotSerializer<'a>) -> Result<Self::Resolver, rancor::Error> {
            Ok((self.name.serialize(serializer)?, self.inner.serialize(serializer)?, self.store.serialize(serializer)?))
        }
    }

    /// A snapshot nesting others in place (another snapshot, a store's rows) reads back as one
    /// holding copies of them encoded apart: the same values; a flipped bit anywhere is an error.
    #[test]
    fn levels_nested_in_place_read_back_as_levels_encoded_apart() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = crate::state::arena::ArenaStore::open(dir.path()).unwrap();
        for i in 0..50 {
            store.insert(row(["a", "b", "c"][i % 3], i as i64), i % 4 == 0);
        }
        let sample = Sample { a: 7, b: (0..20).map(|i| (i128::from(i) << 70, i % 3 == 0)).collect() };
        let name = "a name longer than an inline string".to_owned();
        let view = OuterView { name: name.clone(), inner: Nest(sample), store: StoreView::of(&store).unwrap() };
        let mut buffer = SnapshotBuffer::with_header(32);
        buffer.append(&[1, 2, 3]).unwrap();
        let level = buffer.write(&view).unwrap();
        assert_eq!(level.start, 48, "a level starts 16-aligned");
        let bytes = buffer.bytes(level).to_vec();
        assert_eq!(bytes, encode_nesting(&view).unwrap(), "the same bytes wherever the level starts");

        // A kept buffer whose pages hold an earlier, longer use's bytes writes the same ones: its
        // header and padding are zeroed, not left as they were.
        let mut used = ScratchBytes::new().unwrap();
        used.extend_from_slice(&vec![0xa5; 3 << 20]).unwrap();
        let mut kept = SnapshotBuffer::kept(32, Some(used));
        kept.append(&[1, 2, 3]).unwrap();
        let level = kept.write(&view).unwrap();
        assert!(matches!(kept.writer.bytes, SnapshotBytes::Kept(_)));
        assert_eq!(&kept.writer.bytes[..level.start], &buffer.writer.bytes[..level.start], "header and padding");
        assert_eq!(kept.bytes(level), &bytes[..]);

        let sample = view.inner.0;
        let apart = Outer { name, inner: encode(&sample).unwrap(), store: save_store(&store).unwrap() };
        let read: Outer = decode(&bytes).unwrap();
        assert_eq!(decode::<Sample>(&read.inner).unwrap(), sample);
        assert_eq!(read, apart, "the nested level's bytes are those `encode` writes; the store's rows alike");
        for at in (0..bytes.len()).step_by(5) {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(decode::<Outer>(&damaged).is_err(), "byte {at} flipped");
        }
    }

    fn row(key: &str, ts: i64) -> crate::record::Row {
        let key = crate::record::Key::Str(key.into());
        let key_hash = crate::record::id::key_hash(&key);
        crate::record::Row { ts, key, key_hash, id: ts as u64, values: Box::new([crate::record::Value::Int(ts)]) }
    }

    /// Rows come back under their handles, in each key's order, matched flags kept; the store
    /// hands out greater handles afterwards, past those of rows removed before the snapshot too;
    /// a used store or repeated handles are refused.
    #[test]
    fn stored_rows_round_trip_through_both_stores() {
        use crate::record::frame::to_row;
        use crate::state::MemoryStore;
        use crate::state::arena::ArenaStore;
        let dir = tempfile::tempdir().unwrap();
        let mut memory_source = MemoryStore::default();
        let mut arena_source = ArenaStore::open(&dir.path().join("source")).unwrap();
        let sources: [&mut dyn KeyedStore; 2] = [&mut memory_source, &mut arena_source];
        for (s, source) in sources.into_iter().enumerate() {
            let handles: Vec<RowHandle> =
                (0..7).map(|i| source.insert(row(["a", "b"][i % 2], i as i64), i == 2)).collect();
            source.discard(row("a", 0).key_hash, handles[0]);
            source.discard(row("a", 0).key_hash, handles[6]);
            let saved = save_store(source).unwrap();
            assert_eq!(saved.rows.len(), 5);
            let by_key = |saved: &SavedStore, key: &str| -> Vec<(RowHandle, bool, i64)> {
                let mut scratch = AlignedVec::new();
                saved
                    .iter()
                    .map(|(handle, matched, archive)| {
                        (handle, matched, to_row(access_row(&mut scratch, archive).unwrap()))
                    })
                    .filter(|(_, _, r)| r.key == row(key, 0).key)
                    .map(|(handle, matched, r)| (handle, matched, r.ts))
                    .collect()
            };
            let a = by_key(&saved, "a");
            assert_eq!(a, [(handles[2], true, 2), (handles[4], false, 4)]);

            let mut memory = MemoryStore::default();
            let mut arena = ArenaStore::open(&dir.path().join(format!("restored{s}"))).unwrap();
            let stores: [&mut dyn KeyedStore; 2] = [&mut memory, &mut arena];
            for store in stores {
                check_store(store, &saved).unwrap();
                load_store(store, &saved).unwrap();
                let again = save_store(store).unwrap();
                assert_eq!((by_key(&again, "a"), by_key(&again, "b")), (a.clone(), by_key(&saved, "b")));
                let next = store.insert(row("a", 9), false);
                assert!(handles.iter().all(|&h| next > h), "{next:#x} after {handles:x?}");
                assert!(store.remove(row("a", 0).key_hash, handles[4]).is_some_and(|r| r.row.ts == 4));
                assert!(matches!(check_store(store, &saved), Err(SnapshotError::Mismatch { .. })));
            }
            let mut twice = saved.clone();
            twice.rows.push(saved.rows[0]);
            twice.archives.extend_from_slice(&saved.archives[..saved.rows[0].len as usize]);
            assert!(matches!(check_store(&MemoryStore::default(), &twice), Err(SnapshotError::Decode(_))));
            let mut short = saved.clone();
            short.archives.pop();
            assert!(matches!(check_store(&MemoryStore::default(), &short), Err(SnapshotError::Decode(_))));
            let mut damaged = saved.clone();
            damaged.archives[..saved.rows[0].len as usize].fill(0xFF);
            let mut memory = MemoryStore::default();
            check_store(&memory, &damaged).unwrap();
            assert!(matches!(load_store(&mut memory, &damaged), Err(SnapshotError::Decode(_))), "not a row");
        }
    }
}
