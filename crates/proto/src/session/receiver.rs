//! The receiver's set-up: the hello ([`check_hello`], read with the key agreement) and
//! manifest in, its parameters and decisions out, the sender's skips in if it offered files
//! for hashing, and [`Agreed`] for the data phase.

use super::{
    data_session, decision_bytes, files, keeps_early, parts, Agreed, SetupError, Skipped,
    MAX_ENTRIES, MAX_LINK_TARGET, SETUP_TIMEOUT,
};
use crate::layout::{
    check_block_ranges, count_blocks, LayoutError, MAX_BLOCKS, MAX_BLOCK_SIZE, MAX_CHANNELS,
    MIN_BLOCK_SIZE,
};
use crate::wire::{
    Control, Decision, Entry, EntryKind, CAP_CHECKSUM, CAP_DELETE, CAP_DRY_RUN, CAP_RACE,
    CAP_TCP_DATA, MAGIC, MAX_PAYLOAD, VERSION,
};
use std::collections::VecDeque;
use std::time::Instant;

/// What the receiver allows.
#[derive(Debug, Clone)]
pub struct ReceiverLimits {
    /// Most channels it takes (the sender's offer is clamped to this).
    pub max_channels: u16,
}

/// The sender's hello, checked and with the channel count the receiver takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloParams {
    /// Channels agreed: the sender's offer, clamped to the receiver's limit.
    pub channels: u16,
    /// Data over parallel TCP.
    pub tcp: bool,
    /// Data over UDP, moved to TCP data connections in the same session if nothing gets
    /// through: offer a TCP data port beside the UDP ones (never with `tcp`).
    pub race: bool,
    /// The sender compares existing files by hash only.
    pub checksum: bool,
    /// Largest payload the sender wants.
    pub payload: u16,
    /// Block size.
    pub block_size: u64,
    /// Session id.
    pub session: u32,
    /// A dry run: decide, create nothing, end at the outcome ([`CAP_DRY_RUN`]).
    pub dry_run: bool,
    /// A mirror: the rules come first ([`Control::Mirror`]), and what the sender did not
    /// offer is deleted at the end ([`CAP_DELETE`]).
    pub delete: bool,
}

/// What a receiver can take in, as it tells the sender in its `HelloAck`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Intake {
    /// How fast it can hash and write, bits per second (0 = unknown).
    pub ceiling_bps: u64,
    /// Each channel socket's receive buffer as the kernel granted it, bytes (0 = unknown).
    pub recv_buffer: u64,
    /// The receive buffer it asked for, bytes.
    pub recv_buffer_wanted: u64,
}

/// What the receiver's driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiverEvent {
    /// The whole manifest is here and checked: decide each entry (see [`super::decide`]) and
    /// answer with [`ReceiverSetup::reply`].
    Manifest,
    /// The outcome is known (at the decisions, or at the sender's `Skip` if any file was
    /// offered for hashing): take it with [`ReceiverSetup::agreed`] and start the data phase.
    Ready,
}

#[derive(Debug)]
enum State {
    /// Hello taken; the driver opens the data path. The manifest may arrive meanwhile.
    Opening,
    /// The manifest is coming (`HelloAck` sent or not yet).
    AwaitManifest,
    /// The manifest is complete; the driver decides.
    Deciding,
    /// `ManifestReply` sent; waiting for `Skip`.
    AwaitSkip,
    Ready,
    Failed,
}

/// The receiver's set-up machine. See the [module docs](super).
#[derive(Debug)]
pub struct ReceiverSetup {
    state: State,
    hello: HelloParams,
    manifest_done: bool,
    entries: Vec<Entry>,
    decisions: Vec<Decision>,
    transmits: VecDeque<Control>,
    events: VecDeque<ReceiverEvent>,
    deadline: Instant,
    agreed: Option<Agreed>,
    /// The early data's block values that came during the set-up (at most
    /// [`MAX_EARLY_VALUES`]).
    early_values: Vec<(u64, [u8; 32])>,
    /// A mirror's rules and whether the root is mirrored ([`Control::Mirror`]), once they
    /// came.
    mirror: Option<(Vec<String>, bool)>,
}

/// The most block values a sender may send before the outcome of the set-up: its early data is
/// a few round trips at the first rate, some blocks at most; this bounds what a hostile one
/// can make the receiver hold (2 MiB).
pub const MAX_EARLY_VALUES: usize = 1 << 16;

impl ReceiverSetup {
    /// A set-up for the sender's checked `hello` ([`check_hello`]): the driver opens the data
    /// path and answers with [`ReceiverSetup::accept`].
    pub fn new(hello: HelloParams, now: Instant) -> ReceiverSetup {
        ReceiverSetup {
            state: State::Opening,
            hello,
            manifest_done: false,
            entries: Vec::new(),
            decisions: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            deadline: now + SETUP_TIMEOUT,
            agreed: None,
            early_values: Vec::new(),
            mirror: None,
        }
    }

