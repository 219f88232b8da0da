//! The socket calls that std, socket2 and quinn-udp do not make for the UDP channels
//! ([`crate::net::udp`]): waiting on several sockets at once (`poll`), a GSO send gathered
//! from iovecs (`sendmsg` with `UDP_SEGMENT`), `sendmmsg`, and the receive queue's counters
//! (`getsockopt(SO_MEMINFO)`).

use std::{
    io, mem,
    os::fd::{AsRawFd, BorrowedFd},
    ptr,
    time::Duration,
};

/// Most datagrams per `sendmmsg` call on the fallback path (the same as the kernel's GSO limit).
pub(crate) const MMSG_BATCH: usize = 64;

/// Most file descriptors one [`wait_readable`](crate::net::udp::wait_readable) call watches.
pub const MAX_WAIT_FDS: usize = 64;

/// Waits until `fd` is ready for `events` (`POLLIN`/`POLLOUT`), an error is pending, or
/// `timeout` passes (`None`: no limit). The caller retries its operation either way.
pub(crate) fn wait(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout: Option<Duration>,
) -> io::Result<()> {
    wait_any([Some(fd)], events, timeout).map(|_| ())
}

/// Waits until one of `fds` has one of `events` (the first
/// [`MAX_WAIT_FDS`]; `None` entries are not watched), or `timeout`
/// passes. Returns which have them, or an error or hang-up: bit `i` for the `i`th of `fds`.
pub(crate) fn wait_any<'a>(
    fds: impl IntoIterator<Item = Option<BorrowedFd<'a>>>,
    events: libc::c_short,
    timeout: Option<Duration>,
) -> io::Result<u64> {
    let ms = match timeout {
        None => -1,
        Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int,
    };
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX_WAIT_FDS];
    // poll(2) skips entries with a negative fd, so `None` stays -1.
    let mut n = 0;
    for (p, fd) in pfds.iter_mut().zip(fds) {
        if let Some(fd) = fd {
            p.fd = fd.as_raw_fd();
            p.events = events;
        }
        n += 1;
    }
    // SAFETY: `pfds` is an array of valid pollfds that lives across the call, and nfds is
    // at most its length.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        return Ok(0);
    }
    Ok(pfds[..n]
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .fold(0, |ready, (i, _)| ready | 1 << i))
}

/// An iovec for the kernel to read `piece` from.
pub(crate) fn iovec(piece: &[u8]) -> libc::iovec {
    libc::iovec {
        iov_base: piece.as_ptr() as *mut libc::c_void,
        iov_len: piece.len(),
    }
}

