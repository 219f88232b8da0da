//! How the sender opens its TCP connections (control, and parallel-TCP data): directly, or through
//! something else, such as a relay that splices the connection to the receiver.

use std::fmt::Debug;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Opens the sender's TCP connections to the receiver. The engine asks for the control
/// connection to the receiver's address, then for each TCP data connection to the same IP and
/// a port the receiver named; a dialer may reach them any way it likes.
pub trait Dialer: Debug + Send + Sync {
    /// Opens a connection to `addr` (the receiver's IP and port as the engine knows them).
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream>;

    /// True when only TCP can get through this way (datagrams are not forwarded): the session
    /// then uses the parallel-TCP transport.
    fn tcp_only(&self) -> bool {
        false
    }
}

/// Plain `connect` with a timeout.
#[derive(Debug, Default, Clone, Copy)]
pub struct Direct;

impl Dialer for Direct {
    fn dial(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        TcpStream::connect_timeout(&addr, timeout)
    }
}
