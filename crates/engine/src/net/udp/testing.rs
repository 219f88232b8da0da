//! Helpers for the folder's tests: channel options, a pair of loopback channels, and a
//! stream of numbered datagrams to check what arrives.

use super::{ChannelOptions, UdpChannel, UdpError};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub(super) fn opts() -> ChannelOptions {
    ChannelOptions {
        read_timeout: Some(Duration::from_millis(200)),
        ..ChannelOptions::default()
    }
}

/// Datagram `seq` of the test stream: the sequence number, then bytes that differ per
/// datagram and per position.
pub(super) fn datagram(seq: u32, len: usize, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend((0..len).map(|i| (seq as usize * 131 + i * 7 + (i >> 8)) as u8));
    let n = len.min(4);
    out[start..start + n].copy_from_slice(&seq.to_le_bytes()[..n]);
}

pub(super) fn expected(seq: u32, len: usize) -> Vec<u8> {
    let mut v = Vec::new();
    datagram(seq, len, &mut v);
    v
}

/// Binds a pair of channels on `ip`, or `None` (with a message) if `ip` cannot be bound.
pub(super) fn pair(ip: IpAddr, sender: &ChannelOptions) -> Option<(UdpChannel, UdpChannel)> {
    let a = match UdpChannel::bind(SocketAddr::new(ip, 0), sender) {
        Ok(a) => a,
        Err(UdpError::Bind { addr, source }) if ip.is_ipv6() => {
            println!("skipping: cannot bind {addr} ({source}); IPv6 disabled?");
            return None;
        }
        Err(e) => panic!("bind: {e}"),
    };
    let b = UdpChannel::bind(SocketAddr::new(ip, 0), &opts()).expect("bind receiver");
    Some((a, b))
}