/// Sends one GSO `sendmsg` gathering `iovs` (header and payload pieces, datagram after
/// datagram), cut by the kernel into datagrams of `segment_size` bytes (`UDP_SEGMENT`), to
/// `dest` (`None`: a connected socket's peer).
pub(crate) fn sendmsg_segmented(
    fd: BorrowedFd<'_>,
    dest: Option<&socket2::SockAddr>,
    iovs: &[libc::iovec],
    segment_size: usize,
) -> io::Result<()> {
    /// Room for one control message carrying a u16, aligned as `cmsghdr` needs.
    #[repr(C, align(8))]
    struct Control([u8; 32]);
    let mut control = Control([0; 32]);
    let segment = u16::try_from(segment_size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
    // SAFETY: msghdr is a plain C struct; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    if let Some(dest) = dest {
        msg.msg_name = dest.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = dest.len();
    }
    msg.msg_iov = iovs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iovs.len() as _;
    msg.msg_control = control.0.as_mut_ptr() as *mut libc::c_void;
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(mem::size_of::<u16>() as u32) } as _;
    // SAFETY: msg_control points at `control`, which is larger than CMSG_SPACE(2) and
    // aligned for cmsghdr, so CMSG_FIRSTHDR is non-null and the header and its 2 data
    // bytes lie inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(mem::size_of::<u16>() as u32) as _;
        ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut u16, segment);
    }
    // SAFETY: `msg` points at `dest`, `iovs` (whose pieces the caller keeps alive) and
    // `control`, all alive until the call returns; the kernel only reads them.
    let rc = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sends one datagram per `per_msg` consecutive `iovs` (the pieces the kernel gathers
/// into it), for up to [`MMSG_BATCH`] datagrams, with one `sendmmsg` to `dest` (`None`: a
/// connected socket's peer); returns how many went out.
pub(crate) fn sendmmsg(
    fd: BorrowedFd<'_>,
    dest: Option<&socket2::SockAddr>,
    iovs: &[libc::iovec],
    per_msg: usize,
) -> io::Result<usize> {
    // SAFETY: mmsghdr is a plain C struct; all zeroes is a valid value (null pointers, zero
    // lengths).
    let mut msgs: [libc::mmsghdr; MMSG_BATCH] = unsafe { mem::zeroed() };
    let mut count = 0;
    for (msg, pieces) in msgs.iter_mut().zip(iovs.chunks(per_msg.max(1))) {
        if let Some(dest) = dest {
            msg.msg_hdr.msg_name = dest.as_ptr() as *mut libc::c_void;
            msg.msg_hdr.msg_namelen = dest.len();
        }
        msg.msg_hdr.msg_iov = pieces.as_ptr() as *mut libc::iovec;
        msg.msg_hdr.msg_iovlen = pieces.len() as _;
        count += 1;
    }
    if count == 0 {
        return Ok(0);
    }
    // SAFETY: the first `count` headers point at `dest` and into `iovs` (whose pieces the
    // caller keeps alive), all alive until the call returns; the kernel only reads them
    // (and writes msg_len).
    let rc = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), count as libc::c_uint, 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// `SO_MEMINFO`, on Linux where it has the asm-generic number (not on alpha, mips, parisc
/// or sparc, which number it differently).
const SO_MEMINFO: Option<libc::c_int> = if cfg!(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "powerpc64",
        target_arch = "s390x"
    )
)) {
    Some(55)
} else {
    None
};
/// Indices into the `SO_MEMINFO` array (`SK_MEMINFO_*` in linux/sock_diag.h; kernel ABI).
const RMEM_ALLOC: usize = 0;
const RCVBUF: usize = 1;
const DROPS: usize = 8;

/// The socket's memory counters (`SO_MEMINFO`, Linux 4.6+; the drop counter since 4.11):
/// `(receive queue bytes, receive buffer limit, drops)`, in the kernel's own accounting
/// (queued bytes include each packet's overhead, the limit is what `SO_RCVBUF` granted).
/// `None` where the option or the drop counter is missing.
pub(crate) fn meminfo(fd: BorrowedFd<'_>) -> Option<(u64, u64, u64)> {
    let option = SO_MEMINFO?;
    // SK_MEMINFO_VARS is 9 today; ask for more so a newer kernel's longer array fits.
    let mut info = [0u32; 16];
    let mut len = mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes, and the kernel writes at most that many
    // and stores the length it wrote in `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let words = len as usize / mem::size_of::<u32>();
    (rc == 0 && words > DROPS).then(|| {
        (
            u64::from(info[RMEM_ALLOC]),
            u64::from(info[RCVBUF]),
            u64::from(info[DROPS]),
        )
    })
}

/// The lowest round trip the kernel measured on a TCP connection (`TCP_INFO`'s `tcpi_min_rtt`,
/// Linux 4.6+): from its handshake on, over the acknowledgements, with no application in the
/// loop. `None` where the kernel does not say (another system, an older kernel, no sample).
#[cfg(target_os = "linux")]
pub(crate) fn tcp_min_rtt(fd: BorrowedFd<'_>) -> Option<Duration> {
    // SAFETY: `tcp_info` is plain integers, valid when zeroed.
    let mut info: libc::tcp_info = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes, and the kernel writes at most that many
    // and stores the length it wrote in `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            ptr::addr_of_mut!(info).cast(),
            &mut len,
        )
    };
    let end = mem::offset_of!(libc::tcp_info, tcpi_min_rtt) + mem::size_of::<u32>();
    // The kernel's "no sample yet" is all ones.
    (rc == 0 && len as usize >= end && info.tcpi_min_rtt != 0 && info.tcpi_min_rtt != u32::MAX)
        .then(|| Duration::from_micros(u64::from(info.tcpi_min_rtt)))
}

/// [`tcp_min_rtt`] where the kernel does not say: never.
#[cfg(not(target_os = "linux"))]
pub(crate) fn tcp_min_rtt(_fd: BorrowedFd<'_>) -> Option<Duration> {
    None
}
