//! The sender's set-up: hello (sent by the key agreement) and manifest out at once, the
//! receiver's parameters and decisions in, the files to skip out if it asked about any, and
//! [`Agreed`] for the data phase; before the decisions, [`SenderSetup::provisional`] for the
//! early data.

use super::{entry_bytes, files, keeps_early, parts, Agreed, SetupError, Skipped, SETUP_TIMEOUT};
use crate::layout::MAX_CHANNELS;
use crate::rate::bottleneck::BufferCap;
use crate::wire::{
    Control, Decision, Entry, EntryKind, CAP_CHECKSUM, CAP_DELETE, CAP_DRY_RUN, CAP_RACE,
    CAP_TCP_DATA, VERSION,
};
use std::collections::VecDeque;
use std::time::Instant;

/// What the sender proposes in its hello.
#[derive(Debug, Clone)]
pub struct SenderParams {
    /// Channels offered (at least 1 is asked for).
    pub channels: u16,
    /// Largest payload the sender wants.
    pub payload: u16,
    /// Block size.
    pub block_size: u64,
    /// Session id (random, odd).
    pub session: u32,
    /// Data over parallel TCP instead of UDP.
    pub tcp: bool,
    /// Data over UDP, with the channels moved to TCP data connections in the same session if
    /// nothing gets through (`--transport auto`; ignored with `tcp`).
    pub race: bool,
    /// Compare existing files by hash, never by size and time alone.
    pub checksum: bool,
}

/// The receiver's answer to the hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// One data port per channel (all the same for TCP data).
    pub ports: Vec<u16>,
    /// Largest payload the receiver takes.
    pub max_payload: u16,
    /// What the receiver can absorb, bit/s (0 = unknown).
    pub rate_ceiling: u64,
    /// The receiver's socket buffers, when the kernel granted less than it asked for.
    pub buffer_cap: Option<BufferCap>,
    /// The port for TCP data connections if UDP does not get through (asked for with
    /// [`SenderParams::race`]).
    pub tcp_port: Option<u16>,
}

impl Accepted {
    /// The agreed channel count.
    pub fn channels(&self) -> u16 {
        self.ports.len().min(usize::from(MAX_CHANNELS)) as u16
    }
}

/// What the sender's driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderEvent {
    /// The receiver took the hello: open the data path (bind UDP and start probing, or dial
    /// the TCP data connections) while it decides on the manifest.
    Accepted(Accepted),
    /// A probe datagram arrived at the receiver.
    ProbeAck {
        /// Channel.
        channel: u16,
        /// Datagram size.
        size: u16,
    },
    /// The receiver has a file of this one's size: hash ours and give the hash to
    /// [`SenderSetup::hashed`].
    HashWanted {
        /// File id.
        file: u32,
    },
    /// The set-up is done (and `Skip` queued if the receiver offered files it has); take the
    /// outcome with [`SenderSetup::agreed`].
    Ready,
}

#[derive(Debug)]
enum State {
    /// Hello and manifest sent; waiting for `HelloAck`.
    AwaitAck,
    /// Waiting for `ManifestReply` parts.
    AwaitReply,
    /// Hashing the files the receiver has (`asked`: it offered some, so `Skip` follows).
    Hashing {
        pending: usize,
        asked: bool,
    },
    /// Done (or failed): only probe acks and keep-alives are taken now.
    Ready,
    Failed,
}

/// The sender's set-up machine. See the [module docs](super).
#[derive(Debug)]
pub struct SenderSetup {
    params: SenderParams,
    entries: Vec<Entry>,
    state: State,
    transmits: VecDeque<Control>,
    events: VecDeque<SenderEvent>,
    deadline: Instant,
    accepted: Option<Accepted>,
    /// Per file: the receiver's hash where it offered one, and whether it may be replaced.
    offers: Vec<Option<([u8; 32], bool)>>,
    skips: Vec<Skipped>,
    resumed: Vec<Vec<(u64, u64)>>,
    agreed: Option<Agreed>,
    /// The reply's parts so far.
    decisions: Vec<Decision>,
    /// Every file is sent whole: the early data counts ([`Agreed::early`]).
    early: bool,
    /// A dry run ([`SenderSetup::dry_run`]).
    dry_run: bool,
    /// A mirror ([`SenderSetup::mirror`]).
    mirror: bool,
}