    fn on_early_values(&mut self, blocks: Vec<(u64, [u8; 32])>) -> Result<(), SetupError> {
        if self.early_values.len() + blocks.len() > MAX_EARLY_VALUES {
            return Err(SetupError::Driver(
                "more block values before the outcome than early data can have",
            ));
        }
        self.early_values.extend(blocks);
        Ok(())
    }

    /// The values of the early data's blocks that came during the set-up, once the outcome
    /// keeps the early data ([`Agreed::early`]; taken once): the data phase checks them as if
    /// they came in it. Empty otherwise.
    pub fn early_values(&mut self) -> Vec<(u64, [u8; 32])> {
        if matches!(self.state, State::Ready) && keeps_early(&self.entries, &self.decisions) {
            std::mem::take(&mut self.early_values)
        } else {
            Vec::new()
        }
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        self.transmits.pop_front()
    }

    /// The next thing the driver must act on.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.events.pop_front()
    }

    /// When the wait for the sender ends in failure, unless a message comes first; `None`
    /// while the driver works (opening the data path, deciding) and once done.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitManifest | State::AwaitSkip => Some(self.deadline),
            State::Opening | State::Deciding | State::Ready | State::Failed => None,
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

    /// The manifest so far (all of it from [`ReceiverEvent::Manifest`] on).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The checked hello.
    pub fn hello(&self) -> HelloParams {
        self.hello
    }

    /// A mirror's include and exclude rules, and whether the destination itself is mirrored
    /// ([`Control::Mirror`]); `None` without [`HelloParams::delete`].
    pub fn mirror(&self) -> Option<(&[String], bool)> {
        self.mirror
            .as_ref()
            .map(|(rules, root)| (&rules[..], *root))
    }

    /// A message from the sender arrived at `now`.
    pub fn handle(&mut self, msg: Control, now: Instant) -> Result<(), SetupError> {
        if matches!(self.state, State::Failed) {
            return Err(SetupError::Driver("the set-up already failed"));
        }
        self.deadline = now + SETUP_TIMEOUT;
        let result = match (&self.state, msg) {
            // Harmless anywhere: the sender is busy.
            (_, Control::KeepAlive) => Ok(()),
            // The values of the early data's blocks, sent as the sender reads them, before the
            // outcome: kept for the data phase if the outcome keeps the early data
            // ([`ReceiverSetup::early_values`]). Waiting for `Skip` (after offered hashes),
            // the outcome cannot keep it: they are dropped (the sender reads every block again
            // under the outcome's session, and sends its values then).
            (State::AwaitSkip, Control::BlockHashes { session, .. })
                if session == self.hello.session =>
            {
                Ok(())
            }
            (
                State::Opening | State::AwaitManifest | State::Deciding,
                Control::BlockHashes { session, blocks },
            ) if session == self.hello.session => self.on_early_values(blocks),
            (State::Opening | State::AwaitManifest, Control::Mirror { rules, root })
                if self.hello.delete && self.mirror.is_none() && self.entries.is_empty() =>
            {
                self.mirror = Some((rules, root));
                Ok(())
            }
            (State::Opening | State::AwaitManifest, other @ Control::Manifest { .. })
                if self.hello.delete && self.mirror.is_none() =>
            {
                Err(SetupError::unexpected(other, "Mirror"))
            }
            (State::Opening | State::AwaitManifest, Control::Manifest { entries, last })
                if !self.manifest_done =>
            {
                self.on_manifest(entries, last)
            }
            (State::AwaitSkip, Control::Skip { files }) => self.on_skip(files),
            (State::AwaitSkip, other) => Err(SetupError::unexpected(other, "Skip")),
            (State::Opening | State::AwaitManifest, other) => {
                Err(SetupError::unexpected(other, "Manifest"))
            }
            (State::Deciding, other) => Err(SetupError::unexpected(
                other,
                "nothing while the receiver decides",
            )),
            (State::Ready, other) => Err(SetupError::unexpected(other, "nothing during set-up")),
            (State::Failed, _) => unreachable!("checked above"),
        };
        result.or_else(|e| self.fail(e))
    }

    /// The data path is open: answers the hello with one port per channel, the TCP data port
    /// if the sender asked for one to fall back to ([`HelloParams::race`]), and what the
    /// receiver can take in. Queues `HelloAck`.
    pub fn accept(
        &mut self,
        ports: Vec<u16>,
        tcp_port: Option<u16>,
        intake: Intake,
        now: Instant,
    ) -> Result<(), SetupError> {
        let (State::Opening, hello) = (&self.state, self.hello) else {
            return Err(SetupError::Driver("ports twice"));
        };
        if ports.len() != usize::from(hello.channels) {
            return Err(SetupError::Driver("a port count other than the channels"));
        }
        if tcp_port.is_some() != hello.race || tcp_port == Some(0) {
            return Err(SetupError::Driver(
                "a TCP data port where none was asked for, or none where one was",
            ));
        }
        self.transmits.push_back(Control::HelloAck {
            version: VERSION,
            caps: 0,
            ports,
            payload: hello.payload.min(MAX_PAYLOAD),
            rate_ceiling: intake.ceiling_bps,
            recv_buffer: intake.recv_buffer,
            recv_buffer_wanted: intake.recv_buffer_wanted,
            tcp_port: tcp_port.unwrap_or(0),
        });
        self.deadline = now + SETUP_TIMEOUT;
        self.state = if self.manifest_done {
            self.events.push_back(ReceiverEvent::Manifest);
            State::Deciding
        } else {
            State::AwaitManifest
        };
        Ok(())
    }

    fn on_manifest(&mut self, part: Vec<Entry>, last: bool) -> Result<(), SetupError> {
        if self.entries.len() + part.len() > MAX_ENTRIES {
            return Err(SetupError::TooManyEntries);
        }
        self.entries.extend(part);
        if !last {
            return Ok(());
        }
        check_blocks(&self.entries, self.hello.block_size)?;
        check_links(&self.entries)?;
        self.manifest_done = true;
        // Answered already (not still opening the data path): decide now.
        if matches!(self.state, State::AwaitManifest) {
            self.state = State::Deciding;
            self.events.push_back(ReceiverEvent::Manifest);
        }
        Ok(())
    }

    /// The receiver's decision for each manifest entry, in order, made by `now` (the wait for
    /// the sender's skips runs from here). Queues the `ManifestReply` parts; a refusal fails
    /// the set-up with [`SetupError::Refused`] once they are queued (the sender learns which
    /// entry and why).
    pub fn reply(&mut self, decisions: Vec<Decision>, now: Instant) -> Result<(), SetupError> {
        if !matches!(self.state, State::Deciding) {
            return Err(SetupError::Driver("decisions before the whole manifest"));
        }
        if decisions.len() != self.entries.len() {
            return Err(SetupError::Driver(
                "a decision count other than the entries",
            ));
        }
        let refused = self
            .entries
            .iter()
            .zip(&decisions)
            .find_map(|(e, d)| match d {
                Decision::Refuse(reason) => Some(SetupError::Refused {
                    path: e.path.clone(),
                    reason: reason.clone(),
                }),
                _ => None,
            });
        let parts = parts(&decisions, decision_bytes);
        let n_parts = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            self.transmits.push_back(Control::ManifestReply {
                decisions: part.to_vec(),
                last: i + 1 == n_parts,
            });
        }
        self.decisions = decisions;
        self.deadline = now + SETUP_TIMEOUT;
        if let Some(e) = refused {
            return self.fail(e);
        }
        if self
            .decisions
            .iter()
            .any(|d| matches!(d, Decision::Have { .. }))
        {
            // The sender hashes its copies and says which it skips.
            self.state = State::AwaitSkip;
            return Ok(());
        }
        // Nothing to wait for: the files unchanged on size and time are skipped (the sender
        // skips them unread), the rest are sent.
        let unchanged: Vec<u32> = files_with(&self.entries, &self.decisions, |d| {
            *d == Decision::Unchanged
        });
        self.on_skip(unchanged).or_else(|e| self.fail(e))
    }

    /// The decisions given to [`ReceiverSetup::reply`].
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    fn on_skip(&mut self, skip: Vec<u32>) -> Result<(), SetupError> {
        let file_entries: Vec<(&Entry, &Decision)> = self
            .entries
            .iter()
            .zip(&self.decisions)
            .filter(|(e, _)| e.kind == EntryKind::File)
            .collect();
        let mut skipped = vec![false; file_entries.len()];
        for f in skip {
            match skipped.get_mut(f as usize) {
                Some(s) => *s = true,
                None => return Err(SetupError::SkipUnknown(f)),
            }
        }
        // A skipped file only counts if the receiver offered it, never by the sender's say.
        let mut skips = Vec::with_capacity(skipped.len());
        let mut resumed = Vec::with_capacity(skipped.len());
        for ((e, d), s) in file_entries.iter().zip(skipped) {
            skips.push(match (d, s) {
                (_, false) => Skipped::No,
                (Decision::Have { hash, .. }, true) => Skipped::Same(*hash),
                (Decision::Unchanged, true) => Skipped::Unchecked,
                (_, true) => {
                    return Err(SetupError::SkipNotOffered {
                        path: e.path.clone(),
                    })
                }
            });
            resumed.push(match d {
                Decision::Resume { blocks } => blocks.clone(),
                _ => Vec::new(),
            });
        }
        let hello = self.hello;
        let early = keeps_early(&self.entries, &self.decisions);
        let agreed = Agreed::new(
            &self.entries,
            skips,
            resumed,
            hello.block_size,
            hello.channels,
            data_session(hello.session, early),
        )?;
        self.agreed = Some(Agreed { early, ..agreed });
        self.state = State::Ready;
        self.events.push_back(ReceiverEvent::Ready);
        Ok(())
    }

    /// The outcome, once [`ReceiverEvent::Ready`] came (taken once).
    pub fn agreed(&mut self) -> Option<Agreed> {
        self.agreed.take()
    }

    /// Ends the set-up once [`ReceiverEvent::Ready`] came: the manifest, the decisions and
    /// the outcome. `None` before.
    pub fn finish(mut self) -> Option<(Vec<Entry>, Vec<Decision>, Agreed)> {
        let agreed = self.agreed.take()?;
        Some((self.entries, self.decisions, agreed))
    }
}

