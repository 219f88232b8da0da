//! The clock std does not read: a CPU-time clock (`clock_gettime`), for [`crate::cpu`].

use std::time::Duration;

/// The time of clock `id` (`CLOCK_THREAD_CPUTIME_ID` and the like); zero where the clock is
/// not available.
pub(crate) fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}