impl SenderSetup {
    /// Starts the set-up: the whole manifest is queued at once, to go as soon as the key
    /// agreement is done; the hello ([`SenderSetup::hello`]) goes before, with the agreement.
    pub fn new(params: SenderParams, entries: Vec<Entry>, now: Instant) -> SenderSetup {
        let mut transmits = VecDeque::new();
        let parts = parts(&entries, entry_bytes);
        let n_parts = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            transmits.push_back(Control::Manifest {
                entries: part.to_vec(),
                last: i + 1 == n_parts,
            });
        }
        let n_files = files(&entries).count();
        SenderSetup {
            params,
            entries,
            state: State::AwaitAck,
            transmits,
            events: VecDeque::new(),
            deadline: now + SETUP_TIMEOUT,
            accepted: None,
            offers: vec![None; n_files],
            skips: vec![Skipped::No; n_files],
            resumed: vec![Vec::new(); n_files],
            agreed: None,
            decisions: Vec::new(),
            early: false,
            dry_run: false,
            mirror: false,
        }
    }

    /// Asks for a dry run ([`CAP_DRY_RUN`]): the receiver decides but creates nothing and
    /// ends the session at the outcome. The driver moves no data.
    pub fn dry_run(self) -> SenderSetup {
        SenderSetup {
            dry_run: true,
            ..self
        }
    }

    /// Asks for a mirror ([`CAP_DELETE`]): `rules` (`"+ PATTERN"`, `"- PATTERN"`, in order)
    /// go first, in [`Control::Mirror`], so that the receiver keeps what they leave out;
    /// `root`: the destination itself is mirrored (the manifest is a directory's contents).
    pub fn mirror(mut self, rules: Vec<String>, root: bool) -> SenderSetup {
        self.transmits.push_front(Control::Mirror { rules, root });
        SenderSetup {
            mirror: true,
            ..self
        }
    }

    /// The hello, for the key agreement to send in the clear right behind its `Agree` (and
    /// to bind into the keys).
    pub fn hello(&self) -> Control {
        let p = &self.params;
        let caps = if p.tcp { CAP_TCP_DATA } else { 0 }
            | if p.checksum { CAP_CHECKSUM } else { 0 }
            | if p.race && !p.tcp { CAP_RACE } else { 0 }
            | if self.dry_run { CAP_DRY_RUN } else { 0 }
            | if self.mirror { CAP_DELETE } else { 0 };
        Control::hello(caps, p.channels.max(1), p.payload, p.block_size, p.session)
    }

    /// The outcome if every file is sent whole ([`Agreed::provisional`]): what the early data
    /// follows, from the receiver's `HelloAck` (which names the channel count) until its
    /// decisions. `None` before the `HelloAck`.
    pub fn provisional(&self) -> Option<Result<Agreed, SetupError>> {
        let accepted = self.accepted.as_ref()?;
        Some(Agreed::provisional(
            &self.entries,
            self.params.block_size,
            accepted.channels(),
            self.params.session,
        ))
    }

    /// The manifest this set-up offers.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        self.transmits.pop_front()
    }

    /// The next thing the driver must act on.
    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }

    /// When the wait for the receiver ends in failure, unless a message comes first; `None`
    /// once the set-up is done.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitAck | State::AwaitReply => Some(self.deadline),
            // Hashing is the sender's own work; the receiver waits for it.
            State::Hashing { .. } | State::Ready | State::Failed => None,
        }
    }

    fn fail<T>(&mut self, e: SetupError) -> Result<T, SetupError> {
        Err(self.failed(e))
    }

    /// Marks the set-up failed: it takes nothing more.
    pub(super) fn failed(&mut self, e: SetupError) -> SetupError {
        self.state = State::Failed;
        e
    }

    /// A message from the receiver arrived at `now`.
    pub fn handle(&mut self, msg: Control, now: Instant) -> Result<(), SetupError> {
        if matches!(self.state, State::Failed) {
            return Err(SetupError::Driver("the set-up already failed"));
        }
        self.deadline = now + SETUP_TIMEOUT;
        match (&self.state, msg) {
            (_, Control::KeepAlive) => Ok(()),
            // Probing starts at HelloAck and runs beside the rest.
            (
                State::AwaitReply | State::Hashing { .. } | State::Ready,
                Control::ProbeAck { channel, size },
            ) => {
                self.events
                    .push_back(SenderEvent::ProbeAck { channel, size });
                Ok(())
            }
            (
                State::AwaitAck,
                Control::HelloAck {
                    version,
                    ports,
                    payload,
                    rate_ceiling,
                    recv_buffer,
                    recv_buffer_wanted,
                    tcp_port,
                    ..
                },
            ) => {
                if version != VERSION || ports.is_empty() {
                    return self.fail(SetupError::NoChannels { version });
                }
                let offered = self.params.channels.max(1);
                if ports.len() > usize::from(offered) {
                    return self.fail(SetupError::TooManyPorts {
                        ports: ports.len(),
                        offered,
                    });
                }
                let accepted = Accepted {
                    ports,
                    max_payload: payload,
                    rate_ceiling,
                    buffer_cap: BufferCap::of(recv_buffer, recv_buffer_wanted),
                    // Only where it was asked for: a port offered unasked is not used.
                    tcp_port: (self.params.race && !self.params.tcp && tcp_port != 0)
                        .then_some(tcp_port),
                };
                self.accepted = Some(accepted.clone());
                self.events.push_back(SenderEvent::Accepted(accepted));
                self.state = State::AwaitReply;
                Ok(())
            }
            (State::AwaitReply, Control::ManifestReply { decisions, last }) => {
                if self.decisions.len() + decisions.len() > self.entries.len() {
                    return self.fail(SetupError::ReplyLength);
                }
                self.decisions.extend(decisions);
                if !last {
                    return Ok(());
                }
                let decisions = std::mem::take(&mut self.decisions);
                match self.on_decisions(decisions) {
                    Ok(()) => Ok(()),
                    Err(e) => self.fail(e),
                }
            }
            (State::AwaitAck, other) => self.fail(SetupError::unexpected(other, "HelloAck")),
            (State::AwaitReply, other) => self.fail(SetupError::unexpected(other, "ManifestReply")),
            (State::Hashing { .. } | State::Ready, other) => {
                self.fail(SetupError::unexpected(other, "nothing during set-up"))
            }
            (State::Failed, _) => unreachable!("checked above"),
        }
    }

    fn on_decisions(&mut self, decisions: Vec<Decision>) -> Result<(), SetupError> {
        if decisions.len() != self.entries.len() {
            return Err(SetupError::ReplyLength);
        }
        self.early = keeps_early(&self.entries, &decisions);
        let mut file = 0usize;
        let mut pending = 0;
        for (d, e) in decisions.into_iter().zip(&self.entries) {
            let is_file = e.kind == EntryKind::File;
            match d {
                Decision::Refuse(reason) => {
                    return Err(SetupError::Refused {
                        path: e.path.clone(),
                        reason,
                    })
                }
                Decision::Have { hash, replace_ok } if is_file => {
                    self.offers[file] = Some((hash, replace_ok));
                    self.events
                        .push_back(SenderEvent::HashWanted { file: file as u32 });
                    pending += 1;
                }
                Decision::Unchanged if is_file && !self.params.checksum => {
                    self.skips[file] = Skipped::Unchecked;
                }
                Decision::Unchanged => {
                    return Err(SetupError::UncheckedSkip {
                        path: e.path.clone(),
                    })
                }
                Decision::Resume { blocks } if is_file => self.resumed[file] = blocks,
                _ => {}
            }
            if is_file {
                file += 1;
            }
        }
        self.state = State::Hashing {
            pending,
            asked: pending > 0,
        };
        self.finish_if_hashed()
    }

    /// The driver's hash of file `file`, asked for with [`SenderEvent::HashWanted`]. A file
    /// that differs from the receiver's is sent if the receiver may replace it; otherwise the
    /// set-up fails with [`SetupError::Refused`].
    pub fn hashed(&mut self, file: u32, hash: [u8; 32]) -> Result<(), SetupError> {
        let State::Hashing { pending, asked } = self.state else {
            return Err(SetupError::Driver("a hash outside the hashing phase"));
        };
        let f = file as usize;
        let Some((theirs, replace_ok)) = self.offers.get_mut(f).and_then(Option::take) else {
            return Err(SetupError::Driver("a hash the receiver did not ask for"));
        };
        if hash == theirs {
            self.skips[f] = Skipped::Same(hash);
        } else if !replace_ok {
            let path = files(&self.entries).nth(f).map(|e| e.path.clone());
            return self.fail(SetupError::Refused {
                path: path.unwrap_or_default(),
                reason: "a different file of the same size exists on the receiver (receive with --overwrite to replace it)".into(),
            });
        }
        self.state = State::Hashing {
            pending: pending - 1,
            asked,
        };
        self.finish_if_hashed()
    }

    fn finish_if_hashed(&mut self) -> Result<(), SetupError> {
        let State::Hashing { pending: 0, asked } = self.state else {
            return Ok(());
        };
        let accepted = self
            .accepted
            .as_ref()
            .ok_or(SetupError::Driver("decisions before the receiver's hello"))?;
        let agreed = Agreed::new(
            &self.entries,
            self.skips.clone(),
            std::mem::take(&mut self.resumed),
            self.params.block_size,
            accepted.channels(),
            super::data_session(self.params.session, self.early),
        )
        .map(|a| Agreed {
            early: self.early,
            ..a
        })
        .or_else(|e| self.fail(e))?;
        // The receiver waits for the answer to its offers, and only then.
        if asked {
            self.transmits.push_back(Control::Skip {
                files: (0..self.skips.len() as u32)
                    .filter(|&f| self.skips[f as usize].is_skipped())
                    .collect(),
            });
        }
        self.agreed = Some(agreed);
        self.state = State::Ready;
        self.events.push_back(SenderEvent::Ready);
        Ok(())
    }

    /// The outcome, once [`SenderEvent::Ready`] came (taken once).
    pub fn agreed(&mut self) -> Option<Agreed> {
        self.agreed.take()
    }
}
