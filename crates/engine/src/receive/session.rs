//! One session from the receiver's side, from the manifest to the summary ([`Receiver::run`];
//! the front door opened the data path and answered the hello, [`super::data_path`]): the
//! manifest and its answers
//! ([`Receiver::decide`]), the part files ([`Receiver::prepare_parts`], created on a few
//! threads by [`Receiver::new_parts`]), the sender's skips and the layout, what is held, the
//! threads, and the summary.

use super::capacity::receive_threads;
use super::channel_threads::{serve_channels, ChannelWorker};
use super::commit::Commits;
use super::data_path::{DataIn, Opened};
use super::held::{hash_holes, in_ranges, Holes, Resumed};
use super::links::{accept_data_connections, DataKeys};
use super::parallel::in_runs;
use super::session_loop::{session_loop, Race, Received, Wires};
use super::shared::{ChanCmd, ChanEvent, Counters, Shared};
use super::summary::ReceiveSummary;
use super::writer::Writer;
use super::{Receiver, WriteQueue};
use crate::error::{SessionError, Side};
use crate::fs::{self, PartFile};
use crate::net::channel_link::LinkIn;
use crate::net::control::{ControlError, ControlTx};
use crate::net::feedback::FeedbackOut;
use crate::net::udp::UdpChannel;
use crate::netlog::NetLog;
use crate::progress::{Progress, Route};
use crate::report::BytesByPath;
use crate::setup::{out_of_order, Driver};
use crossbeam_channel::{unbounded, Receiver as ChanRx, Sender};
use hurtle_proto::admit::Tally;
use hurtle_proto::hash::{to_hex, BlockValue, HashKind};
use hurtle_proto::layout::union_ranges;
use hurtle_proto::probe::SilenceWatch;
use hurtle_proto::rate::dispersion::TrainPool;
use hurtle_proto::rate::rtt::PathRtt;
use hurtle_proto::session::{
    first_look, Agreed, Found, HelloParams, Look, ReceiverEvent, ReceiverSetup, SetupError,
};
use hurtle_proto::wire::{Control, Decision, Entry, EntryKind};
use hurtle_proto::{Admission, ChannelReceiver, Layout, RecvConfig};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

