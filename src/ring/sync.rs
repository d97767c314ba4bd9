//! The ring's shared memory — its counters and its frame bytes — behind one small type,
//! [`Region`], so the publication protocol can be model-checked with loom.
//!
//! - **Normal builds** (and every build but a loom test build): `counter` is a std [`AtomicU64`]
//!   over the counter's 8 bytes inside the mapping, and `write` / `read` / `with_slice` are plain
//!   pointer copies into the mapped frame area. Everything is `#[inline]` and the same code as
//!   before the shim: no extra checks outside `debug_assert!`.
//! - **`cfg(all(test, braid_loom))`** (`RUSTFLAGS="--cfg braid_loom" cargo test --lib ring::loom`):
//!   the counters are `loom` atomics and the frame area is a heap buffer whose every 16-byte block
//!   (the unit frames are made of) has a `loom::cell::UnsafeCell<()>` beside it. Each byte
//!   access first takes loom's read or write guard on every block it touches and holds it for the
//!   whole copy (or, for `with_slice`, while the caller looks at the slice). Loom then panics with
//!   "Causality violation" whenever the producer and the consumer touch one block without a
//!   happens-before edge between them — exactly what a missing Release/Acquire pair would allow.
//!   The bytes themselves stay one contiguous buffer, so the ring's code is the same in both
//!   builds (payloads are still handed out as `&[u8]` in place).
//!
//! The loom side is compiled only into test builds because loom is a dev-dependency (the cfg
//! alone would also change a `cargo build`, which has no dev-dependencies). In such a build loom
//! objects exist only inside `loom::model`, so file-backed rings ([`Ring::create`],
//! [`Ring::open`]) still compile — other modules' tests call them — but cannot run: a loom build
//! runs the `ring::loom` tests only.
//!
//! [`Ring::create`]: super::Ring::create
//! [`Ring::open`]: super::Ring::open

#[cfg(not(all(test, braid_loom)))]
pub(super) use mapped::Region;
#[cfg(not(all(test, braid_loom)))]
pub(super) use std::sync::Arc;
#[cfg(not(all(test, braid_loom)))]
pub(super) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(all(test, braid_loom))]
pub(super) use loom::sync::Arc;
#[cfg(all(test, braid_loom))]
pub(super) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(all(test, braid_loom))]
pub(super) use modelled::Region;

#[cfg(not(all(test, braid_loom)))]
mod mapped {
    use super::AtomicU64;
    use crate::ring::FRAMES_AT;
    use crate::storage::mapped_file::MappedFile;

    /// The ring's memory: its mapped file.
    pub(in crate::ring) struct Region {
        file: MappedFile,
    }

    impl Region {
        pub(in crate::ring) fn new(file: MappedFile) -> Region {
            Region { file }
        }

        pub(in crate::ring) fn file(&self) -> &MappedFile {
            &self.file
        }

        /// The counter at byte `at` of the data region (TAIL_AT, HEAD_AT, CAPACITY_AT, FLAGS_AT or ROOM_WANTED_AT).
        #[inline]
        pub(in crate::ring) fn counter(&self, at: usize) -> &AtomicU64 {
            debug_assert!(at + 8 <= FRAMES_AT && at.is_multiple_of(8));
            // SAFETY: `at` is one of TAIL_AT, HEAD_AT, CAPACITY_AT, FLAGS_AT, ROOM_WANTED_AT: 8-byte slots inside the first
            // FRAMES_AT bytes of the data region, which is 16-byte aligned (storage::mapped_file::MappedFile::data_ptr)
            // and lives as long as `self`. Every access to these bytes goes through this atomic.
            unsafe { AtomicU64::from_ptr(self.file.data_ptr().add(at).cast::<u64>()) }
        }

