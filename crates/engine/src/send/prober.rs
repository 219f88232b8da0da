//! Probing the path beside the data: the driver of the core's [`PayloadProbe`] ([`Prober`],
//! which sends its probes from clones of the channel sockets), and applying what it decides
//! ([`probe_step`]): another payload for the data, or UDP blocked.

use super::shared::Shared;
use crate::error::SessionError;
use crate::netlog::NetLog;
use hurtle_proto::probe::{PayloadProbe, ProbeDecision};
use hurtle_proto::secure::{PacketNumbers, PacketSeal, TAG_LEN};
use hurtle_proto::wire::{Header, Kind, HEADER_LEN};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The driver of [`PayloadProbe`]: sends its probe datagrams from clones of the channels'
/// sockets (the channel threads own the sockets themselves), beside the data.
pub(super) struct Prober {
    pub(super) probe: PayloadProbe,
    pub(super) socks: Vec<std::net::UdpSocket>,
    pub(super) dests: Vec<SocketAddr>,
    pub(super) session: u32,
    /// The probes' packet numbers, counted from
    /// [`secure::PROBE_PACKETS`](hurtle_proto::secure::PROBE_PACKETS) (a space of its own: a
    /// probe never shares a nonce with data).
    pub(super) packets: PacketNumbers,
    pub(super) seal: Option<PacketSeal>,
}

impl Prober {
    /// Sends the probes that are due. A size the local interface refuses (`EMSGSIZE`: the
    /// sockets set don't-fragment) is dropped; any other failure is a probe lost on the way.
    pub(super) fn send_due(&mut self, now: Instant) {
        let mut buf = vec![0u8; HEADER_LEN + usize::from(self.probe.max_payload()) + TAG_LEN];
        for (ch, payload) in self.probe.to_send(now) {
            let (Some(sock), Some(dest)) = (
                self.socks.get(usize::from(ch)),
                self.dests.get(usize::from(ch)),
            ) else {
                continue;
            };
            let size = HEADER_LEN + usize::from(payload);
            // The probes' numbers run out only after 2^47 probes (a round is a few per
            // channel): never, but a probe not sent is only a probe lost.
            let Ok(packet) = self.packets.next_number() else {
                return;
            };
            Header {
                kind: Kind::Probe,
                flags: 0,
                channel: ch,
                session: self.session,
                packet,
                file: 0,
                offset: size as u64,
                len: payload,
                sent_us: 0,
            }
            .encode(&mut buf[..size]);
            let size = match &mut self.seal {
                // A number refused (the probes' numbers only go up) is a probe not sent.
                Some(seal) => match seal.seal(&mut buf[..size + TAG_LEN]) {
                    Ok(()) => size + TAG_LEN,
                    Err(_) => return,
                },
                None => size,
            };
            if let Err(e) = crate::net::punch::send_to(sock, &buf[..size], *dest) {
                if e.raw_os_error() == Some(libc::EMSGSIZE) {
                    self.probe.on_too_big(payload);
                }
            }
        }
    }
}

/// Applies what probing decided: another payload for the data from now on, or UDP blocked.
/// `delivered`: the receiver has reported data.
pub(super) fn probe_step(
    p: &mut Prober,
    shared: &Shared,
    delivered: bool,
    log: &mut NetLog,
) -> Result<(), SessionError> {
    match p.probe.poll(Instant::now(), delivered) {
        Some(ProbeDecision::UsePayload(payload)) => {
            shared.payload.store(payload, Ordering::Relaxed);
            log.line(|| format!("payload {payload}: the largest size the path carried"));
            Ok(())
        }
        Some(ProbeDecision::Blocked { channel, after }) => Err(SessionError::UdpBlocked {
            channel,
            secs: after.as_secs(),
        }),
        None => Ok(()),
    }
}