/// The file ids (the manifest's files, in order) whose decision passes `pick`.
fn files_with(
    entries: &[Entry],
    decisions: &[Decision],
    pick: impl Fn(&Decision) -> bool,
) -> Vec<u32> {
    entries
        .iter()
        .zip(decisions)
        .filter(|(e, _)| e.kind == EntryKind::File)
        .enumerate()
        .filter(|(_, (_, d))| pick(d))
        .map(|(f, _)| f as u32)
        .collect()
}

/// The sender's hello, checked against this receiver's `limits`: its magic and version, its
/// block size, and the channel count clamped to the limit. What fails is the sender's error,
/// for the key agreement's driver to answer with `Reject`.
pub fn check_hello(msg: Control, limits: &ReceiverLimits) -> Result<HelloParams, SetupError> {
    let Control::Hello {
        magic,
        version,
        caps,
        channels,
        payload,
        block_size,
        session,
    } = msg
    else {
        return Err(SetupError::unexpected(msg, "Hello"));
    };
    if magic != MAGIC || version != VERSION {
        return Err(SetupError::Incompatible { magic, version });
    }
    if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(LayoutError::BadBlockSize(block_size).into());
    }
    let hello = HelloParams {
        channels: channels.clamp(1, limits.max_channels.clamp(1, MAX_CHANNELS)),
        tcp: caps & CAP_TCP_DATA != 0,
        race: caps & CAP_RACE != 0 && caps & CAP_TCP_DATA == 0,
        checksum: caps & CAP_CHECKSUM != 0,
        payload,
        block_size,
        session,
        dry_run: caps & CAP_DRY_RUN != 0,
        delete: caps & CAP_DELETE != 0,
    };
    Ok(hello)
}

