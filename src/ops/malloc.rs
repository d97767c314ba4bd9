//! glibc's malloc, told to keep large buffers out of its heaps.
//!
//! glibc serves an allocation above its mmap threshold (128 KiB at first) with a mapping of its
//! own, returned to the kernel when it is freed; but each such buffer freed raises the threshold
//! to its size, up to 32 MiB. A checkpoint copies a shard's stored rows into heap buffers of
//! megabytes every second, so after the first ones those buffers came from the thread's heap
//! instead and stayed resident once freed: `braid run`'s anonymous memory climbed in 2 MiB steps
//! and held there (BENCHMARKS.md "Memory at 10 k devices"). A fixed threshold keeps every large
//! buffer a mapping of its own, given back when freed; the price is a few page faults per
//! checkpoint.

/// glibc's initial mmap threshold, made fixed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Fixes malloc's mmap threshold (glibc only; other C libraries keep their own rules). Call it
/// at the start of `main`, before any thread.
pub fn keep_large_buffers_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt(3) only changes malloc's tuning parameters; it takes a valid parameter
    // and value (M_MMAP_THRESHOLD at most HEAP_MAX / 2) and no pointers. Its return value
    // (1: set) needs no handling: if glibc ever refused, malloc keeps its default behaviour.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}