impl Receiver {
    /// The session on a greeted connection whose data path is `opened` and whose first sealed
    /// message was `first`, `rtt` after the receiver's answer to the key agreement.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        (opened, first): (Opened, Control),
        rtt: Duration,
        (rx, tx, control): (
            &ChanRx<Result<Control, ControlError>>,
            &ControlTx,
            BorrowedFd<'_>,
        ),
        peer: SocketAddr,
        start: Instant,
        progress: Arc<Progress>,
        data: &DataKeys,
    ) -> Result<ReceiveSummary, SessionError> {
        let Opened {
            data_in,
            setup: machine,
            mut warnings,
            capacity,
            _port,
        } = opened;
        let HelloParams {
            channels,
            checksum,
            block_size,
            session,
            dry_run,
            delete,
            ..
        } = machine.hello();
        if delete && !self.opts.allow_delete {
            return Err(SessionError::Refused {
                path: "--delete".into(),
                reason: "this receiver does not allow deleting what the sender does not send (start it with receive --allow-delete); nothing was written".into(),
            });
        }
        let mut setup = Driver::new(machine, rx, tx, Side::Sender);
        setup.take(first)?;
        if dry_run {
            return self.dry_run(
                setup,
                (block_size, checksum, channels, data.encrypt),
                (tx, peer, start),
                (warnings, capacity),
            );
        }
        let root = &self.opts.out_dir;
        std::fs::create_dir_all(root)
            .map_err(|e| SessionError::io(format!("create {}", root.display()), e))?;
        let disk_queued = match self.opts.write_queue {
            WriteQueue::Auto => !fs::memory_backed_dir(root),
            WriteQueue::Always => true,
            WriteQueue::Never => false,
        };

        // Manifest: the machine checks it whole (entries, blocks, holes) before anything is
        // created here.
        match setup.next()? {
            ReceiverEvent::Manifest => {}
            other => return Err(out_of_order(other, "before the manifest")),
        }
        // Hashing files the receiver already has and preallocating new ones can take a while:
        // keep the sender's wait for the manifest reply alive meanwhile.
        let alive = crate::net::control::KeepAlive::start(tx.clone());
        // Each directory of the output tree is checked (or created) once for all its files.
        let out = fs::OutRoot::new(&self.opts.out_dir).replacing_modes(self.opts.overwrite);
        let (decisions, (mut parts, held_values)) =
            self.prepare(&out, setup.machine.entries(), block_size, checksum, false)?;
        drop(alive);
        // A refusal is sent with the reply, and ends the session here.
        setup.act(|m| m.reply(decisions, Instant::now()))?;
        // The outcome: at once if nothing was offered for hashing; otherwise at the sender's
        // `Skip`, which may take a while (hashing its copies of files the receiver has; it
        // sends keep-alives meanwhile).
        match setup.next()? {
            ReceiverEvent::Ready => {}
            other => return Err(out_of_order(other, "before the outcome")),
        }
        let early_values = setup.machine.early_values();
        let rules = setup.machine.mirror().map(|(r, root)| (r.to_vec(), root));
        let (entries, decisions, agreed) =
            setup
                .machine
                .finish()
                .ok_or(SessionError::Setup(SetupError::Driver(
                    "ready without an outcome",
                )))?;
        // A mirror looks at the manifest as the sender named it, once every file is committed.
        let mirror = rules.map(|rules| (rules, entries.clone()));
        // The paths as they are written here (a renamed top-level name, `Names::rename`).
        let entries = match self.opts.names.rename {
            Some(_) => self.opts.names.localize(&entries).into_owned(),
            None => entries,
        };
        let (symlinks, unsafe_links) = links_refused(&entries, &mut warnings);
        let files: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .collect();
        let dirs: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::Dir)
            .collect();
        // Skipped files keep the receiver's copy (the hash it offered; none for a file skipped
        // on size and time, which nobody read).
        let kept: Vec<Option<[u8; 32]>> = agreed.skips.iter().map(|s| s.kept_hash()).collect();
        let unchecked: Vec<bool> = entries
            .iter()
            .zip(&decisions)
            .filter(|(e, _)| e.kind == EntryKind::File)
            .map(|(_, d)| matches!(d, Decision::Unchanged))
            .collect();
        progress.set_files(files.iter().map(|f| f.path.clone()).collect());
        let total = agreed.sent_bytes;
        // A file the receiver offered as already there but the sender did not skip (its copy
        // differs, and --overwrite allows replacing it) gets its part file now.
        for (f, part) in parts.iter_mut().enumerate() {
            if part.is_none() && !agreed.skips[f].is_skipped() {
                let p = self.new_part(&out, files[f], block_size)?;
                p.preallocate(&files[f].holes, block_size)?;
                *part = Some(p);
            }
        }
        let data_session = agreed.session;
        let Agreed {
            layout,
            held,
            skips,
            ..
        } = agreed;
        // What is not sent (both sides agreed on it): blocks resumed from part files, and the
        // holes of sparse files.
        let holes: Vec<&[(u64, u64)]> = files
            .iter()
            .zip(&skips)
            .map(|(e, s)| {
                if s.is_skipped() {
                    &[][..]
                } else {
                    &e.holes[..]
                }
            })
            .collect();
        let (held_bytes, resumed_bytes, sparse_bytes) =
            (held.bytes(), held.resumed_bytes, held.hole_bytes);
        let held_stripes = held.stripes;
        let (held, hole_blocks) = held_blocks(&parts, &holes, held_values, &layout, block_size)?;
        progress.total.store(total - held_bytes, Ordering::Relaxed);
        progress.resumed.store(resumed_bytes, Ordering::Relaxed);
        // Through a relay, each channel's thread binds its socket's end of the session's
        // allocation there once the relay gives them (this session is authenticated), and
        // tries for a direct path to the sender's socket: clones of the sockets for it.
        let punch_socks: Vec<Option<std::net::UdpSocket>> = match (&self.opts.relayed_udp, &data_in)
        {
            (Some(_), DataIn::Udp(udps, _)) => {
                udps.iter().map(|u| u.try_clone_socket().ok()).collect()
            }
            _ => Vec::new(),
        };
        // Feedback datagrams leave from the channel sockets (none over TCP data connections).
        let feedback_socks = match &data_in {
            DataIn::Udp(udps, _) => udps
                .iter()
                .map(UdpChannel::try_clone_socket)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| SessionError::io("UDP socket", e))?,
            DataIn::Tcp(_) => Vec::new(),
        };
        let feedback = FeedbackOut::new(feedback_socks, &data.feedback, data_session);
        // A TCP data listener stays open until the session ends, as its port stays ours.
        let (links, _listener, race) = match data_in {
            DataIn::Tcp(l) => (
                accept_data_connections(&l, session, channels, peer.ip(), data, control)?,
                Some(l),
                None,
            ),
            DataIn::Udp(udps, fallback) => (
                udps.into_iter()
                    .enumerate()
                    .map(|(ch, u)| LinkIn::udp(u, data.opener(ch as u16)))
                    .collect(),
                None,
                fallback.map(|listener| Race {
                    listener,
                    session,
                    peer_ip: peer.ip(),
                    data,
                    control,
                    watch: match self.opts.relayed_udp {
                        Some(_) => SilenceWatch::new(rtt).through_relay(rtt),
                        None => SilenceWatch::new(rtt),
                    },
                }),
            ),
        };

        let shared = Arc::new(Shared {
            layout,
            files: parts.into_iter().map(|p| p.map(Arc::new)).collect(),
            peer_ip: peer.ip(),
            relay_ip: self.opts.relayed_udp.as_ref().map(|r| r.relay_ip()),
            relay_offer: std::sync::OnceLock::new(),
            punch_key: data.punch,
            relay: self.opts.relayed_udp.clone(),
            direct_at_us: AtomicU64::new(u64::MAX),
            to_wire: tx.clone(),
            feedback,
            counters: Counters::default(),
            progress: progress.clone(),
            stop: AtomicBool::new(false),
            started: AtomicBool::new(false),
            channel_drops: (0..channels).map(|_| AtomicU64::new(0)).collect(),
            heard: (0..channels).map(|_| AtomicBool::new(false)).collect(),
            passes: (0..channels).map(|_| AtomicU64::new(0)).collect(),
            queue_fill: AtomicU64::new(0),
            write_wait_us: AtomicU64::new(0),
            write_fill: AtomicU64::new(0),
            timed_on_read: AtomicBool::new(false),
            arrivals: (0..channels).map(|_| Default::default()).collect(),
            train_rates: Mutex::new(TrainPool::default()),
            origin: Instant::now(),
            report_clock: Default::default(),
        });
        if let (Some(relayed), false) = (&self.opts.relayed_udp, punch_socks.is_empty()) {
            // Weak: a session that ends (or was never relayed) does not wait for the offer.
            let sh = Arc::downgrade(&shared);
            relayed.when_offered(Duration::from_secs(10), move |offer| {
                if let Some(sh) = sh.upgrade() {
                    let _ = sh.relay_offer.set(offer);
                    // The datagrams come through the relay until a channel's move direct.
                    sh.progress.set_routes(channels, Route::RelayUdp);
                }
            });
        } else if shared.tcp_route() == Route::RelayTcp {
            shared.progress.set_routes(channels, Route::RelayTcp);
        }
        let (ev_tx, ev_rx) = unbounded();
        // On a disk a write can block for a long time (the device busy, dirty pages throttled),
        // and a channel thread blocked in one lets its socket overflow: blocks go to a writer
        // thread instead. On tmpfs a write is a memory copy that never waits, and handing it
        // over costs more than it saves.
        let (writer, writer_handle) = disk_queued
            .then(|| {
                let depth = (self.opts.buffer_memory / 4 / block_size as usize).clamp(4, 256);
                Writer::start(shared.clone(), ev_tx.clone(), depth)
            })
            .transpose()
            .map_err(|e| SessionError::io("writer thread", e))?
            .unzip();
        // The key agreement's timing sets the channels' NACK timers; repairs' timing lowers
        // them toward the path's round trip, never below the kernel's floor on the control
        // connection. Through a relay there is no floor (the kernel's round trip ends at the
        // relay or its agent, short of the sender): the key agreement's timing stands.
        let floor = match self.opts.relayed_udp {
            Some(_) => None,
            None => crate::sys::socket::tcp_min_rtt(control),
        };
        let (cmd_txs, handles) = self.start_channels(
            &shared,
            (links, punch_socks),
            held_stripes,
            (RecvConfig::for_rtt(rtt), PathRtt::new(rtt, floor)),
            (&ev_tx, writer.as_ref()),
            ((data_session, session), start),
        )?;
        let holes_handle = (!hole_blocks.is_empty())
            .then(|| hash_holes(shared.clone(), ev_tx.clone(), hole_blocks))
            .transpose()
            .map_err(|e| SessionError::io("hole hashing thread", e))?;
        drop(ev_tx);
        // The writer ends once every channel's end of its queue is gone.
        drop(writer);

        let result = std::thread::scope(|scope| {
            let commits = Commits::start(scope, &shared, &files)?;
            let wires = Wires {
                rx,
                events: &ev_rx,
                cmds: &cmd_txs,
                commits,
                race,
                report_pace: hurtle_proto::rate::ReportPace::for_path(rtt, floor),
                idle: self.opts.idle_timeout,
                sessions: (data_session, session),
                early_values,
                in_the_clear: !data.encrypt,
            };
            // Returning drops `commits`: the committer ends once it has committed what it
            // was given, and the scope waits for it.
            session_loop(&shared, &files, &dirs, &out, wires, &kept, &held)
        });
        shared.stop.store(true, Ordering::Relaxed);
        let mut socket_drops = 0;
        let mut nacks = 0;
        for h in handles {
            if let Ok((drops, n)) = h.join() {
                socket_drops += drops;
                nacks += n;
            }
        }
        for h in writer_handle.into_iter().chain(holes_handle) {
            let _ = h.join();
        }
        let Received { hashes, moved } = result?;
        // Every file is committed: a mirror deletes what was not offered.
        if let Some((rules, offered)) = mirror {
            let strays = self.extraneous(&out, &offered, rules)?;
            let deleted = crate::mirror::delete(out.path(), &strays)
                .map_err(|e| SessionError::io("mirror", std::io::Error::other(e)))?;
            if deleted > 0 {
                warnings.push(format!(
                    "deleted {deleted} path{} the sender did not offer (--delete)",
                    if deleted == 1 { "" } else { "s" }
                ));
            }
        }
        match moved {
            Some(silent) if silent.is_empty() => warnings.push(
                "UDP from the sender arrived too late (after the sender was told it did not get through); the channels moved to TCP connections".to_string(),
            ),
            Some(silent) => warnings.push(format!(
                "UDP from the sender did not get through (nothing arrived on {}); the channels moved to TCP connections (a firewall that drops UDP?)",
                hurtle_proto::session::data::channel_list(&silent)
            )),
            None => {}
        }
        let seconds = start.elapsed().as_secs_f64();
        let c = &shared.counters;
        Ok(ReceiveSummary {
            peer: peer.to_string(),
            bytes: total,
            resumed_bytes,
            sparse_bytes,
            files: files.len(),
            dirs: dirs.len(),
            links: symlinks,
            unsafe_links,
            seconds,
            goodput_bps: (total - held_bytes) as f64 * 8.0 / seconds.max(1e-9),
            channels,
            duplicate_bytes: c.duplicate.load(Ordering::Relaxed),
            nacks,
            rejected: c.rejected.load(Ordering::Relaxed),
            unauthentic: c.unauthentic.load(Ordering::Relaxed),
            encrypted: data.encrypt,
            rejected_blocks: c.rejected_blocks.load(Ordering::Relaxed),
            spilled_blocks: c.spilled_blocks.load(Ordering::Relaxed),
            recovered: c.recovered.load(Ordering::Relaxed),
            socket_drops,
            warnings,
            capacity,
            bytes_by_path: BytesByPath::from_routes(shared.progress.route_bytes()),
            direct_after_seconds: match shared.direct_at_us.load(Ordering::Relaxed) {
                u64::MAX => None,
                us => Some(
                    (shared.origin + Duration::from_micros(us))
                        .saturating_duration_since(start)
                        .as_secs_f64(),
                ),
            },
            file_hashes: files
                .iter()
                .zip(hashes)
                .zip(&kept)
                .zip(&unchecked)
                .map(|(((f, h), k), &u)| crate::report::FileReport {
                    path: f.path.clone(),
                    size: f.size,
                    blake3: if u && k.is_some() {
                        String::new()
                    } else {
                        to_hex(&h)
                    },
                    hash: HashKind::with_holes(k.is_none() && !f.holes.is_empty()).name(),
                    skipped: k.is_some(),
                })
                .collect(),
            strays: 0,
        })
    }

    /// A dry run (`-n`, [`HelloParams::dry_run`]): the decisions a transfer would get, with
    /// nothing created (no directory, no part file); the session ends at the outcome, once the
    /// paths a mirror would delete went to the sender ([`Control::Extraneous`]).
    fn dry_run(
        &self,
        mut setup: Driver<'_, ReceiverSetup>,
        (block_size, checksum, channels, encrypted): (u64, bool, u16, bool),
        (tx, peer, start): (&ControlTx, SocketAddr, Instant),
        (mut warnings, capacity): (Vec<String>, super::capacity::Capacity),
    ) -> Result<ReceiveSummary, SessionError> {
        match setup.next()? {
            ReceiverEvent::Manifest => {}
            other => return Err(out_of_order(other, "before the manifest")),
        }
        let alive = crate::net::control::KeepAlive::start(tx.clone());
        let out = fs::OutRoot::new(&self.opts.out_dir);
        let (decisions, _) =
            self.prepare(&out, setup.machine.entries(), block_size, checksum, true)?;
        drop(alive);
        setup.act(|m| m.reply(decisions, Instant::now()))?;
        match setup.next()? {
            ReceiverEvent::Ready => {}
            other => return Err(out_of_order(other, "before the outcome")),
        }
        let rules = setup.machine.mirror().map(|(r, root)| (r.to_vec(), root));
        let (entries, _, agreed) =
            setup
                .machine
                .finish()
                .ok_or(SessionError::Setup(SetupError::Driver(
                    "ready without an outcome",
                )))?;
        let strays = match rules {
            Some(rules) => {
                let strays = self.extraneous(&out, &entries, rules)?;
                send_extraneous(&strays, tx);
                strays
            }
            None => Vec::new(),
        };
        let files: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .collect();
        let (links, unsafe_links) =
            links_refused(&self.opts.names.localize(&entries), &mut warnings);
        let sent = agreed.skips.iter().filter(|s| !s.is_skipped()).count();
        warnings.extend(
            strays
                .iter()
                .map(|s| format!("{}{}", crate::mirror::DELETING, s.rel_path)),
        );
        warnings.push(format!(
            "{}; {sent} of {} files would be received{}",
            crate::mirror::DRY_RUN,
            files.len(),
            if strays.is_empty() {
                String::new()
            } else {
                format!(", {} paths deleted", strays.len())
            }
        ));
        Ok(ReceiveSummary {
            peer: peer.to_string(),
            bytes: 0,
            resumed_bytes: 0,
            sparse_bytes: 0,
            files: files.len(),
            dirs: entries.iter().filter(|e| e.kind == EntryKind::Dir).count(),
            links,
            unsafe_links,
            seconds: start.elapsed().as_secs_f64(),
            goodput_bps: 0.0,
            channels,
            duplicate_bytes: 0,
            nacks: 0,
            rejected: 0,
            unauthentic: 0,
            encrypted,
            rejected_blocks: 0,
            spilled_blocks: 0,
            recovered: 0,
            socket_drops: 0,
            warnings,
            capacity,
            bytes_by_path: BytesByPath::default(),
            direct_after_seconds: None,
            file_hashes: files
                .iter()
                .zip(&agreed.skips)
                .map(|(f, s)| crate::report::FileReport {
                    path: f.path.clone(),
                    size: f.size,
                    blake3: s.kept_hash().map(|h| to_hex(&h)).unwrap_or_default(),
                    hash: HashKind::with_holes(false).name(),
                    skipped: s.is_skipped(),
                })
                .collect(),
            strays: 0,
        })
    }

    /// What a mirror deletes ([`crate::mirror::extraneous`]) under the sender's `rules`.
    fn extraneous(
        &self,
        out: &fs::OutRoot,
        entries: &[Entry],
        (rules, root): (Vec<String>, bool),
    ) -> Result<Vec<crate::mirror::Stray>, SessionError> {
        let bad = |e: String| {
            SessionError::io(
                "mirror",
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        };
        let filter = crate::filter::Filter::from_wire(&rules).map_err(|e| bad(e.to_string()))?;
        crate::mirror::extraneous(out, entries, &self.opts.names, &filter, root)
            .map_err(|e| bad(e.to_string()))
    }

    /// Starts the channel threads over `links`: each channel's receiver holds its `held`
    /// stripes; their events go to `to_loop.0`, complete blocks to the writer `to_loop.1` if
    /// there is one. Returns each channel's command queue and the threads.
    fn start_channels(
        &self,
        shared: &Arc<Shared>,
        (links, mut punch_socks): (Vec<LinkIn>, Vec<Option<std::net::UdpSocket>>),
        mut held_stripes: Vec<Vec<std::ops::Range<u64>>>,
        (recv_cfg, path_rtt): (RecvConfig, PathRtt),
        to_loop: (&Sender<ChanEvent>, Option<&Writer>),
        (sessions, start): ((u32, u32), Instant),
    ) -> Result<ChannelThreads, SessionError> {
        // The data phase's session, and the hello's whose early data it may have replaced.
        let (session, early) = sessions;
        let (ev_tx, writer) = to_loop;
        let channels = shared.layout.channels();
        let block_size = shared.layout.block_size();
        let buffers_per_channel =
            (self.opts.buffer_memory / usize::from(channels) / block_size as usize).max(4);
        let mut cmd_txs = Vec::new();
        // Channels share threads, no more than there are cores: a thread per channel would
        // wake up for less data each, and on a busy machine the wake-ups cost more than the
        // extra channels bring.
        let threads = receive_threads(channels);
        let mut groups: Vec<Vec<(ChannelWorker, LinkIn)>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (ch, link) in links.into_iter().enumerate() {
            let ch = ch as u16;
            let (cmd_tx, cmd_rx) = unbounded();
            let mut log = NetLog::open(self.opts.log_dir.as_deref(), "recv", ch, start)
                .map_err(|e| SessionError::io("log directory", e))?;
            let mut rec = ChannelReceiver::new(ch, shared.layout.stripe_len(ch), recv_cfg.clone())
                .timing_repairs(path_rtt);
            log.line(|| {
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                format!(
                    "rtt {:.2} ms (the key agreement's), floor {} ms: NACKs again after {:.1} ms until repairs show the path's",
                    ms(path_rtt.handshake()),
                    path_rtt.floor().map_or("none".into(), |f| format!("{:.3}", ms(f))),
                    ms(recv_cfg.nack_retry)
                )
            });
            for stripe in held_stripes[usize::from(ch)].drain(..) {
                rec.hold(stripe);
            }
            let worker = ChannelWorker {
                parity: hurtle_proto::fec::ParityStore::new(),
                ch,
                rec,
                shared: shared.clone(),
                cmds: cmd_rx,
                events: ev_tx.clone(),
                buffers: Default::default(),
                pool: Vec::new(),
                writer: writer.cloned(),
                max_buffers: buffers_per_channel,
                spilled: HashMap::new(),
                refetched: HashSet::new(),
                log,
                probes_acked: Vec::new(),
                admission: Admission::new(session, ch..ch + 1, start).superseding(early),
                added: Tally::default(),
                queue_sampled: Instant::now(),
                moved_file: None,
                heard: false,
                last_src: None,
                sources: Vec::new(),
                ways: Default::default(),
                punch: punch_socks
                    .get_mut(usize::from(ch))
                    .and_then(Option::take)
                    .map(|sock| super::channel_threads::ReceiverPunch {
                        sock,
                        state: None,
                        direct_ip: None,
                    }),
            };
            groups[usize::from(ch) % threads].push((worker, link));
            cmd_txs.push(cmd_tx);
        }
        let mut handles = Vec::new();
        for (i, group) in groups.into_iter().enumerate() {
            let shared = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("recv-{i}"))
                    .spawn(move || serve_channels(group, &shared))
                    .map_err(|e| SessionError::io("channel thread", e))?,
            );
        }
        Ok((cmd_txs, handles))
    }

    /// The answers to the manifest and what they need before the reply: the directories, the
    /// part files of the files to be sent (created, or resumed, and preallocated), and the held
    /// blocks' values of the resumed ones. Nothing is created when an entry is refused.
    fn prepare(
        &self,
        out: &fs::OutRoot,
        entries: &[Entry],
        block_size: u64,
        checksum: bool,
        dry_run: bool,
    ) -> Result<(Vec<Decision>, PreparedParts), SessionError> {
        // Names the receiver did not ask for are refused before anything here is looked at.
        let unrequested: HashSet<&str> = self.opts.names.unrequested(entries).into_iter().collect();
        if !unrequested.is_empty() {
            let listed: Vec<&str> = entries
                .iter()
                .map(|e| e.path.as_str())
                .filter(|p| unrequested.contains(p))
                .collect();
            let why = self.opts.names.refusal(&listed);
            let decisions = entries
                .iter()
                .map(|e| {
                    if unrequested.contains(e.path.as_str()) {
                        Decision::Refuse(why.clone())
                    } else {
                        Decision::SendAll
                    }
                })
                .collect();
            return Ok((decisions, (Vec::new(), Vec::new())));
        }
        let entries = &self.opts.names.localize(entries)[..];
        let (decisions, resumes) = self.decide(out, entries, block_size, checksum, dry_run)?;
        if dry_run || decisions.iter().any(|d| matches!(d, Decision::Refuse(_))) {
            return Ok((decisions, (Vec::new(), Vec::new())));
        }
        let files: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .collect();
        // A directory created here has the sender's mode (plus owner write) from the start, so
        // that one an interrupted transfer left is as the sender's when it is resumed: only
        // the directories this transfer creates get their exact mode at the end
        // (`OutRoot::finish_dir`).
        // Links are made with them, in the manifest's order and before any file: a directory
        // or file the manifest puts below one is then refused as any path through a link is
        // (never written through it).
        for e in entries {
            match e.kind {
                EntryKind::Dir => {
                    out.make_dir(&e.path, e.mode)?;
                }
                EntryKind::Symlink if is_safe_link(e) => {
                    out.make_symlink(&e.path, &e.target, e.mtime_ns, self.opts.overwrite)?;
                }
                _ => {}
            }
        }
        // A transfer that cannot fit is refused before anything is sent. Part files are
        // created (and preallocated) before the reply. The sender's probes may arrive
        // meanwhile: they wait in the sockets' buffers, and the sender's probe deadline runs
        // only from the end of this set-up (see `hurtle_proto::probe`).
        let file_decisions: Vec<&Decision> = entries
            .iter()
            .zip(&decisions)
            .filter(|(e, _)| e.kind == EntryKind::File)
            .map(|(_, d)| d)
            .collect();
        let prepared = self.prepare_parts(out, &files, &file_decisions, resumes, block_size)?;
        Ok((decisions, prepared))
    }

    /// The answer to each manifest entry (the core's [`first_look`] at what is at its path,
    /// then the existing file's hash or the part file's journal where it asks for them); for
    /// each file entry, the part file to resume and what it holds. A dry run opens no part
    /// file: a file that would resume is sent whole.
    fn decide(
        &self,
        out: &fs::OutRoot,
        entries: &[Entry],
        block_size: u64,
        checksum: bool,
        dry_run: bool,
    ) -> Result<(Vec<Decision>, Vec<Option<Resumed>>), SessionError> {
        let mut decisions = Vec::with_capacity(entries.len());
        // Per file entry: a part file left by an interrupted transfer, and the values of the
        // blocks its journal lists, hashed again now.
        let mut resumes: Vec<Option<Resumed>> = Vec::new();
        for e in entries {
            let target = out.resolve(&e.path)?;
            let existing = if out.known_missing(&target) {
                None
            } else {
                std::fs::symlink_metadata(&target).ok()
            };
            if e.kind == EntryKind::Symlink {
                decisions.push(link_decision(
                    e,
                    existing.as_ref(),
                    &target,
                    self.opts.overwrite,
                ));
                continue;
            }
            let found = match existing {
                None => Found::Nothing,
                Some(m) if m.is_file() => Found::File {
                    len: m.len(),
                    mtime_ns: fs::mtime_ns(&m),
                },
                Some(_) => Found::Other,
            };
            let mut resumed = None;
            decisions.push(match first_look(e, found, checksum, self.opts.overwrite) {
                Look::Decided(d) => d,
                Look::HashExisting { replace_ok } => {
                    let hash = fs::hash_open(&out.open_existing(&e.path)?).map_err(|err| {
                        SessionError::io(format!("read {}", target.display()), err)
                    })?;
                    Look::with_hash(replace_ok, hash)
                }
                Look::LookForPart if dry_run => Look::with_part(None),
                Look::LookForPart => {
                    resumed = Resumed::open(out, e, block_size, self.opts.overwrite)?;
                    Look::with_part(resumed.as_ref().map(Resumed::block_ranges))
                }
            });
            if e.kind == EntryKind::File {
                resumes.push(resumed);
            }
        }
        Ok((decisions, resumes))
    }

    /// The part files of the files to be sent (`None` for the others), created or resumed and
    /// preallocated, and the held blocks' values of the resumed ones. Refuses with
    /// [`fs::StoreError::NoSpace`] a transfer that cannot fit, removing the part files it
    /// created (a resumed one is kept for a later try).
    fn prepare_parts(
        &self,
        out: &fs::OutRoot,
        files: &[&Entry],
        file_decisions: &[&Decision],
        mut resumes: Vec<Option<Resumed>>,
        block_size: u64,
    ) -> Result<PreparedParts, SessionError> {
        let root = out.path();
        let mut held_values: Vec<Vec<(u64, BlockValue)>> = vec![Vec::new(); files.len()];
        let mut parts = Vec::with_capacity(files.len());
        let mut needed = 0;
        let fresh: Vec<&Entry> = files
            .iter()
            .zip(file_decisions)
            .filter(|(_, d)| matches!(d, Decision::SendAll))
            .map(|(e, _)| *e)
            .collect();
        let mut fresh = self.new_parts(out, &fresh, block_size)?.into_iter();
        for (f, (e, d)) in files.iter().zip(file_decisions).enumerate() {
            // Space is needed only for the blocks neither held nor in holes.
            let not_needed = |held: &[(u64, u64)]| {
                fs::bytes_in_blocks(&union_ranges(held, &e.holes), block_size, e.size)
            };
            parts.push(match (d, resumes[f].take()) {
                (Decision::SendAll, _) => {
                    needed += e.size - not_needed(&[]);
                    fresh.next()
                }
                (Decision::Resume { .. }, Some(r)) => {
                    needed += e.size - not_needed(&r.block_ranges());
                    held_values[f] = r.values;
                    Some(r.part)
                }
                _ => None,
            });
        }
        if fs::free_space(root).is_some_and(|free| free < needed) {
            for (p, d) in parts.into_iter().zip(file_decisions) {
                // Best effort: the error below is what matters; a new file holds nothing. A
                // resumed one is kept for a later try.
                if let (Some(p), Decision::SendAll) = (p, d) {
                    let _ = p.discard();
                }
            }
            return Err(fs::StoreError::NoSpace {
                path: root.to_path_buf(),
                needed,
            }
            .into());
        }
        for (p, e) in parts.iter().zip(files) {
            if let Some(p) = p {
                p.preallocate(&e.holes, block_size)?;
            }
        }
        Ok((parts, held_values))
    }

    /// New part files for `entries`, in order, created on up to four threads when there are many:
    /// for a transfer of many small files, creating them is most of what the receiver does
    /// before data moves.
    fn new_parts(
        &self,
        out: &fs::OutRoot,
        entries: &[&Entry],
        block_size: u64,
    ) -> Result<Vec<PartFile>, SessionError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(4).min(entries.len() / PARTS_PER_THREAD).max(1);
        let create = |chunk: &[&Entry]| -> Result<Vec<PartFile>, SessionError> {
            chunk
                .iter()
                .map(|e| self.new_part(out, e, block_size))
                .collect()
        };
        // Consecutive entries mostly share a directory: each thread takes a run of them.
        in_runs(entries, threads, create)
    }

    /// A new part file for `e`. Files of more than one block keep a journal of their verified
    /// blocks, so that an interrupted transfer can resume; a one-block file is sent again.
    fn new_part(
        &self,
        out: &fs::OutRoot,
        e: &Entry,
        block_size: u64,
    ) -> Result<PartFile, SessionError> {
        let mut p = PartFile::create_in(out, &e.path, e.size, self.opts.overwrite)?;
        if e.size > block_size {
            p.keep_journal(block_size)?;
        }
        Ok(p)
    }
}

