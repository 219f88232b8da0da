//! Drives either side's set-up machine ([`hurtle_proto::session`]) over the control
//! connection: sends what it queues, waits for the peer until its deadline, and turns its
//! errors into [`SessionError`]s. The decisions themselves (which sockets, which files) stay
//! with the side's driver, which acts on each event this returns.

use crate::error::{SessionError, Side};
use crate::net::control::{ControlError, ControlTx, Incoming};
use hurtle_proto::session::{Setup, SetupError, SETUP_TIMEOUT};
use hurtle_proto::wire::Control;
use std::time::Instant;

/// One side's set-up over its control connection; `peer` names the other side in errors.
pub(crate) struct Driver<'a, S> {
    pub(crate) machine: S,
    rx: &'a Incoming,
    tx: &'a ControlTx,
    peer: Side,
}

impl<'a, S: Setup> Driver<'a, S> {
    pub(crate) fn new(machine: S, rx: &'a Incoming, tx: &'a ControlTx, peer: Side) -> Self {
        Driver {
            machine,
            rx,
            tx,
            peer,
        }
    }

    /// Sends whatever the machine queued.
    fn flush(&mut self) {
        while let Some(m) = self.machine.poll_transmit() {
            // A closed writer shows as the reader's error on the next wait.
            let _ = self.tx.send(m);
        }
    }

    /// Runs `act` on the machine (the driver's answer to an event), then sends what it queued,
    /// errors included (a refusal's reply reaches the peer before the error returns).
    pub(crate) fn act<T>(
        &mut self,
        act: impl FnOnce(&mut S) -> Result<T, SetupError>,
    ) -> Result<T, SessionError> {
        let result = act(&mut self.machine);
        self.flush();
        result.map_err(|e| setup_error(e, self.peer))
    }

    /// A message that came before the driver started waiting (the greeting's first one).
    pub(crate) fn take(&mut self, msg: Control) -> Result<(), SessionError> {
        self.act(|m| m.handle(msg, Instant::now()))
    }

    /// The next event, waiting for the peer's messages as long as the machine allows.
    pub(crate) fn next(&mut self) -> Result<S::Event, SessionError> {
        self.next_beside(&crossbeam_channel::never::<()>(), |_| Ok(()))
    }

    /// [`Driver::next`], handing what arrives on `beside` meanwhile to `on_beside` (the
    /// sender's channel threads, whose early data runs during the set-up).
    pub(crate) fn next_beside<T>(
        &mut self,
        beside: &crossbeam_channel::Receiver<T>,
        mut on_beside: impl FnMut(T) -> Result<(), SessionError>,
    ) -> Result<S::Event, SessionError> {
        let never = crossbeam_channel::never();
        let mut beside = beside;
        loop {
            self.flush();
            if let Some(ev) = self.machine.poll_event() {
                return Ok(ev);
            }
            let deadline = self
                .machine
                .poll_timeout()
                .unwrap_or_else(|| Instant::now() + SETUP_TIMEOUT);
            let timeout = crossbeam_channel::at(deadline);
            crossbeam_channel::select! {
                recv(self.rx) -> msg => match msg {
                    Ok(Ok(msg)) => self.take(msg)?,
                    Ok(Err(e)) => return Err(e.into()),
                    // The reader ended without an error of its own.
                    Err(_) => return Err(ControlError::Closed.into()),
                },
                recv(beside) -> item => match item {
                    Ok(item) => on_beside(item)?,
                    // Its senders are gone: nothing more comes that way.
                    Err(_) => beside = &never,
                },
                recv(timeout) -> _ => self.act(|m| m.handle_timeout(Instant::now()))?,
            }
        }
    }
}

/// A set-up error as the session reports it: the peer's own `Abort` or `Reject` in its words,
/// a refusal and an incompatible peer as they always were, a silent peer as the control
/// connection's timeout, and a broken rule of the protocol as [`SessionError::Setup`].
pub(crate) fn setup_error(e: SetupError, peer: Side) -> SessionError {
    match e {
        SetupError::Unexpected { got, wanted } => SessionError::unexpected(peer, *got, wanted),
        SetupError::PeerAborted { cause, reason } => SessionError::PeerAborted {
            peer,
            cause,
            reason,
        },
        SetupError::Incompatible { .. } => SessionError::Incompatible(e.to_string()),
        SetupError::Refused { path, reason } => SessionError::Refused { path, reason },
        SetupError::Layout(l) => SessionError::Layout(l),
        SetupError::Timeout(d) => ControlError::Timeout(d).into(),
        other => SessionError::Setup(other),
    }
}

/// An event the machine gives only in another order: a bug in the driver or the machine,
/// reported as such instead of acted on.
pub(crate) fn out_of_order(event: impl std::fmt::Debug, when: &'static str) -> SessionError {
    tracing::debug!("set-up event {event:?} {when}");
    SessionError::Setup(SetupError::Driver(when))
}
