//! The receiver's data path, opened for the sender's hello once the sender has proven its key
//! (its first sealed frame opened: [`DataDoor::open`]): one UDP socket per channel (and a TCP
//! listener for the race), or one TCP listener for parallel TCP; the set-up machine that
//! answers the hello with their ports (`HelloAck`, sealed); and what it told the sender it can
//! take in.
//!
//! Nothing here is opened for a peer that has not proven the key: a stranger costs no socket.

use super::capacity::Capacity;
use super::OwnPorts;
use crate::error::SessionError;
use crate::net::udp::UdpChannel;
use hurtle_proto::session::{HelloParams, Intake, ReceiverLimits, ReceiverSetup};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// What the front door needs to open a session's data path.
#[derive(Debug, Clone)]
pub struct DataDoor {
    /// Ports this receiver listens on (its data ports must never be dialled as its own).
    pub(super) own_ports: Arc<OwnPorts>,
    /// What this receiver can absorb, measured once.
    pub(super) capacity: Arc<OnceLock<Capacity>>,
    /// What it allows.
    pub(super) limits: ReceiverLimits,
    /// Bind the channel sockets to every address, not the control connection's: datagrams
    /// may come through a relay, to an address the relayed control connection does not have.
    pub(super) any_ip: bool,
}

/// The receiving ends of a session's data path.
pub(super) enum DataIn {
    /// One socket per channel, and the listener for the sender's TCP data connections if it
    /// may move the channels there.
    Udp(Vec<UdpChannel>, Option<TcpListener>),
    /// The listener the sender's data connections come to.
    Tcp(TcpListener),
}

/// A data path opened for a hello, with the set-up machine that answered it.
pub struct Opened {
    pub(super) data_in: DataIn,
    /// The set-up, its `HelloAck` taken and sent.
    pub(super) setup: ReceiverSetup,
    /// What binding the sockets warned about (buffers smaller than asked for).
    pub(super) warnings: Vec<String>,
    /// What this receiver can absorb with the session's channels.
    pub(super) capacity: Capacity,
    /// Keeps the TCP listener's port among the receiver's own while the session lasts.
    pub(super) _port: Option<OwnPort>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("hello", &self.setup.hello())
            .finish_non_exhaustive()
    }
}

/// A port listed in [`OwnPorts`] while this lives.
#[derive(Debug)]
pub(super) struct OwnPort(Arc<OwnPorts>, u16);

impl Drop for OwnPort {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

impl DataDoor {
    /// Opens the data path for `hello` on `local_ip` (the control connection's address) and
    /// answers it: the returned set-up has queued its `HelloAck`.
    pub fn open(&self, local_ip: IpAddr, hello: HelloParams) -> Result<Opened, SessionError> {
        let channels = hello.channels;
        let mut warnings = Vec::new();
        let tcp_listener = || -> Result<(TcpListener, OwnPort), SessionError> {
            let l = TcpListener::bind(SocketAddr::new(local_ip, 0))
                .map_err(|e| SessionError::io("TCP data listener", e))?;
            let port = l
                .local_addr()
                .map_err(|e| SessionError::io("TCP data listener", e))?
                .port();
            self.own_ports.add(port);
            Ok((l, OwnPort(self.own_ports.clone(), port)))
        };
        let (data_in, ports, race_port, port) = if hello.tcp {
            let (l, guard) = tcp_listener()?;
            let ports = vec![guard.1; usize::from(channels)];
            (DataIn::Tcp(l), ports, None, Some(guard))
        } else {
            let udp_ip = match local_ip {
                IpAddr::V4(_) if self.any_ip => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(_) if self.any_ip => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                ip => ip,
            };
            let udps = UdpChannel::bind_channels(udp_ip, channels, &mut warnings)?;
            let ports = udps.iter().map(|u| u.local_addr().port()).collect();
            let (fallback, guard) = if hello.race {
                let (l, guard) = tcp_listener()?;
                (Some(l), Some(guard))
            } else {
                (None, None)
            };
            let race_port = guard.as_ref().map(|g| g.1);
            (DataIn::Udp(udps, fallback), ports, race_port, guard)
        };
        let capacity = self
            .capacity
            .get_or_init(super::measure_capacity)
            .for_channels(channels);
        // Each socket's receive buffer as granted (the smallest), and what was asked for.
        let (recv_buffer, recv_buffer_wanted) = match &data_in {
            DataIn::Udp(udps, _) => (
                udps.iter()
                    .map(|u| u.granted_recv_buffer())
                    .min()
                    .unwrap_or(0) as u64,
                udps.iter()
                    .map(|u| u.requested_recv_buffer())
                    .max()
                    .unwrap_or(0) as u64,
            ),
            DataIn::Tcp(_) => (0, 0),
        };
        let intake = Intake {
            ceiling_bps: capacity.ceiling_bps,
            recv_buffer,
            recv_buffer_wanted,
        };
        let mut setup = ReceiverSetup::new(hello, Instant::now());
        setup
            .accept(ports, race_port, intake, Instant::now())
            .map_err(SessionError::Setup)?;
        Ok(Opened {
            data_in,
            setup,
            warnings,
            capacity,
            _port: port,
        })
    }
}

#[cfg(test)]
impl DataDoor {
    /// A door for tests: no ports of its own, capacity unknown, up to 8 channels.
    pub(crate) fn for_tests() -> DataDoor {
        DataDoor {
            own_ports: Arc::default(),
            capacity: Arc::new(OnceLock::from(Capacity::UNKNOWN)),
            limits: ReceiverLimits { max_channels: 8 },
            any_ip: false,
        }
    }
}
