//! The session's data links: the data key's openers for each channel ([`DataKeys`]), and the
//! sender's TCP data connections, admitted by their greeting ([`accept_data_connections`]).

use crate::error::SessionError;
use crate::net::link::{read_greeting, LinkIn, TcpFrames};
use hurtle_proto::secure::{DataKey, PacketOpen};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long the receiver waits for the sender's TCP data connections.
const DATA_CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Accepts the sender's `channels` TCP data connections, each opened by its greeting. Connections
/// from another host, with another session id or a channel out of range are closed.
pub(super) fn accept_data_connections(
    listener: &TcpListener,
    session: u64,
    channels: u16,
    peer_ip: IpAddr,
    data: &DataKeys,
) -> Result<Vec<LinkIn>, SessionError> {
    let deadline = Instant::now() + DATA_CONNECT_WAIT;
    listener
        .set_nonblocking(true)
        .map_err(|e| SessionError::io("TCP data listener", e))?;
    let mut slots: Vec<Option<TcpStream>> = (0..channels).map(|_| None).collect();
    while slots.iter().any(Option::is_none) {
        if Instant::now() > deadline {
            return Err(SessionError::DataConnectionsLate(
                DATA_CONNECT_WAIT.as_secs(),
            ));
        }
        match listener.accept() {
            Ok((mut s, from)) => {
                if from.ip().to_canonical() != peer_ip.to_canonical() {
                    continue;
                }
                let _ = s.set_nonblocking(false);
                match read_greeting(&mut s, &data.key, Duration::from_secs(5)) {
                    Some((sess, ch))
                        if sess == session
                            && usize::from(ch) < slots.len()
                            && slots[usize::from(ch)].is_none() =>
                    {
                        let _ = s.set_nodelay(true);
                        slots[usize::from(ch)] = Some(s);
                    }
                    _ => {}
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(SessionError::io("accept TCP data connection", e)),
        }
    }
    slots
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(ch, s)| {
            TcpFrames::new(s)
                .map(|frames| LinkIn::tcp(frames, data.opener(ch as u16)))
                .map_err(|e| SessionError::io("TCP data connection", e))
        })
        .collect()
}

/// The session's data key, and whether data frames are sealed with it.
pub(super) struct DataKeys {
    pub(super) key: DataKey,
    pub(super) encrypt: bool,
}

impl DataKeys {
    /// The opener of `channel`'s frames (`None`: they come in the clear).
    pub(super) fn opener(&self, channel: u16) -> Option<PacketOpen> {
        self.encrypt.then(|| self.key.opener(channel))
    }
}
