//! The receiver's data path: one UDP socket per channel (and a TCP listener for the race), or
//! one TCP listener for parallel TCP; the set-up machine that answers the sender's hello with
//! their ports (`HelloAck`, sealed); and what it told the sender it can take in.
//!
//! The receiver opens a set of them *ahead*, before any connection ([`DataDoor::open_ahead`]:
//! at bind, and again each time it starts waiting for a sender): as many UDP sockets as the
//! channels it allows, and one TCP listener. A greeting whose hello they fit borrows them
//! ([`DataDoor::lend`]) and sends their ports sealed in the flight of the key agreement's
//! answer, so that the sender's first data leaves two round trips after its connect; only a
//! peer holding the secret can open that `HelloAck`. A greeting that fails gives them back
//! ([`Lent`] does on drop), so a stranger costs no socket; the first sender to prove its key
//! keeps them. Whatever reached them before they were lent (nobody was told their ports yet)
//! is dropped unread when they are lent. A greeting that finds the set taken or too small
//! (greetings that overlap, a `--serve` receiver whose set a session took) opens its data path
//! only once the sender's first sealed frame proved the key ([`DataDoor::open`]), and answers
//! then: its first data leaves a round trip later.
//!
//! A greeting borrows as many of the set's UDP sockets as its hello's channels, and the
//! listener if it races or asks for parallel TCP; what it does not take stays for the next
//! greeting. The set serves connections to the control listener's address, or, for a listener
//! on every address (`0.0.0.0`, `::`), to any address of its family: its sockets are bound
//! there too (a relayed receiver's UDP sockets always are). A receiver whose limit on open
//! descriptors is low opens nothing ahead (`DESCRIPTORS_KEPT`).

use super::capacity::Capacity;
use super::OwnPorts;
use crate::error::SessionError;
use crate::net::udp::UdpChannel;
use hurtle_proto::session::{HelloParams, Intake, ReceiverLimits, ReceiverSetup};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// How many datagrams (or queued connections) a socket lent from the set opened ahead drops
/// unread at most: what strangers sent there before anyone was told its port.
const DRAIN_AT_MOST: usize = 1 << 16;

/// Descriptors left for everything else (greetings, a session's files and connections) when
/// the set is opened ahead: a receiver whose limit leaves less opens none, and opens each data
/// path once its sender proved its key.
const DESCRIPTORS_KEPT: u64 = 256;

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
    /// The data path opened ahead of any connection, lent to greetings.
    pub(super) ahead: Arc<Mutex<Ahead>>,
}

/// Sockets opened before any connection, for the next sender's data path.
#[derive(Default)]
pub(super) struct Ahead {
    /// The control listener's address they serve (unspecified: every address).
    ip: Option<IpAddr>,
    udps: Vec<UdpChannel>,
    listener: Option<(TcpListener, OwnPort)>,
    /// What binding the UDP sockets warned about.
    warnings: Vec<String>,
}

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead")
            .field("ip", &self.ip)
            .field("udps", &self.udps.len())
            .field("listener", &self.listener.as_ref().map(|l| l.1 .1))
            .finish()
    }
}

/// A data path opened for a greeting: borrowed from the set opened ahead (given back when
/// dropped, unless `Lent::keep` took it for a proven sender), or opened for it.
pub struct Lent {
    opened: Option<Opened>,
    /// Where it goes back to, and the address that set serves; none if opened for this hello.
    from: Option<(Arc<Mutex<Ahead>>, IpAddr)>,
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent")
            .field("opened", &self.opened)
            .field("ahead", &self.from.is_some())
            .finish()
    }
}

impl Lent {
    /// A data path opened for its hello alone.
    pub(super) fn own(opened: Opened) -> Lent {
        Lent {
            opened: Some(opened),
            from: None,
        }
    }

    /// Whether it was borrowed from the set opened ahead.
    pub fn was_ahead(&self) -> bool {
        self.from.is_some()
    }

    /// The set-up's answer to the hello (`HelloAck`), taken once.
    pub(super) fn answer(&mut self) -> Option<hurtle_proto::wire::Control> {
        self.opened.as_mut()?.setup.poll_transmit()
    }