/// Whether `e` is a link this receiver creates: one whose target stays inside the
/// destination ([`fs::link_escapes`], rsync's `--safe-links` rule).
fn is_safe_link(e: &Entry) -> bool {
    e.kind == EntryKind::Symlink && !fs::link_escapes(&e.path, &e.target)
}

/// How many links of `entries` (paths as written here) this receiver creates or keeps, and how
/// many it refuses because they point outside the destination, each of those a warning that
/// names it.
fn links_refused(entries: &[Entry], warnings: &mut Vec<String>) -> (usize, usize) {
    let (mut made, mut refused) = (0, 0);
    for e in entries.iter().filter(|e| e.kind == EntryKind::Symlink) {
        if is_safe_link(e) {
            made += 1;
        } else {
            refused += 1;
            warnings.push(format!(
                "not creating symlink {} -> {}: it points outside the destination",
                e.path, e.target
            ));
        }
    }
    (made, refused)
}

/// The answer to link entry `e`, with `existing` what is at its path (`path`) here. Nothing is
/// sent for a link either way; a link that points outside the destination is not created
/// (a warning, [`links_refused`]), the same link is left as it is, and anything else in the
/// way is refused as a file in the way is (unless `overwrite`; a directory always).
fn link_decision(
    e: &Entry,
    existing: Option<&std::fs::Metadata>,
    path: &std::path::Path,
    overwrite: bool,
) -> Decision {
    use std::os::unix::ffi::OsStrExt;
    let same = |m: &std::fs::Metadata| {
        m.file_type().is_symlink()
            && std::fs::read_link(path)
                .is_ok_and(|t| t.as_os_str().as_bytes() == e.target.as_bytes())
    };
    match existing {
        _ if !is_safe_link(e) => Decision::SendAll,
        None => Decision::SendAll,
        Some(m) if same(m) => Decision::SendAll,
        Some(m) if m.is_dir() => Decision::Refuse("a directory is in the way of the link".into()),
        Some(_) if !overwrite => Decision::Refuse(
            "it exists on the receiver (receive with --overwrite to replace it)".into(),
        ),
        Some(_) => Decision::SendAll,
    }
}

