//! How much CPU this process has: the CPU clock of a thread, and the CPU quota of its cgroup.
//!
//! A receiver in a container or a `systemd` slice with a CPU quota can absorb far less than its
//! cores suggest, and a quota distorts short wall-clock measurements (Linux charges kernel work
//! to the quota when it returns to user space, so a measurement of a few milliseconds may run
//! unthrottled and pay afterwards). The receiver therefore times its hashing test in CPU time
//! and scales the result by the quota it reads here.

use std::time::Duration;

/// CPU time used by the calling thread so far (zero where the clock is not available).
pub fn thread_time() -> Duration {
    crate::sys::clock::clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The CPU quota of this process's cgroup (the tightest along its path), in cores; `None`
/// without a quota or outside Linux cgroups.
pub fn quota_cores() -> Option<f64> {
    let table = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: String| std::fs::read_to_string(p).ok();
    let mut best: Option<f64> = None;
    let mut take = |q: Option<f64>| {
        if let Some(q) = q {
            best = Some(best.map_or(q, |b| b.min(q)));
        }
    };
    for (v2, path) in cgroup_paths(&table) {
        for dir in ancestors(&path) {
            if v2 {
                take(read(format!("/sys/fs/cgroup{dir}/cpu.max")).and_then(|s| parse_cpu_max(&s)));
            } else {
                for mount in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
                    let quota = read(format!("{mount}{dir}/cpu.cfs_quota_us"));
                    let period = read(format!("{mount}{dir}/cpu.cfs_period_us"));
                    if let (Some(q), Some(p)) = (quota, period) {
                        take(parse_cfs(&q, &p));
                        break;
                    }
                }
            }
        }
    }
    best
}

/// The cgroup paths that can carry a CPU quota, from `/proc/self/cgroup`: the v2 path (`true`)
/// and the v1 `cpu` controller's path (`false`).
fn cgroup_paths(table: &str) -> Vec<(bool, String)> {
    table
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if !path.starts_with('/') {
                return None;
            }
            if id == "0" && controllers.is_empty() {
                Some((true, path.to_string()))
            } else if controllers.split(',').any(|c| c == "cpu") {
                Some((false, path.to_string()))
            } else {
                None
            }
        })
        .collect()
}

/// `/a/b` -> `/a/b`, `/a`, `` (the root, as an empty suffix of the mount point).
fn ancestors(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut p = path.trim_end_matches('/').to_string();
    loop {
        out.push(p.clone());
        match p.rfind('/') {
            Some(i) if !p.is_empty() => p.truncate(i),
            _ => break,
        }
    }
    out
}

/// cgroup v2 `cpu.max`: `"max 100000"` (no quota) or `"<quota> <period>"`, in microseconds.
fn parse_cpu_max(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let (quota, period) = (it.next()?, it.next().unwrap_or("100000"));
    ratio(quota.parse().ok()?, period.parse().ok()?)
}

/// cgroup v1: `cpu.cfs_quota_us` (`-1`: no quota) and `cpu.cfs_period_us`.
fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    ratio(quota.trim().parse().ok()?, period.trim().parse().ok()?)
}

fn ratio(quota: i64, period: i64) -> Option<f64> {
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quotas() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("garbage"), None);
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("1000\n", "30000\n"), Some(1000.0 / 30000.0));
        assert_eq!(parse_cfs("1000", "0"), None);
    }

    #[test]
    fn finds_cpu_paths_of_both_versions() {
        let v1 = "4:memory:/x\n2:cpuacct:/\n1:cpu:/hurtle-ratectl-7\n0::/\n";
        assert_eq!(
            cgroup_paths(v1),
            vec![
                (false, "/hurtle-ratectl-7".to_string()),
                (true, "/".to_string())
            ]
        );
        let combined = "3:cpu,cpuacct:/system.slice/a.service\n";
        assert_eq!(
            cgroup_paths(combined),
            vec![(false, "/system.slice/a.service".to_string())]
        );
        assert!(cgroup_paths("nonsense\n1:cpu:relative\n").is_empty());
    }

    #[test]
    fn walks_up_to_the_root() {
        assert_eq!(ancestors("/a/b"), vec!["/a/b", "/a", ""]);
        assert_eq!(ancestors("/"), vec![""]);
    }

    #[test]
    fn cpu_clocks_advance_with_work() {
        // The wall clock starts first, so it has seen at least as much as the thread's clock.
        let wall = std::time::Instant::now();
        let t0 = thread_time();
        let mut x = 0u64;
        while thread_time().saturating_sub(t0) < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
            assert!(
                wall.elapsed() < Duration::from_secs(10),
                "thread CPU clock stands still"
            );
        }
        // A thread's CPU time cannot run far ahead of the wall clock. In a VM the two clocks
        // come from different sources (the scheduler's clock against the monotonic one) and
        // CI saw them differ by a little, so the check allows a quarter.
        assert!(
            wall.elapsed() >= Duration::from_millis(15),
            "20 ms of CPU time in {:?} of wall time",
            wall.elapsed()
        );
    }
}
