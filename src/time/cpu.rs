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

/// Context switches of this process so far, all threads: (voluntary — a thread slept —,
/// involuntary — the scheduler took the core —); zeros where they cannot be read.
pub fn context_switches() -> (u64, u64) {
    // SAFETY: `rusage` is plain integers, for which all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage` for the duration of the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    match (rc, u64::try_from(usage.ru_nvcsw), u64::try_from(usage.ru_nivcsw)) {
        (0, Ok(voluntary), Ok(involuntary)) => (voluntary, involuntary),
        _ => (0, 0),
    }
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

    #[test]
    fn a_sleep_is_a_voluntary_context_switch() {
        let (voluntary, _) = super::context_switches();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(super::context_switches().0 > voluntary);
    }
}