/// Sends the paths a mirror would delete to the sender, in parts of [`PATHS_PER_PART`] (a
/// dry run's last messages; at least one part, the last).
fn send_extraneous(strays: &[crate::mirror::Stray], tx: &ControlTx) {
    let paths: Vec<String> = strays.iter().map(|s| s.rel_path.clone()).collect();
    let parts: Vec<&[String]> = if paths.is_empty() {
        vec![&[]]
    } else {
        paths.chunks(PATHS_PER_PART).collect()
    };
    let n = parts.len();
    for (i, part) in parts.into_iter().enumerate() {
        // A closed writer shows as the session's end: nothing more to say.
        let _ = tx.send(Control::Extraneous {
            paths: part.to_vec(),
            last: i + 1 == n,
        });
    }
}

/// Paths per `Extraneous` part: at most 4 KiB each, well within a control frame.
const PATHS_PER_PART: usize = 512;

/// Fewest new part files worth a thread of their own.
const PARTS_PER_THREAD: usize = 256;

/// The part files of a transfer's files (`None`: not sent), and the values of the blocks each
/// resumed one holds.
type PreparedParts = (Vec<Option<PartFile>>, Vec<Vec<(u64, BlockValue)>>);

/// The held blocks, by global number with their values (resumed from part files), and the
/// holes of sparse files to hash. The holes' own values come from the hole hasher: a new part
/// file reads as zeros there by construction; a resumed one may hold other bytes, which are
/// made holes again, or read back where the filesystem cannot.
fn held_blocks(
    parts: &[Option<PartFile>],
    holes: &[&[(u64, u64)]],
    mut held_values: Vec<Vec<(u64, BlockValue)>>,
    layout: &Layout,
    block_size: u64,
) -> Result<(HeldValues, Vec<Holes>), SessionError> {
    let mut hole_blocks = Vec::new();
    for (f, h) in holes.iter().enumerate() {
        let Some(part) = parts[f].as_ref().filter(|_| !h.is_empty()) else {
            continue;
        };
        let zeros = part.is_new() || part.punch_holes(h, block_size)?;
        held_values[f].retain(|&(b, _)| !in_ranges(h, b));
        hole_blocks.push(Holes {
            file: f as u32,
            blocks: h.iter().flat_map(|&(a, b)| a..b).collect(),
            zeros,
        });
    }
    // Held blocks, by global number with their values.
    let held: Vec<(u64, BlockValue)> = held_values
        .into_iter()
        .enumerate()
        .flat_map(|(f, values)| {
            let first = layout.blocks_of(f as u32).start;
            values.into_iter().map(move |(index, v)| (first + index, v))
        })
        .collect();
    Ok((held, hole_blocks))
}

/// Each channel's command queue, and the threads that serve the channels (each returns its
/// socket drops and NACKs sent).
type ChannelThreads = (
    Vec<Sender<ChanCmd>>,
    Vec<std::thread::JoinHandle<(u64, u64)>>,
);

/// Held blocks, by global number, with their values.
type HeldValues = Vec<(u64, BlockValue)>;
