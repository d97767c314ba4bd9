//! CPU time used so far, by this process or by the calling thread: what a figure of cost reads
//! when the machine is shared (wall time then counts other processes' work too).

use std::time::Duration;

/// CPU time (user + system) this process has used, all threads; zero where it cannot be read.
pub fn process() -> Duration {
    read(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time (user + system) the calling thread has used; zero where it cannot be read.
pub fn thread() -> Duration {
    read(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn read(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable `timespec` for the duration of the call.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    match (rc, u64::try_from(ts.tv_sec), u32::try_from(ts.tv_nsec)) {
        (0, Ok(secs), Ok(nanos)) => Duration::new(secs, nanos),
        _ => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_grows_with_work() {
        let (process, thread) = (super::process(), super::thread());
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(super::thread() > thread && super::process() > process, "{x}");
    }
}