/// Link entries with a target a link can have, and no other entry with one (see
/// [`SetupError::BadLink`]). What the target points at is the receiver's to judge.
fn check_links(entries: &[Entry]) -> Result<(), SetupError> {
    for e in entries {
        let why = match e.kind {
            EntryKind::Symlink if e.target.is_empty() => "an empty target",
            EntryKind::Symlink if e.target.contains('\0') => "a NUL in its target",
            EntryKind::Symlink if e.target.len() > MAX_LINK_TARGET => "a target too long",
            EntryKind::Symlink if e.size != 0 || !e.holes.is_empty() => "a size",
            EntryKind::File | EntryKind::Dir if !e.target.is_empty() => {
                "a target, and it is not a link"
            }
            _ => continue,
        };
        return Err(SetupError::BadLink {
            path: e.path.clone(),
            why,
        });
    }
    Ok(())
}

/// A manifest the layout can take: not too many blocks, and holes inside their files.
fn check_blocks(entries: &[Entry], block_size: u64) -> Result<(), SetupError> {
    let blocks = count_blocks(files(entries).map(|e| e.size), block_size);
    if blocks > MAX_BLOCKS {
        return Err(LayoutError::TooManyBlocks { blocks, block_size }.into());
    }
    for e in entries.iter().filter(|e| !e.holes.is_empty()) {
        let count = match e.kind {
            EntryKind::File => e.size.div_ceil(block_size.max(1)),
            EntryKind::Dir | EntryKind::Symlink => 0,
        };
        if let Err((start, end)) = check_block_ranges(&e.holes, count) {
            return Err(SetupError::BadHoles {
                path: e.path.clone(),
                start,
                end,
            });
        }
    }
    Ok(())
}