        /// Pointer to byte `off` of the frame area.
        #[inline]
        fn frame_ptr(&self, off: usize, len: usize) -> *mut u8 {
            debug_assert!(FRAMES_AT + off + len <= self.file.data_len());
            // SAFETY: callers pass `off + len` ≤ the frame area's length (the contract of the
            // unsafe methods below), and the frame area ends where the data region ends.
            unsafe { self.file.data_ptr().add(FRAMES_AT + off) }
        }

        /// Copies `src` into the frame area at `off`.
        ///
        /// # Safety
        /// `[off, off + src.len())` lies inside the frame area and no other thread reads or writes
        /// it during the call (the protocol gives these bytes to the caller).
        #[inline]
        pub(in crate::ring) unsafe fn write(&self, off: usize, src: &[u8]) {
            // SAFETY: in bounds and unshared for the call, by this function's contract; `src` is a
            // distinct borrow, so the two ranges cannot overlap.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.frame_ptr(off, src.len()), src.len()) }
        }

        /// Copies the frame area at `off` into `dst`.
        ///
        /// # Safety
        /// `[off, off + dst.len())` lies inside the frame area and no other thread writes it
        /// during the call.
        #[inline]
        pub(in crate::ring) unsafe fn read(&self, off: usize, dst: &mut [u8]) {
            // SAFETY: in bounds and not written concurrently, by this function's contract; `dst`
            // is a distinct exclusive borrow.
            unsafe { std::ptr::copy_nonoverlapping(self.frame_ptr(off, dst.len()), dst.as_mut_ptr(), dst.len()) }
        }

        /// Lends `[off, off + len)` of the frame area to `f` in place (zero copy).
        ///
        /// # Safety
        /// `[off, off + len)` lies inside the frame area and no other thread writes it until `f`
        /// returns.
        #[inline]
        pub(in crate::ring) unsafe fn with_slice<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            // SAFETY: in bounds and not written while the slice lives (it cannot escape `f`), by
            // this function's contract; mapped memory is initialised (zeroed at creation).
            f(unsafe { std::slice::from_raw_parts(self.frame_ptr(off, len), len) })
        }

        /// Frees the whole pages of `[off, off + len)` of the frame area (`MappedFile::give_back`).
        /// The caller holds no frame there and writes nothing there before `take_back`.
        pub(in crate::ring) fn give_back(&self, off: usize, len: usize) -> std::io::Result<()> {
            self.file.give_back(FRAMES_AT + off, len)
        }

        /// Allocates again what `give_back` freed of `[off, off + len)`.
        pub(in crate::ring) fn take_back(&self, off: usize, len: usize) -> std::io::Result<()> {
            self.file.take_back(FRAMES_AT + off, len)
        }
    }
}

#[cfg(all(test, braid_loom))]
mod modelled {
    use loom::cell::UnsafeCell;

    use super::AtomicU64;
    use crate::ring::{CAPACITY_AT, FLAGS_AT, FRAME_HEADER, FRAMES_AT, HEAD_AT, ROOM_WANTED_AT, TAIL_AT};
    use crate::storage::mapped_file::MappedFile;

    /// The ring's memory under loom: modelled counters and a tracked heap buffer.
    pub(in crate::ring) struct Region {
        tail: AtomicU64,
        head: AtomicU64,
        capacity: AtomicU64,
        flags: AtomicU64,
        room_wanted: AtomicU64,
        /// `len` bytes from `Box::into_raw`, freed in `Drop`.
        bytes: *mut u8,
        len: usize,
        /// One access tracker per FRAME_HEADER-byte block of `bytes`.
        blocks: Box<[UnsafeCell<()>]>,
        /// Kept only so that the file-backed constructors compile (module doc).
        file: Option<MappedFile>,
    }

    impl Region {
        /// A zeroed frame area of `len` bytes (a multiple of FRAME_HEADER) and zeroed counters.
        pub(in crate::ring) fn heap(len: usize) -> Region {
            let bytes = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
            let blocks = (0..len / FRAME_HEADER).map(|_| UnsafeCell::new(())).collect();
            let zero = || AtomicU64::new(0);
            Region {
                tail: zero(),
                head: zero(),
                capacity: zero(),
                flags: zero(),
                room_wanted: zero(),
                bytes,
                len,
                blocks,
                file: None,
            }
        }