    /// Keeps it for the session of a sender that proved its key.
    pub(super) fn keep(mut self) -> Opened {
        match self.opened.take() {
            Some(o) => o,
            None => unreachable!("a Lent holds its data path until kept"),
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let (Some(opened), Some((ahead, ip))) = (self.opened.take(), self.from.take()) else {
            return;
        };
        let mut a = lock(&ahead);
        if a.ip != Some(ip) {
            return;
        }
        match opened.data_in {
            DataIn::Udp(udps, listener) => {
                a.udps.extend(udps);
                if let (Some(l), Some(port)) = (listener, opened._port) {
                    a.listener = Some((l, port));
                }
            }
            DataIn::Tcp(l) => {
                if let Some(port) = opened._port {
                    a.listener = Some((l, port));
                }
            }
        }
    }
}

fn lock(ahead: &Mutex<Ahead>) -> MutexGuard<'_, Ahead> {
    ahead.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether sockets opened ahead for a listener on `bound` serve a connection that came to
/// `local`: the same address, or every address of its family (not an IPv4 peer on an IPv6
/// listener).
fn serves(bound: IpAddr, local: IpAddr) -> bool {
    match (bound, local) {
        _ if bound == local => true,
        (IpAddr::V4(b), IpAddr::V4(_)) => b.is_unspecified(),
        (IpAddr::V6(b), IpAddr::V6(l)) => b.is_unspecified() && l.to_ipv4_mapped().is_none(),
        _ => false,
    }
}

/// Drops unread what came to a socket lent from the set opened ahead before anyone was told
/// its port.
fn drain_udp(u: &UdpChannel) {
    let Ok(s) = u.try_clone_socket() else { return };
    // The channel's socket is non-blocking already; the clone shares that.
    let _ = s.set_nonblocking(true);
    let mut buf = [0u8; 2048];
    for _ in 0..DRAIN_AT_MOST {
        if s.recv(&mut buf).is_err() {
            break;
        }
    }
}

/// Closes what waits in a lent listener's queue (connections made before anyone was told its
/// port).
fn drain_listener(l: &TcpListener) {
    if l.set_nonblocking(true).is_err() {
        return;
    }
    for _ in 0..DRAIN_AT_MOST {
        if l.accept().is_err() {
            break;
        }
    }
    let _ = l.set_nonblocking(false);
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
    /// Opens, for a listener on `ip`, what the set opened ahead lacks: a UDP socket for each
    /// channel this receiver allows, and a TCP listener. Nothing is opened for a connection:
    /// this runs when the receiver starts waiting. Nothing is opened either when the limit on
    /// open descriptors would leave fewer than `DESCRIPTORS_KEPT` for the rest.
    pub fn open_ahead(&self, ip: IpAddr) -> Result<(), SessionError> {
        let (udps, listener) = {
            let mut a = lock(&self.ahead);
            if a.ip != Some(ip) {
                *a = Ahead {
                    ip: Some(ip),
                    ..Ahead::default()
                };
            }
            let want = usize::from(
                self.limits
                    .max_channels
                    .clamp(1, hurtle_proto::layout::MAX_CHANNELS),
            );
            (want.saturating_sub(a.udps.len()), a.listener.is_none())
        };
        if udps == 0 && !listener {
            return Ok(());
        }
        let limit = crate::sys::fs::raise_open_file_limit().unwrap_or(0);
        if limit < DESCRIPTORS_KEPT + udps as u64 + 1 {
            tracing::debug!(
                "no data path opened ahead: {limit} descriptors allowed, fewer than {} more",
                DESCRIPTORS_KEPT
            );
            return Ok(());
        }
        let mut warnings = Vec::new();
        let udps = self.bind_udp(ip, u16::try_from(udps).unwrap_or(u16::MAX), &mut warnings)?;
        let listener = if listener {
            Some(self.tcp_listener(ip)?)
        } else {
            None
        };
        let mut a = lock(&self.ahead);
        if a.ip == Some(ip) {
            a.udps.extend(udps);
            if a.listener.is_none() {
                a.listener = listener;
            }
            for w in warnings {
                if !a.warnings.contains(&w) {
                    a.warnings.push(w);
                }
            }
        }
        Ok(())
    }

    /// Lends a greeting on a connection to `local_ip` what its `hello` needs of the set opened
    /// ahead, with the set-up that answered the hello (its `HelloAck` still to take); none if
    /// the set does not serve that address or lacks sockets (another greeting holds them, a
    /// session took them).
    pub fn lend(&self, local_ip: IpAddr, hello: HelloParams) -> Option<Lent> {
        let ahead = self.ahead.clone();
        let (ip, data_in, ports, race_port, port, warnings) = {
            let mut a = lock(&ahead);
            let ip = a.ip.filter(|&ip| serves(ip, local_ip))?;
            let udps = if hello.tcp {
                0
            } else {
                usize::from(hello.channels)
            };
            let listener = hello.tcp || hello.race;
            if a.udps.len() < udps || (listener && a.listener.is_none()) {
                return None;
            }
            let at = a.udps.len() - udps;
            let udps: Vec<UdpChannel> = a.udps.drain(at..).collect();
            let (l, port) = match listener {
                true => a.listener.take().map(|(l, p)| (Some(l), Some(p)))?,
                false => (None, None),
            };
            let listening = port.as_ref().map(|p| p.1);
            let (data_in, ports, race_port) = match l {
                Some(l) if hello.tcp => {
                    let p = listening.unwrap_or(0);
                    (DataIn::Tcp(l), vec![p; usize::from(hello.channels)], None)
                }
                l => {
                    let ports = udps.iter().map(|u| u.local_addr().port()).collect();
                    (DataIn::Udp(udps, l), ports, listening)
                }
            };
            (ip, data_in, ports, race_port, port, a.warnings.clone())
        };
        match &data_in {
            DataIn::Udp(udps, l) => {
                udps.iter().for_each(drain_udp);
                if let Some(l) = l {
                    drain_listener(l);
                }
            }
            DataIn::Tcp(l) => drain_listener(l),
        }
        let lent = |opened| Lent {
            opened: Some(opened),
            from: Some((ahead.clone(), ip)),
        };
        match self.answer(hello, (data_in, ports, race_port, port), warnings) {
            Ok(opened) => Some(lent(opened)),
            Err((e, back)) => {
                tracing::debug!("the data path opened ahead cannot answer this hello: {e}");
                drop(back.map(|o| lent(*o)));
                None
            }
        }
    }

    /// `channels` sockets for a control connection that came to `local_ip`: on every address
    /// of both families (dual-stack) when datagrams may come through a relay and the control
    /// connection is IPv4 (so that a path to this host's IPv6 addresses may be punched,
    /// `crate::net::punch`), else as [`udp_ip`](Self::udp_ip) says.
    fn bind_udp(
        &self,
        local_ip: IpAddr,
        channels: u16,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<UdpChannel>, crate::net::udp::UdpError> {
        if self.any_ip && local_ip.is_ipv4() {
            return UdpChannel::bind_channels_dual_stack(channels, warnings);
        }
        UdpChannel::bind_channels(self.udp_ip(local_ip), channels, warnings)
    }

    fn udp_ip(&self, local_ip: IpAddr) -> IpAddr {
        match local_ip {
            IpAddr::V4(_) if self.any_ip => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) if self.any_ip => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            ip => ip,
        }
    }

    fn tcp_listener(&self, ip: IpAddr) -> Result<(TcpListener, OwnPort), SessionError> {
        let l = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| SessionError::io("TCP data listener", e))?;
        let port = l
            .local_addr()
            .map_err(|e| SessionError::io("TCP data listener", e))?
            .port();
        self.own_ports.add(port);
        Ok((l, OwnPort(self.own_ports.clone(), port)))
    }

