//! The session's data links: the data key's openers for each channel ([`DataKeys`]), and the
//! sender's TCP data connections, admitted by their greeting ([`accept_data_connections`]).

use crate::error::{SessionError, Side};
use crate::net::channel_link::{read_greeting, LinkIn, TcpFrames};
use hurtle_proto::secure::{DataKey, PacketOpen};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// How long the receiver waits for the sender's TCP data connections.
const DATA_CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Accepts the sender's `channels` TCP data connections, each opened by its greeting. Connections
/// from another host, with another session id or a channel out of range are closed.
pub(super) fn accept_data_connections(
    listener: &TcpListener,
    session: u32,
    channels: u16,
    peer_ip: IpAddr,
    data: &DataKeys,
    control: BorrowedFd<'_>,
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
                // A sender that gave up (its data connections could not be dialled) closes
                // its control connection: no use waiting out the deadline.
                if hung_up(control) {
                    return Err(SessionError::PeerGone { peer: Side::Sender });
                }
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

/// Whether the peer closed (or reset) the connection on `fd`, without reading from it.
fn hung_up(fd: BorrowedFd<'_>) -> bool {
    crate::sys::socket::wait_any([Some(fd)], libc::POLLRDHUP, Some(Duration::ZERO))
        .is_ok_and(|ready| ready != 0)
}

/// The session's data key, and whether data frames are sealed with it.
pub(super) struct DataKeys {
    pub(super) key: DataKey,
    pub(super) encrypt: bool,
    /// The key of the feedback datagrams ([`crate::net::feedback`]).
    pub(super) feedback: DataKey,
    /// The key of hole punching ([`crate::net::punch`]).
    pub(super) punch: [u8; 32],
}

impl DataKeys {
    /// The opener of `channel`'s frames (`None`: they come in the clear).
    pub(super) fn opener(&self, channel: u16) -> Option<PacketOpen> {
        self.encrypt.then(|| self.key.opener(channel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A session's data keys, from a key agreement on loopback; and its control connection's
    /// two ends (sender's, receiver's).
    fn session() -> (DataKeys, TcpStream, TcpStream) {
        let (got, s, r) = crate::handshake::testing::agreed("7-a-b");
        let data = DataKeys {
            key: got.keys.data,
            encrypt: true,
            feedback: got.keys.feedback,
            punch: got.keys.punch,
        };
        (data, s, r)
    }

    #[test]
    fn a_sender_that_hangs_up_ends_the_wait_for_its_data_connections() {
        let (data, sender_control, receiver_control) = session();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let hang_up = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(sender_control);
        });
        let t0 = Instant::now();
        let got = accept_data_connections(
            &listener,
            1,
            2,
            "127.0.0.1".parse().unwrap(),
            &data,
            receiver_control.as_fd(),
        );
        let waited = t0.elapsed();
        hang_up.join().unwrap();
        assert!(
            matches!(got, Err(SessionError::PeerGone { peer: Side::Sender })),
            "{:?}",
            got.err()
        );
        // Noticed at once, not after the deadline.
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
    }

    #[test]
    fn a_losing_connect_attempt_closed_empty_is_skipped_at_once() {
        let (data, _sender_control, receiver_control) = session();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        // The sender's losing attempt for channel 0, closed before a byte; then the winner.
        let loser = TcpStream::connect(to).unwrap();
        loser.shutdown(std::net::Shutdown::Both).unwrap();
        let mut winner = TcpStream::connect(to).unwrap();
        std::io::Write::write_all(
            &mut winner,
            &crate::net::channel_link::greeting(&data.key, 1, 0),
        )
        .unwrap();
        let t0 = Instant::now();
        let got = accept_data_connections(
            &listener,
            1,
            1,
            "127.0.0.1".parse().unwrap(),
            &data,
            receiver_control.as_fd(),
        );
        assert_eq!(got.map(|l| l.len()).ok(), Some(1));
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_sender_still_there_is_waited_for_until_the_deadline_or_its_connections() {
        let (data, _sender_control, receiver_control) = session();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        // A stranger's connection with a bad greeting is skipped; nothing else comes.
        let _stranger = TcpStream::connect(to).unwrap();
        let t0 = Instant::now();
        let got = accept_data_connections(
            &listener,
            1,
            1,
            "127.0.0.2".parse().unwrap(),
            &data,
            receiver_control.as_fd(),
        );
        assert!(matches!(got, Err(SessionError::DataConnectionsLate(10))));
        assert!(t0.elapsed() >= DATA_CONNECT_WAIT);
    }
}