        /// Compiles, never runs (module doc): loom's atomics panic outside `loom::model`.
        pub(in crate::ring) fn new(file: MappedFile) -> Region {
            let len = file.data_len().saturating_sub(FRAMES_AT) / FRAME_HEADER * FRAME_HEADER;
            let mut region = Region::heap(len);
            region.file = Some(file);
            region
        }

        pub(in crate::ring) fn file(&self) -> &MappedFile {
            self.file.as_ref().expect("a loom ring has no file")
        }

        pub(in crate::ring) fn counter(&self, at: usize) -> &AtomicU64 {
            match at {
                TAIL_AT => &self.tail,
                HEAD_AT => &self.head,
                CAPACITY_AT => &self.capacity,
                FLAGS_AT => &self.flags,
                ROOM_WANTED_AT => &self.room_wanted,
                _ => panic!("no counter at {at}"),
            }
        }

        fn blocks(&self, off: usize, len: usize) -> &[UnsafeCell<()>] {
            assert!(off + len <= self.len, "[{off}, {}) outside the frame area", off + len);
            &self.blocks[off / FRAME_HEADER..(off + len).div_ceil(FRAME_HEADER)]
        }

        /// As in the mapped `Region`; loom checks the "no other thread" part.
        ///
        /// # Safety
        /// As in the mapped `Region`.
        pub(in crate::ring) unsafe fn write(&self, off: usize, src: &[u8]) {
            let _writing: Vec<_> = self.blocks(off, src.len()).iter().map(UnsafeCell::get_mut).collect();
            // SAFETY: in bounds (asserted by `blocks`); loom's write guards on every block make
            // any unordered access by the other thread a reported violation.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.bytes.add(off), src.len()) }
        }

        /// # Safety
        /// As in the mapped `Region`.
        pub(in crate::ring) unsafe fn read(&self, off: usize, dst: &mut [u8]) {
            let _reading: Vec<_> = self.blocks(off, dst.len()).iter().map(UnsafeCell::get).collect();
            // SAFETY: in bounds (asserted by `blocks`); loom's read guards report an unordered
            // write by the other thread.
            unsafe { std::ptr::copy_nonoverlapping(self.bytes.add(off), dst.as_mut_ptr(), dst.len()) }
        }

        /// # Safety
        /// As in the mapped `Region`.
        pub(in crate::ring) unsafe fn with_slice<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            let _reading: Vec<_> = self.blocks(off, len).iter().map(UnsafeCell::get).collect();
            // SAFETY: in bounds (asserted by `blocks`) and initialised; the read guards live until
            // `f` returns, and the slice cannot outlive `f`.
            f(unsafe { std::slice::from_raw_parts(self.bytes.add(off), len) })
        }

        /// Zeroes `[off, off + len)` under write guards, as a punched hole reads: loom reports
        /// a give-back that touches bytes the consumer may still read.
        pub(in crate::ring) fn give_back(&self, off: usize, len: usize) -> std::io::Result<()> {
            let _writing: Vec<_> = self.blocks(off, len).iter().map(UnsafeCell::get_mut).collect();
            // SAFETY: in bounds (asserted by `blocks`), under write guards as in `write`.
            unsafe { std::ptr::write_bytes(self.bytes.add(off), 0, len) };
            Ok(())
        }

        /// Heap bytes are always there.
        pub(in crate::ring) fn take_back(&self, _off: usize, _len: usize) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            let slice = std::ptr::slice_from_raw_parts_mut(self.bytes, self.len);
            // SAFETY: `bytes` and `len` came from `Box::into_raw` of a boxed slice in `heap`, and
            // this is the only place that frees it.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}