    /// Opens the data path for `hello` on `local_ip` (the control connection's address) and
    /// answers it: the returned set-up has queued its `HelloAck`. Only for a sender that
    /// proved its key, whose hello the set opened ahead could not serve.
    pub fn open(&self, local_ip: IpAddr, hello: HelloParams) -> Result<Opened, SessionError> {
        let channels = hello.channels;
        let mut warnings = Vec::new();
        let (data_in, ports, race_port, port) = if hello.tcp {
            let (l, guard) = self.tcp_listener(local_ip)?;
            let ports = vec![guard.1; usize::from(channels)];
            (DataIn::Tcp(l), ports, None, Some(guard))
        } else {
            let udps = self.bind_udp(local_ip, channels, &mut warnings)?;
            let ports = udps.iter().map(|u| u.local_addr().port()).collect();
            let (fallback, guard) = if hello.race {
                let (l, guard) = self.tcp_listener(local_ip)?;
                (Some(l), Some(guard))
            } else {
                (None, None)
            };
            let race_port = guard.as_ref().map(|g| g.1);
            (DataIn::Udp(udps, fallback), ports, race_port, guard)
        };
        self.answer(hello, (data_in, ports, race_port, port), warnings)
            .map_err(|(e, _)| e)
    }

    /// The set-up's answer to `hello` with this data path, and what it can take in; on failure
    /// the data path comes back.
    fn answer(
        &self,
        hello: HelloParams,
        (data_in, ports, race_port, port): (DataIn, Vec<u16>, Option<u16>, Option<OwnPort>),
        warnings: Vec<String>,
    ) -> Result<Opened, (SessionError, Option<Box<Opened>>)> {
        let channels = hello.channels;
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
        let accepted = setup.accept(ports, race_port, intake, Instant::now());
        let opened = Opened {
            data_in,
            setup,
            warnings,
            capacity,
            _port: port,
        };
        match accepted {
            Ok(()) => Ok(opened),
            Err(e) => Err((SessionError::Setup(e), Some(Box::new(opened)))),
        }
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
            ahead: Arc::default(),
        }
    }

    /// The ports of the set opened ahead, as it is now: its UDP sockets' and its listener's.
    pub(crate) fn ahead_ports(&self) -> (Vec<u16>, Option<u16>) {
        let a = lock(&self.ahead);
        let mut udps: Vec<u16> = a.udps.iter().map(|u| u.local_addr().port()).collect();
        udps.sort_unstable();
        (udps, a.listener.as_ref().map(|l| l.1 .1))
    }
}
