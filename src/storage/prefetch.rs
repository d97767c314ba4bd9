//! A hint to the CPU: fetch a cache line now, to be read soon. A shard that wakes after a sleep
//! finds a key's stored rows out of its caches, each where it was appended; asked for together
//! before the first is read, their misses overlap instead of following one another
//! (`ArenaStore::scan_key`; BENCHMARKS.md, 29th session). Only x86_64 has it here: elsewhere the
//! call does nothing.

/// Asks the CPU to bring the cache line that holds `byte` into its caches. It reads nothing the
/// program sees, so any byte will do, however cold.
#[inline(always)]
pub fn prefetch(byte: &u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is unsafe only for its `#[target_feature(enable = "sse")]`, and SSE is
    // part of every x86_64 target. A prefetch is a hint: it neither faults nor changes memory.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(std::ptr::from_ref(byte).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = byte;
}
