//! What the receiver can absorb ([`Capacity`], PA-UDP's rate ceiling): its hashing rate per
//! core, measured once in CPU time ([`measure_capacity`]), times the threads its channels get
//! ([`receive_threads`]) or its cgroup's CPU quota if that is less.

use serde::Serialize;
use std::time::{Duration, Instant};

/// What the receiver can absorb, measured once (PA-UDP's rate ceiling).
///
/// Only hashing is measured, in CPU time. The destination's write rate is not: a one-off sample
/// is only as good as the moment it was taken (a disk sampled while another big file is written
/// back looks several times slower than it is, and that ceiling would hold the whole transfer;
/// a small sample of tmpfs read twice as fast in one run as in the next), and the transfer
/// measures it all along instead: a disk's writer queue, or a receiving thread that
/// writes slowly and so reads its socket slowly, shows as backlog in every report.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Capacity {
    /// BLAKE3 rate of one core, bits per second of CPU time.
    pub hash_bps: u64,
    /// Threads that can hash at once (channels, at most the cores).
    pub threads: u64,
    /// The CPU quota of this process's cgroup, in cores, if it has one.
    pub cpu_quota: Option<f64>,
    /// The ceiling offered to senders: 90% of hashing, on the threads or within the CPU quota
    /// if that is less.
    pub ceiling_bps: u64,
}

impl Capacity {
    /// No measurement: no ceiling.
    pub(super) const UNKNOWN: Capacity = Capacity {
        hash_bps: 0,
        threads: 0,
        cpu_quota: None,
        ceiling_bps: 0,
    };

    /// The capacity of a session with `channels` channels, from what [`measure_capacity`] saw.
    pub(super) fn for_channels(self, channels: u16) -> Capacity {
        if self.hash_bps == 0 {
            return Capacity::UNKNOWN;
        }
        let threads = receive_threads(channels) as u64;
        let cpus = self
            .cpu_quota
            .map_or(threads as f64, |q| q.min(threads as f64));
        Capacity {
            threads,
            ceiling_bps: (self.hash_bps as f64 * cpus * 0.9) as u64,
            ..self
        }
    }
}

/// Threads receiving `channels` channels: one per channel, at most one per core (but enough
/// that none waits on more sockets than one `poll` watches).
pub(super) fn receive_threads(channels: u16) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    usize::from(channels)
        .clamp(1, cores)
        .max(usize::from(channels).div_ceil(crate::net::udp::MAX_WAIT_FDS))
}

/// Measures this machine's BLAKE3 rate per core (in CPU time, so a CPU quota does not distort
/// it) and the CPU quota. A session's threads and ceiling follow from these and its channel
/// count.
pub fn measure_capacity() -> Capacity {
    const MIB: usize = 1 << 20;
    let buf = vec![0x5au8; MIB];
    let (c0, t1) = (crate::cpu::thread_time(), Instant::now());
    let cpu = || crate::cpu::thread_time().saturating_sub(c0);
    let mut rounds = 0u64;
    // 20 ms of CPU time; the wall-clock bound only matters if the CPU clock does not work.
    while rounds < 4 || (cpu() < Duration::from_millis(20) && t1.elapsed() < Duration::from_secs(1))
    {
        std::hint::black_box(blake3::hash(&buf));
        rounds += 1;
    }
    let hash_secs = match cpu() {
        Duration::ZERO => t1.elapsed(),
        c => c,
    }
    .as_secs_f64()
    .max(1e-6);
    Capacity {
        hash_bps: (rounds as f64 * MIB as f64 * 8.0 / hash_secs) as u64,
        threads: 0,
        cpu_quota: crate::cpu::quota_cores(),
        ceiling_bps: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_scales_hashing_by_the_cpu_quota() {
        let measured = Capacity {
            hash_bps: 8_000_000_000,
            threads: 0,
            cpu_quota: None,
            ceiling_bps: 0,
        };
        let free = measured.for_channels(1);
        assert_eq!(free.threads, 1);
        assert_eq!(free.ceiling_bps, 7_200_000_000, "90% of one core's hashing");
        let quota = Capacity {
            cpu_quota: Some(0.25),
            ..measured
        }
        .for_channels(1);
        assert_eq!(
            quota.ceiling_bps, 1_800_000_000,
            "90% of a quarter core's hashing"
        );
        let unknown = Capacity {
            hash_bps: 0,
            ..measured
        }
        .for_channels(4);
        assert_eq!(unknown.ceiling_bps, 0, "nothing measured: no ceiling");
    }
}
