//! The few system calls linkem needs that std does not wrap: attaching to a
//! TUN device, waiting on a descriptor with a nanosecond timeout, timer
//! slack, and synchronous signal handling. All `unsafe` in the crate lives
//! here, each call with the reasoning that makes it sound.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// `TUNSETIFF` = `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Open `/dev/net/tun` and attach to (or create) the layer-3 TUN device
/// `name` without packet-information headers, in non-blocking mode. With
/// `vnet_hdr`, every read and write carries a `virtio_net_hdr` in front of
/// the packet (`IFF_VNET_HDR`; see [`crate::gso`]).
pub fn open_tun(name: &str, vnet_hdr: bool) -> Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        bail!(
            "bad TUN device name {name:?} (1..{} bytes)",
            libc::IFNAMSIZ - 1
        );
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .context("open /dev/net/tun (needs root or CAP_NET_ADMIN)")?;
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    let vnet = if vnet_hdr { libc::IFF_VNET_HDR } else { 0 };
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI | vnet) as libc::c_short;
    // SAFETY: the fd is open and owned by `file`; `req` is a valid,
    // NUL-terminated ifreq that outlives the call, as TUNSETIFF expects.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("TUNSETIFF {name}"));
    }
    set_nonblocking(&file)?;
    Ok(file)
}

fn set_nonblocking(f: &File) -> Result<()> {
    let fd = f.as_raw_fd();
    // SAFETY: fcntl on an open descriptor with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error()).context("F_GETFL");
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error()).context("F_SETFL O_NONBLOCK");
    }
    Ok(())
}

/// Wait until `f` is readable or `timeout` elapses (nanosecond resolution,
/// subject to timer slack). Returns `true` if readable. EINTR counts as a
/// timeout.
pub fn wait_readable(f: &File, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd, a valid timespec, and a null sigmask
    // pointer (keep the current mask), all outliving the call.
    let rc = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    rc > 0 && (pfd.revents & libc::POLLIN) != 0
}

/// Set this thread's timer slack so short sleeps wake close to on time.
pub fn set_timer_slack_ns(ns: u64) {
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer; failure is harmless.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}

/// Give the calling thread real-time FIFO priority `prio` (1..=99), so a
/// forwarding thread wakes on time even when the tools it carries keep both
/// cores busy. The kernel's RT throttling still reserves 5% for others.
pub fn set_fifo_priority(prio: i32) -> Result<()> {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pid 0 = calling thread; `param` is valid for the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("sched_setscheduler(SCHED_FIFO)");
    }
    Ok(())
}

fn stop_signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Block SIGINT/SIGTERM/SIGHUP in the calling thread (and so in every
/// thread spawned after), so they can be taken with [`wait_stop_signal`].
pub fn block_stop_signals() -> Result<()> {
    let set = stop_signal_set();
    // SAFETY: valid set pointer, null old-set pointer.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        bail!("pthread_sigmask failed: {rc}");
    }
    Ok(())
}

/// Wait up to `timeout` for a blocked stop signal; returns its number.
pub fn wait_stop_signal(timeout: Duration) -> Option<i32> {
    let set = stop_signal_set();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timespec; a null siginfo pointer is allowed.
    let rc = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
    (rc > 0).then_some(rc)
}
