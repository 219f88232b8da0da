//! One session from the sender's side, from the dial to the summary ([`send_once`]): the key
//! agreement with the hello, the manifest; the data path opened at the receiver's answer (TCP
//! data connections dialled, [`dial_data`], or UDP sockets bound and probing started:
//! [`open_data_path`]) and the early data on it while the receiver decides; the receiver's
//! decisions and the layout (the channels go on, or start again for another outcome:
//! `ChannelThreads::restart`); the session loop; then the summary.

use super::channel_threads::{
    send_threads, serve_channels, ChannelCmds, ChannelWorker, PACER_CREDIT,
};
use super::options::{user_cap, SendOptions, Transport};
use super::prober::Prober;
use super::session_loop::{on_early_event, session_loop, Dialing, Outcome, UdpPath, Wires};
use super::shared::{ChanCmd, ChanEvent, LoopWake, Shared, ThreadCmd};
use super::summary::{
    BottleneckSummary, BytesByPath, Limits, RateSummary, ResumedSummary, SendSummary,
};
use crate::error::{SessionError, Side};
use crate::fs::SourceFile;
use crate::iobuf::IoBuf;
use crate::net::channel_link::{self, LinkOut, OutPath};
use crate::net::dial::{Dialer, Direct};
use crate::net::feedback::{FeedbackReader, SenderPunch};
use crate::net::punch::SocketPunch;
use crate::net::udp::UdpChannel;
use crate::netlog::NetLog;
use crate::progress::{Phase, Progress, Route};
use crate::report::FileReport;
use crate::setup::{out_of_order, Driver};
use crate::walk::{self, WalkOptions};
use crossbeam_channel::unbounded;
use hurtle_proto::fec::TailGroups;
use hurtle_proto::hash::{to_hex, HashKind};
use hurtle_proto::probe::PayloadProbe;
use hurtle_proto::punch::Role;
use hurtle_proto::rate::{self, PathMemory};
use hurtle_proto::secure::{self, DataKey, PacketSeal};
use hurtle_proto::session::data::{self as phase, SenderData};
use hurtle_proto::session::{
    Accepted, Agreed, SenderEvent, SenderParams, SenderSetup, SetupError, Skipped,
};
use hurtle_proto::wire::{Control, Entry, EntryKind, HEADER_LEN};
use hurtle_proto::{ChannelSender, Pacer, RateConfig, RateController, RateMode, SendConfig};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub(super) fn send_once(
    paths: &[PathBuf],
    to: SocketAddr,
    opts: &SendOptions,
    transport: Transport,
    progress: Arc<Progress>,
) -> Result<SendSummary, SessionError> {
    let start = Instant::now();
    let Plan {
        walked,
        block_size,
        entries,
        mut warnings,
    } = plan(paths, opts)?;
    let opts = &SendOptions {
        block_size,
        ..opts.clone()
    };
    let files: Vec<&walk::SourceEntry> = walked
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .collect();
    let dirs = walked
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::Dir)
        .count();
    progress
        .total
        .store(files.iter().map(|f| f.size).sum(), Ordering::Relaxed);

    // The sources are opened while the connection and the agreement are made (for many
    // files, that takes a while); the early data needs them.
    let opening = {
        let paths: Vec<PathBuf> = files.iter().map(|f| f.abs_path.clone()).collect();
        let holes = entries.iter().filter(|e| e.kind == EntryKind::File);
        let holes: Vec<Vec<(u64, u64)>> = holes.map(|e| e.holes.clone()).collect();
        std::thread::Builder::new()
            .name("open".into())
            .spawn(move || {
                paths
                    .iter()
                    .zip(holes)
                    .map(|(p, h)| SourceFile::open(p).map(|s| s.with_holes(h)))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| SessionError::io("open thread", e))?
    };
    progress.set_address(to);
    progress.set_phase(Phase::Connecting);
    let secret = opts.secret.as_ref().ok_or(SessionError::NoSecret)?;
    let mut stream = dial(opts, to)?;
    progress.set_phase(Phase::SettingUp);
    let session: u32 = rand::random::<u32>() | 1;
    let mut machine = SenderSetup::new(
        SenderParams {
            channels: opts.channels.max(1),
            payload: opts.payload,
            block_size: opts.block_size,
            session,
            tcp: transport == Transport::Tcp,
            // With `auto`, the channels may move to TCP if UDP does not get through.
            race: opts.transport == Transport::Auto,
            checksum: opts.checksum,
        },
        entries,
        Instant::now(),
    );
    if opts.dry_run {
        machine = machine.dry_run();
    }
    if opts.delete {
        machine = machine.mirror(opts.filter.to_wire(), opts.mirror_root);
    }
    // The hello goes with the agreement's offer; the receiver's answer brings its `HelloAck`.
    let handshake_timeout = Duration::from_secs(10);
    let agree_at = Instant::now();
    let keys = crate::handshake::offer_checked(
        &mut stream,
        secret,
        opts.no_encryption,
        &machine.hello(),
        handshake_timeout,
        &mut |receiver| {
            let known = opts.known_receivers.as_ref();
            crate::identity::pin(known, &to.to_string(), receiver, &mut warnings)
        },
    )?;
    let rtt = agree_at.elapsed();
    // The key agreement's timing is an upper bound of the path's round trip (both sides'
    // CPU, and on a busy host their waits for a core, are in it): the probes' answers lower
    // the controller's, never below the kernel's floor (at the data phase's start, and in the
    // session loop).
    let mut path_rtt = rate::rtt::PathRtt::new(rtt, crate::handshake::kernel_floor(&stream));
    // The session loop's wake-up, polled beside the feedback sockets: the control
    // connection's reader rings it for each message, the channel threads for their events.
    let bell =
        Arc::new(crate::net::bell::Bell::new().map_err(|e| SessionError::io("wake-up socket", e))?);
    let (rx, tx, writer) = crate::net::control::open_ringing(
        &stream,
        opts.stall_timeout,
        (keys.frames_out, keys.frames_in),
        Some(bell.clone()),
    )
    .map_err(|e| SessionError::io("control connection", e))?;
    let path = DataPath {
        to,
        transport,
        session,
        key: keys.data.clone(),
        seal: keys.encrypt_data.then(|| keys.data.sealer()),
    };
    // The manifest goes at once (the first wait sends it).
    let mut setup = Driver::new(machine, &rx, &tx, Side::Receiver);
    let accepted = match setup.next()? {
        SenderEvent::Accepted(a) => a,
        other => return Err(out_of_order(other, "before the receiver's answer")),
    };
    if opts.dry_run {
        let ceiling = accepted.rate_ceiling;
        let ctl = controller(opts, transport, ceiling, accepted.max_payload, rtt);
        let plan = dry_run(setup, &files, opts, (&rx, &tx))?;
        drop(tx);
        let _ = writer.join();
        let _ = stream.shutdown(std::net::Shutdown::Write);
        warnings.extend(
            plan.deleted
                .iter()
                .map(|p| format!("{}{p}", crate::mirror::DELETING)),
        );
        let seconds = start.elapsed().as_secs_f64();
        return Ok(SendSummary {
            bytes: 0,
            resumed_bytes: 0,
            sparse_bytes: 0,
            resume_blocks_cached: 0,
            resume_blocks_read: 0,
            files: files.len(),
            skipped: plan.skipped.iter().filter(|s| s.is_skipped()).count(),
            encrypted: path.seal.is_some(),
            dirs,
            seconds,
            goodput_bps: 0.0,
            datagrams_sent: 0,
            datagrams_resent: 0,
            parity_sent: 0,
            resent_share: 0.0,
            nacks: 0,
            sender_late_ms: 0.0,
            sender_lost_ms: 0.0,
            feedback_datagrams: 0,
            channels: accepted.channels(),
            transport: transport.as_str(),
            payload: accepted.max_payload,
            fallback_seconds: None,
            direct_after_seconds: None,
            direct_channels: 0,
            bytes_by_path: BytesByPath::default(),
            rtt_ms: rtt.as_secs_f64() * 1e3,
            first_data_ms: None,
            new_data_sent_ms: None,
            rate: RateSummary::new(&ctl, start, ceiling, opts.rate_bps),
            bottleneck: None,
            receiver_rejected: 0,
            receiver_socket_drops: 0,
            warnings,
            file_hashes: files
                .iter()
                .zip(&plan.skipped)
                .map(|(f, s)| FileReport {
                    path: f.rel_path.clone(),
                    size: f.size,
                    blake3: s.kept_hash().map(|h| to_hex(&h)).unwrap_or_default(),
                    hash: HashKind::with_holes(false).name(),
                    skipped: s.is_skipped(),
                })
                .collect(),
        });
    }
    let receiver_ceiling = accepted.rate_ceiling;
    let channels = accepted.channels();
    let DataLinks {
        links,
        payload,
        mut prober,
        fallback,
        feedback_socks,
        feedback_from,
        relayed,
    } = open_data_path(&path, opts, &accepted, rtt, &mut warnings)?;
    // Which way each channel's bytes go, counted as they are sent: through the relay's UDP
    // port until a channel moves to a punched path; through the relay's splice over TCP.
    // (Direct, where no relay is, needs no saying: the progress line shows no path.)
    let relayed_tcp = opts.dialer.as_ref().is_some_and(|d| d.relayed());
    if relayed.is_some() {
        progress.set_routes(channels, Route::RelayUdp);
    } else if relayed_tcp {
        progress.set_routes(channels, Route::RelayTcp);
    }
    let sources = opening
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
    let mut controller = controller(opts, transport, receiver_ceiling, payload, rtt);
    controller.set_channels(channels);
    controller.set_report_pace(rate::ReportPace::heard_on(rtt, path_rtt.floor()));
    let resumed = resume(&mut controller, opts, to, path_rtt.range());

    // Early data: the provisional outcome (every file whole) goes out now, while the receiver
    // decides, within a budget; if the outcome is another, the channels start again below.
    let provisional = setup
        .machine
        .provisional()
        .unwrap_or(Err(SetupError::Driver("no outcome after the answer")))
        .map_err(SessionError::Setup)?;
    // A mirror sends nothing before the receiver's decisions: a receiver that does not allow
    // deletion refuses the session before any data moves.
    let budget = if opts.delete {
        0
    } else {
        early_budget(controller.rate_bps(), rtt, channels, &accepted)
    };
    let shared = Arc::new(Shared {
        layout: provisional.layout,
        sources,
        session,
        payload: AtomicU16::new(payload),
        max_payload: AtomicU16::new(prober.as_ref().map_or(payload, |p| p.probe.max_payload())),
        start,
        progress: progress.clone(),
        rate_bps: AtomicU64::new(controller.rate_bps()),
        rate_ceiling_bps: controller.config().ceiling_bps,
        start_floor_bps: opts.start_rate_bps,
        channels,
        first_data_us: AtomicU64::new(u64::MAX),
        new_data_sent_us: AtomicU64::new(0),
        early_left: AtomicU64::new(budget),
        sending: AtomicU16::new(0),
        limits: (transport != Transport::Tcp).then(|| Limits {
            cap_bps: user_cap(opts),
            receiver_ceiling_bps: receiver_ceiling,
            receiver_buffer: accepted.buffer_cap,
        }),
        receiver_signs: Default::default(),
        rtt_us: AtomicU64::new(u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1)),
        fec: opts.fec,
        loss_ppm: AtomicU32::new(u32::MAX),
        lost_nothing: AtomicBool::new(false),
        catch_up_us: AtomicU64::new(controller.catch_up().as_micros() as u64),
        train_bytes: AtomicU64::new(controller.train_bytes()),
        queue_delay_us: AtomicU64::new(0),
        cached: (0..files.len()).map(|_| Default::default()).collect(),
        value_cache: opts.value_cache.clone(),
        values: Default::default(),
        resume_cached: AtomicU64::new(0),
        resume_read: AtomicU64::new(0),
        loop_wake: LoopWake::new(bell),
    });
    progress
        .rate_bps
        .store(controller.rate_bps(), Ordering::Relaxed);
    let logs = (opts.log_dir.as_deref(), start);
    let carried = links.into_iter().map(Carried::new).collect();
    let mut channel_threads = ChannelThreads::start(
        &shared,
        carried,
        provisional.held.stripes,
        controller.rate_bps(),
        rtt,
        logs,
    )?;

    // The receiver may take a while (hashing files it already has, preallocating big ones); it
    // sends keep-alives meanwhile, and each one restarts the wait. Hashing our copies of the
    // files it has can take a while too (a big file from a slow disk): the receiver waits for
    // the answer, so keep the connection alive meanwhile. The early data's block values go to
    // the receiver as they are read.
    let data_path = if fallback.is_some() {
        phase::DataPath::UdpOrTcp
    } else if transport == Transport::Tcp {
        phase::DataPath::Tcp
    } else {
        phase::DataPath::Udp
    };
    let mut early_state = SenderData::new(
        &shared.layout,
        (session, channels),
        &vec![None; files.len()],
        (data_path, opts.stall_timeout),
        Instant::now(),
    );
    let mut alive = None;
    let agreed = loop {
        let event = setup.next_beside(&channel_threads.events, |ev| {
            on_early_event(&mut early_state, &shared, &tx, ev)
        })?;
        match event {
            SenderEvent::ProbeAck { channel, size } => {
                if let Some(prober) = &mut prober {
                    prober
                        .probe
                        .on_ack(channel, usize::from(size), Instant::now());
                }
            }
            SenderEvent::HashWanted { file } => {
                alive.get_or_insert_with(|| crate::net::control::KeepAlive::start(tx.clone()));
                let path = &files[file as usize].abs_path;
                let mine = crate::fs::hash_file(path)
                    .map_err(|e| SessionError::io(format!("read {}", path.display()), e))?;
                if let Err(e) = setup.act(|m| m.hashed(file, mine)) {
                    // The receiver waits for our answer to its offer: tell it why not, and
                    // let the writer send that before this side ends (every end of its queue
                    // goes, so that it ends).
                    let _ = tx.send(e.to_abort(Side::Sender));
                    drop(alive);
                    drop(tx);
                    let _ = writer.join();
                    return Err(e);
                }
            }
            SenderEvent::Ready => break setup.machine.agreed(),
            SenderEvent::Accepted(_) => {}
        }
    };
    drop(alive);
    let agreed = agreed.ok_or(SessionError::Setup(SetupError::Driver(
        "ready without an outcome",
    )))?;
    let skipped: Vec<Option<[u8; 32]>> = agreed.skips.iter().map(|s| s.kept_hash()).collect();
    // Of those, the ones skipped on size and modification time, unread: no hash to report.
    let unchecked: Vec<bool> = agreed
        .skips
        .iter()
        .map(|s| *s == Skipped::Unchecked)
        .collect();
    let sent_bytes = agreed.sent_bytes;
    progress.set_files(files.iter().map(|f| f.rel_path.clone()).collect());
    // Skipped files take no room in the layout, and the stripe ranges the receiver already
    // holds (resumed blocks, the holes of sparse files) are not sent: both sides agreed on
    // the same ones.
    let Agreed {
        layout,
        held,
        early,
        session: data_session,
        ..
    } = agreed;
    let (held_bytes, resumed_bytes, sparse_bytes) =
        (held.bytes(), held.resumed_bytes, held.hole_bytes);
    progress
        .total
        .store(sent_bytes - held_bytes, Ordering::Relaxed);
    progress.resumed.store(resumed_bytes, Ordering::Relaxed);
    // The probes' answers that came during the set-up; those that come later, in the session
    // loop. The channel threads take the lowered round trip too: at once through `shared`,
    // and in their repair timers where they start again below.
    let probed = prober.as_ref().and_then(|p| p.probe.rtt());
    if let Some(lower) = probed.and_then(|s| path_rtt.sample(s)) {
        controller.set_rtt(lower);
        shared.lower_rtt(lower);
        // The first rate is the initial window per round trip: the path's, not the key
        // agreement's, which both sides' CPU inflates on a short path.
        let _ = shared.raise_start(&mut controller);
    }
    let (shared, mut state) = if early {
        // The early data counts: the channels go on, without a budget now, and the values
        // of their blocks passed on so far stand.
        shared.early_left.store(u64::MAX, Ordering::Relaxed);
        channel_threads.wake();
        (shared, early_state)
    } else {
        // Another layout, under the next session id: the channels start again.
        progress.sent.store(0, Ordering::Relaxed);
        let shared = channel_threads.restart(
            shared,
            (layout, data_session),
            held.stripes,
            (controller.rate_bps(), path_rtt.get()),
            logs,
        )?;
        if let Some(prober) = &mut prober {
            prober.session = data_session;
        }
        let state = SenderData::new(
            &shared.layout,
            (data_session, channels),
            &skipped,
            (data_path, opts.stall_timeout),
            Instant::now(),
        );
        (shared, state)
    };
    if let Some(prober) = &mut prober {
        // The deadline runs from here: probing can only find UDP blocked in the data phase
        // (`probe_step`), where the caller's fallback to TCP is handled too.
        let now = Instant::now();
        prober.probe.receiver_ready(now);
        prober.send_due(now);
    }
    progress.set_phase(Phase::Moving);
    // The receiver's reports and NACKs, also as datagrams from its data session on, read by
    // the session loop. Through a relay, each channel tries for a direct path to the
    // receiver's socket (hole punching) and moves there when it has one; the reader of the
    // channel sockets does it.
    let direct_at: Arc<std::sync::Mutex<Vec<Option<f64>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; usize::from(channels)]));
    let mut feedback = (!feedback_socks.is_empty()).then(|| {
        let punch = relayed.as_ref().map(|relay| {
            punching(
                relay,
                keys.punch,
                channel_threads.by_channel.clone(),
                (direct_at.clone(), start),
            )
        });
        let key = (&keys.feedback, data_session);
        match punch {
            Some(p) => FeedbackReader::punching(feedback_socks, feedback_from, key, p),
            None => FeedbackReader::new(feedback_socks, feedback_from, key.0, key.1),
        }
    });

    let mut rate_log = NetLog::open_named(opts.log_dir.as_deref(), "send-rate.log", start)
        .map_err(|e| SessionError::io("log directory", e))?;
    rate_log.line(|| {
        let cfg = controller.config();
        let ms = |d: Option<Duration>| d.map_or(-1.0, |d| d.as_secs_f64() * 1e3);
        format!(
            "start mode={:?} rate_mbps={:.1} ceiling_mbps={:.1} rtt_ms={:.2} delay_target_ms={:.1} report_every_ms={:.1} handshake_ms={:.2} probe_ms={:.2} floor_ms={:.3}",
            cfg.mode,
            controller.rate_bps() as f64 / 1e6,
            cfg.ceiling_bps as f64 / 1e6,
            cfg.rtt.as_secs_f64() * 1e3,
            cfg.delay_target().as_secs_f64() * 1e3,
            rate::report_interval(rtt).as_secs_f64() * 1e3,
            rtt.as_secs_f64() * 1e3,
            ms(probed),
            ms(path_rtt.floor()),
        )
    });
    let data_started = Instant::now();
    state.begin(data_started, Some(controller));
    let mut udp = UdpPath {
        prober,
        fallback,
        rtt: path_rtt,
    };
    let mut fallback_seconds = None;
    let result = loop {
        let wires = Wires {
            rx: &rx,
            events: &channel_threads.events,
            tx: &tx,
            cmds: &channel_threads.by_channel,
        };
        let outcome = session_loop(
            &shared,
            &files,
            &wires,
            &mut rate_log,
            &mut state,
            &mut udp,
            feedback.as_mut(),
        );
        let (silent, why) = match outcome {
            Ok(Outcome::Done) => break Ok(()),
            Ok(Outcome::MoveToTcp { silent, why }) => (silent, why),
            Err(e) => break Err(e),
        };
        // UDP does not get through: every channel goes on over its TCP data connection,
        // dialled while UDP was tried.
        let dials = udp.fallback.take().unwrap_or_default();
        let links = match tcp_links(dials, &path) {
            Ok(links) => links,
            Err(e) => break Err(e),
        };
        let _ = tx.send(Control::Fallback);
        if let Err(e) = channel_threads.relink(&shared, links, &silent) {
            break Err(e);
        }
        udp.prober = None;
        let controller = self::controller(opts, Transport::Tcp, receiver_ceiling, payload, rtt);
        shared
            .rate_bps
            .store(controller.rate_bps(), Ordering::Relaxed);
        // (TCP connections pace themselves: no startup trains.)
        shared
            .train_bytes
            .store(controller.train_bytes(), Ordering::Relaxed);
        progress
            .rate_bps
            .store(controller.rate_bps(), Ordering::Relaxed);
        state.moved_to_tcp(Instant::now(), Some(controller));
        let lost = data_started.elapsed().as_secs_f64();
        fallback_seconds = Some(lost);
        if relayed_tcp {
            progress.set_routes(channels, Route::RelayTcp);
        }
        rate_log.line(|| format!("moved to TCP after {lost:.3} s: {why}"));
        warnings.insert(
            0,
            format!("UDP did not get through ({why}); the channels moved to parallel TCP after {lost:.1} s, counted in the time"),
        );
    };
    let (sent, resent, nacks, parity_sent, (late, lost)) = channel_threads.stop();
    // A session that ends before its files leaves their values for the next one to take
    // instead of reading what the receiver then holds (`value_cache`).
    if result.is_err() {
        if let Some(e) = shared.keep_values() {
            rate_log.line(|| e);
        }
    }
    match &result {
        Ok(_) => {
            let _ = tx.send(Control::Done);
        }
        Err(e) if !e.peer_knows() => {
            let _ = tx.send(e.to_abort(Side::Sender));
        }
        Err(_) => {}
    }
    drop(tx);
    let _ = writer.join();
    // A FIN right behind the last message, so that the receiver reads it before anything of
    // ours could reset the connection.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    result?;
    let moved = state.path() == phase::DataPath::Tcp && transport != Transport::Tcp;
    let (
        phase::SenderFinish {
            hashes,
            rejected,
            drops,
        },
        controller,
    ) = state.finish();
    let controller = controller.ok_or(SessionError::Internal(
        "a data phase without its controller",
    ))?;
    // What this transfer learnt of the path, for the next one to this receiver (a transfer
    // never fails for it: the log says why it could not be kept).
    if let (Some(memories), Some(memory)) = (&opts.path_memory, PathMemory::of(&controller)) {
        if let Err(e) = memories.remember(to.ip(), memory, SystemTime::now()) {
            rate_log.line(|| {
                format!(
                    "cannot keep the path's memory in {}: {e}",
                    memories.file().display()
                )
            });
        }
    }
    let transport = if moved { Transport::Tcp } else { transport };
    let direct_moves = direct_at.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let seconds = start.elapsed().as_secs_f64();
    Ok(SendSummary {
        bytes: sent_bytes,
        resumed_bytes,
        sparse_bytes,
        resume_blocks_cached: shared.resume_cached.load(Ordering::Relaxed),
        resume_blocks_read: shared.resume_read.load(Ordering::Relaxed),
        files: files.len(),
        skipped: skipped.iter().filter(|s| s.is_some()).count(),
        encrypted: path.seal.is_some(),
        dirs,
        seconds,
        goodput_bps: (sent_bytes - held_bytes) as f64 * 8.0 / seconds.max(1e-9),
        datagrams_sent: sent,
        datagrams_resent: resent,
        parity_sent,
        resent_share: if sent == 0 {
            0.0
        } else {
            resent as f64 / sent as f64
        },
        nacks,
        sender_late_ms: late.as_secs_f64() * 1e3,
        sender_lost_ms: lost.as_secs_f64() * 1e3,
        feedback_datagrams: feedback
            .as_ref()
            .map_or(0, |f| f.counts.received.load(Ordering::Relaxed)),
        channels,
        transport: transport.as_str(),
        payload: shared.payload.load(Ordering::Relaxed),
        fallback_seconds,
        direct_after_seconds: direct_moves.iter().flatten().copied().reduce(f64::min),
        direct_channels: direct_moves.iter().flatten().count(),
        bytes_by_path: BytesByPath::from_routes(progress.route_bytes()),
        rtt_ms: rtt.as_secs_f64() * 1e3,
        first_data_ms: match shared.first_data_us.load(Ordering::Relaxed) {
            u64::MAX => None,
            us => Some(us as f64 / 1e3),
        },
        new_data_sent_ms: match shared.new_data_sent_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(us as f64 / 1e3),
        },
        rate: RateSummary {
            resumed,
            ..RateSummary::new(&controller, start, receiver_ceiling, opts.rate_bps)
        },
        bottleneck: shared.limits.filter(|_| !moved).map(|limits| {
            BottleneckSummary::new(
                &controller,
                sent as f64
                    * (HEADER_LEN + usize::from(shared.payload.load(Ordering::Relaxed))) as f64
                    * 8.0,
                limits,
                shared.signs(),
            )
        }),
        receiver_rejected: rejected,
        receiver_socket_drops: drops,
        warnings,
        file_hashes: files
            .iter()
            .zip(hashes)
            .zip(&skipped)
            .zip(&unchecked)
            .enumerate()
            .map(|(i, (((f, h), k), &u))| FileReport {
                path: f.rel_path.clone(),
                size: f.size,
                blake3: if u { String::new() } else { to_hex(&h) },
                hash: HashKind::with_holes(k.is_none() && shared.sources[i].has_announced_holes())
                    .name(),
                skipped: k.is_some(),
            })
            .collect(),
    })
}

/// What a dry run found: per file, whether it would be skipped; the paths a mirror would
/// delete.
struct DryRun {
    skipped: Vec<Skipped>,
    deleted: Vec<String>,
}

/// The rest of a dry run's set-up (`-n`): the receiver's decisions, the hashes it asks for,
/// and with a mirror the paths it would delete ([`Control::Extraneous`]), no data.
fn dry_run(
    mut setup: Driver<'_, SenderSetup>,
    files: &[&walk::SourceEntry],
    opts: &SendOptions,
    (rx, tx): (
        &crate::net::control::Incoming,
        &crate::net::control::ControlTx,
    ),
) -> Result<DryRun, SessionError> {
    let mut alive = None;
    let agreed = loop {
        match setup.next()? {
            SenderEvent::HashWanted { file } => {
                alive.get_or_insert_with(|| crate::net::control::KeepAlive::start(tx.clone()));
                let path = &files[file as usize].abs_path;
                let mine = crate::fs::hash_file(path)
                    .map_err(|e| SessionError::io(format!("read {}", path.display()), e))?;
                if let Err(e) = setup.act(|m| m.hashed(file, mine)) {
                    let _ = tx.send(e.to_abort(Side::Sender));
                    return Err(e);
                }
            }
            SenderEvent::Ready => break setup.machine.agreed(),
            SenderEvent::Accepted(_) | SenderEvent::ProbeAck { .. } => {}
        }
    };
    drop(alive);
    let agreed = agreed.ok_or(SessionError::Setup(SetupError::Driver(
        "ready without an outcome",
    )))?;
    let mut deleted = Vec::new();
    let mut done = false;
    while opts.delete && !done {
        let msg = match rx.recv_timeout(opts.stall_timeout) {
            Ok(msg) => msg?,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                return Err(crate::net::control::ControlError::Timeout(opts.stall_timeout).into())
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                return Err(crate::net::control::ControlError::Closed.into())
            }
        };
        match msg {
            Control::KeepAlive => {}
            Control::Extraneous { paths, last } => {
                if deleted.len() + paths.len() > crate::mirror::MAX_EXTRANEOUS {
                    return Err(SessionError::Setup(SetupError::Driver(
                        "more paths to delete than a mirror lists",
                    )));
                }
                deleted.extend(paths);
                done = last;
            }
            other => {
                return Err(SessionError::unexpected(
                    Side::Receiver,
                    other,
                    "Extraneous",
                ))
            }
        }
    }
    Ok(DryRun {
        skipped: agreed.skips,
        deleted,
    })
}

/// Where a session's data goes and how it is sealed.
struct DataPath {
    to: SocketAddr,
    transport: Transport,
    session: u32,
    key: DataKey,
    /// `None` when both sides asked for data in the clear.
    seal: Option<PacketSeal>,
}

/// The data path to the receiver's ports, of its address family, at its `HelloAck` (the early
/// data goes at once): TCP data connections dialled and connected, or UDP sockets bound with
/// their probes on their way (and, with `--transport auto`, TCP data connections dialled
/// beside them in case UDP does not get through).
fn open_data_path(
    path: &DataPath,
    opts: &SendOptions,
    accepted: &Accepted,
    rtt: Duration,
    warnings: &mut Vec<String>,
) -> Result<DataLinks, SessionError> {
    let to = path.to;
    let channels = accepted.channels();
    let bind_ip: IpAddr = if to.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let mut dests: Vec<SocketAddr> = accepted
        .ports
        .iter()
        .take(usize::from(channels))
        .map(|&p| SocketAddr::new(to.ip(), p))
        .collect();
    if path.transport == Transport::Tcp {
        let links = tcp_links(dial_data(opts, &dests, path.session, &path.key), path)?;
        let max_payload = accepted.max_payload;
        return Ok(DataLinks {
            links,
            payload: channel_link::TCP_PAYLOAD.min(max_payload.max(channel_link::TCP_PAYLOAD)),
            prober: None,
            fallback: None,
            feedback_socks: Vec::new(),
            feedback_from: to.ip(),
            relayed: None,
        });
    }
    // Through a relay, on IPv6 as well as IPv4: a direct path may be punched to either.
    let udps = if opts.dialer.as_ref().is_some_and(|d| d.relayed()) {
        UdpChannel::bind_channels_dual_stack(channels, warnings)?
    } else {
        UdpChannel::bind_channels(bind_ip, channels, warnings)?
    };
    let clones = || {
        udps.iter()
            .map(UdpChannel::try_clone_socket)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SessionError::io("UDP socket", e))
    };
    let (socks, feedback_socks) = (clones()?, clones()?);
    // Through a relay that forwards datagrams: every channel sends to it, once its socket has
    // bound its end of the channel's allocation there. A relay that cannot leaves the data to
    // the TCP splice (with `auto`, when UDP is found silent).
    let mut feedback_from = to.ip();
    let mut relayed = None;
    if let Some(relay) = opts.dialer.as_ref().and_then(|d| d.udp_relay(channels)) {
        match relay {
            Ok(relay) => {
                // An answer takes a round trip to the relay, less than the session's through
                // it: a few of those, at least four rounds of binds, is long enough; a relay
                // whose UDP port is blocked costs no more before the data starts (a channel
                // still unbound goes on binding beside the data: `punching`).
                let wait = (rtt * 4).clamp(BIND_WAIT_MIN, BIND_WAIT_MAX);
                let unbound = relay.bind(&socks, wait);
                if !unbound.is_empty() {
                    warnings.push(format!(
                        "the relay did not confirm UDP for {}",
                        hurtle_proto::session::data::channel_list(&unbound)
                    ));
                }
                dests = vec![relay.addr; usize::from(channels)];
                feedback_from = relay.addr.ip();
                relayed = Some(relay);
            }
            Err(e) => warnings.push(format!("no UDP through the relay: {e}")),
        }
    }
    // A path punched to the receiver's IPv6 addresses (this host has some: the sockets offer
    // them) carries 20 bytes less per datagram than IPv4 on the same links: datagrams that fit
    // it from the start, since a channel that moves keeps its size.
    let mut wanted = opts.payload.min(accepted.max_payload);
    if relayed.is_some()
        && socks
            .first()
            .is_some_and(|s| !crate::net::punch::local_v6_candidates(s).is_empty())
    {
        wanted = wanted.min(hurtle_proto::wire::IPV6_1500_PAYLOAD);
    }
    let mut prober = Prober {
        probe: PayloadProbe::new(wanted, channels, rtt, Instant::now()),
        socks,
        dests,
        session: path.session,
        packets: secure::PacketNumbers::probes(),
        seal: path.seal.clone(),
    };
    prober.send_due(Instant::now());
    // The race: the TCP data connections are dialled at once beside UDP, so that they are
    // there if UDP does not get through (the receiver keeps them waiting until then).
    let fallback = accepted.tcp_port.map(|port| {
        let dests = vec![SocketAddr::new(to.ip(), port); usize::from(channels)];
        dial_data(opts, &dests, path.session, &path.key)
    });
    // A direct session's channels only ever talk to the receiver's port of each: connected
    // there, their sends skip the route lookup. (Through a relay the punching needs the
    // sockets to hear other addresses: those stay unconnected.)
    let direct = relayed.is_none() && !opts.dialer.as_ref().is_some_and(|d| d.relayed());
    let links = udps
        .into_iter()
        .zip(prober.dests.clone())
        .map(|(mut sock, dest)| {
            // (A socket that cannot be connected sends with the address.)
            if direct {
                let _ = sock.connect(dest);
            }
            LinkOut::new(OutPath::Udp { sock, dest }, path.seal.clone())
        })
        .collect();
    Ok(DataLinks {
        links,
        payload: prober.probe.payload(),
        prober: Some(prober),
        fallback,
        feedback_socks,
        feedback_from,
        relayed,
    })
}

/// The shortest and the longest the channels wait for the relay to confirm their binds
/// before the data starts.
const BIND_WAIT_MIN: Duration = Duration::from_millis(600);
const BIND_WAIT_MAX: Duration = Duration::from_secs(2);

/// Each channel socket's try for a direct path past `relay` (hole punching with `key`): a
/// punched path moves the channel there (`cmds`) and is noted in `direct_at` as seconds from
/// `start`. (The channel counts its bytes as direct from the moment it sends there: see
/// `ChanCmd::Redirect`.)
fn punching(
    relay: &crate::net::dial::UdpRelay,
    key: [u8; 32],
    cmds: Vec<ChannelCmds>,
    (direct_at, start): (Arc<std::sync::Mutex<Vec<Option<f64>>>>, Instant),
) -> SenderPunch {
    let now = Instant::now();
    let sockets = relay
        .binds
        .iter()
        .map(|b| SocketPunch::new((relay.addr, b.clone(), relay.parse), Role::Sender, key, now))
        .collect();
    let on_direct = Box::new(move |ch: u16, addr: SocketAddr| {
        if let Some(c) = cmds.get(usize::from(ch)) {
            let _ = c.send(ThreadCmd::Channel(ch, ChanCmd::Redirect(addr)));
        }
        let mut at = direct_at.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = at.get_mut(usize::from(ch)) {
            slot.get_or_insert(start.elapsed().as_secs_f64());
        }
    });
    SenderPunch { sockets, on_direct }
}

/// The data path to the receiver: what [`open_data_path`] opened.
struct DataLinks {
    /// Each channel's link.
    links: Vec<LinkOut>,
    /// The payload to start with.
    payload: u16,
    /// The probing that goes on beside the data (UDP only).
    prober: Option<Prober>,
    /// The TCP data connections being dialled in case UDP does not get through (UDP with
    /// `--transport auto` only).
    fallback: Option<Vec<Dialing>>,
    /// Clones of the channel sockets, for the feedback reader (UDP only).
    feedback_socks: Vec<std::net::UdpSocket>,
    /// Where the receiver's feedback datagrams come from: its IP, or a relay's.
    feedback_from: IpAddr,
    /// The relay the datagrams go through, if they do.
    relayed: Option<crate::net::dial::UdpRelay>,
}

/// The TCP data connections once dialled, one link per channel.
fn tcp_links(dialing: Vec<Dialing>, path: &DataPath) -> Result<Vec<LinkOut>, SessionError> {
    let mut links = Vec::with_capacity(dialing.len());
    for d in dialing {
        let s = d
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        links.push(LinkOut::new(OutPath::Tcp(s), path.seal.clone()));
    }
    Ok(links)
}

/// The rate controller: the user's mode and cap, the receiver's ceiling, a start from the
/// RTT. TCP has congestion control of its own: no pacing beyond the user's cap.
fn controller(
    opts: &SendOptions,
    transport: Transport,
    receiver_ceiling: u64,
    payload: u16,
    rtt: Duration,
) -> RateController {
    let ceiling = match (opts.rate_mode, receiver_ceiling) {
        (RateMode::Fixed, _) | (_, 0) => opts.rate_bps,
        (_, r) => opts.rate_bps.min(r),
    };
    let (rate_mode, ceiling) = if transport == Transport::Tcp {
        (
            RateMode::Fixed,
            if opts.rate_bps >= 100_000_000_000 {
                1_000_000_000_000
            } else {
                opts.rate_bps
            },
        )
    } else {
        (opts.rate_mode, ceiling)
    };
    RateController::new(
        RateConfig {
            mode: rate_mode,
            ceiling_bps: ceiling,
            // Capped by the user's --rate through the ceiling.
            start_bps: rate::initial_rate(opts.start_rate_bps, payload, rtt),
            min_bps: 1_000_000,
            rtt,
        },
        Instant::now(),
    )
}

/// Starts `controller` from what the last transfer to this receiver learnt of the path, if
/// the options keep path memories and that one still fits the path, whose round trip lies in
/// `range` (the kernel's floor to the key agreement's timing: [`rate::rtt::PathRtt::range`]).
fn resume(
    controller: &mut RateController,
    opts: &SendOptions,
    to: SocketAddr,
    range: (Duration, Duration),
) -> Option<ResumedSummary> {
    let (memory, age) = opts
        .path_memory
        .as_ref()?
        .recall(to.ip(), SystemTime::now())?;
    controller.resume_within(&memory, age, range)?;
    Some(ResumedSummary {
        remembered_bps: memory.bottleneck_bps,
        remembered_rtt_ms: memory.rtt.as_secs_f64() * 1e3,
        age_s: age.as_secs(),
    })
}

/// The channel threads of a session: each serves a share of the channels, sending their
/// stripes at the pace the session loop sets.
struct ChannelThreads {
    /// What the channels report to the session loop.
    events: crossbeam_channel::Receiver<ChanEvent>,
    /// Per channel, the commands of the thread that serves it.
    by_channel: Vec<ChannelCmds>,
    threads: Vec<ChannelCmds>,
    handles: Vec<std::thread::JoinHandle<Vec<ChannelWorker>>>,
}

impl ChannelThreads {
    /// Starts the threads over the channels' links (`carried`, one per channel in order),
    /// each channel holding its `held` stripes, at `rate_bps` in all; `logs` is the log
    /// directory, if any, and the session's start.
    fn start(
        shared: &Arc<Shared>,
        carried: Vec<Carried>,
        mut held: Vec<Vec<std::ops::Range<u64>>>,
        rate_bps: u64,
        rtt: Duration,
        logs: (Option<&std::path::Path>, Instant),
    ) -> Result<ChannelThreads, SessionError> {
        let (ev_tx, events) = unbounded::<ChanEvent>();
        let per_channel_rate = (rate_bps / u64::from(shared.channels)).max(100_000);
        let send_cfg = SendConfig::for_rtt(rtt);
        let mut workers = Vec::with_capacity(carried.len());
        for (ch, Carried { link, packets, log }) in carried.into_iter().enumerate() {
            let ch = ch as u16;
            let log = match log {
                Some(log) => log,
                None => NetLog::open(logs.0, "send", ch, logs.1)
                    .map_err(|e| SessionError::io("log directory", e))?,
            };
            let mut sender = ChannelSender::new(&shared.layout, ch, send_cfg.clone());
            for stripe in held[usize::from(ch)].drain(..) {
                sender.hold(stripe);
            }
            workers.push(ChannelWorker {
                ch,
                link,
                sender,
                pacer: Pacer::new(per_channel_rate, PACER_CREDIT),
                shared: shared.clone(),
                events: ev_tx.clone(),
                log,
                packets,
                rate_seen: rate_bps,
                catch_up_seen: hurtle_proto::channel_send::MAX_OWED.as_micros() as u64,
                rtt_seen: shared.rtt(),
                among: shared.channels,
                sending: false,
                loaded: None,
                valued: None,
                block_buf: IoBuf::new(shared.layout.block_size() as usize),
                sent: 0,
                resent: 0,
                groups: TailGroups::new(),
                parity_sent: 0,
                held_valuer: None,
            });
        }
        drop(ev_tx);
        // The rate is shared among the channels with new data to send.
        let mut sending = 0;
        for w in workers.iter_mut().filter(|w| w.sender.new_remaining() > 0) {
            w.sending = true;
            sending += 1;
        }
        shared.sending.store(sending, Ordering::Relaxed);
        Self::spawn(workers, events)
    }

    /// Runs `workers` on threads, as many as [`send_threads`] says for their links.
    fn spawn(
        workers: Vec<ChannelWorker>,
        events: crossbeam_channel::Receiver<ChanEvent>,
    ) -> Result<ChannelThreads, SessionError> {
        let channels = workers.len();
        let tcp = workers.first().is_some_and(|w| w.link.is_tcp());
        let ceiling = workers
            .first()
            .map_or(u64::MAX, |w| w.shared.rate_ceiling_bps);
        let threads = send_threads(channels as u16, tcp, ceiling);
        let mut groups: Vec<Vec<ChannelWorker>> = (0..threads).map(|_| Vec::new()).collect();
        for w in workers {
            groups[usize::from(w.ch) % threads].push(w);
        }
        let mut thread_cmds = Vec::new();
        let mut handles = Vec::new();
        for (i, group) in groups.into_iter().enumerate() {
            let (cmd_tx, cmd_rx) = unbounded();
            let handle = std::thread::Builder::new()
                .name(format!("send-{i}"))
                .spawn(move || serve_channels(group, cmd_rx))
                .map_err(|e| SessionError::io("channel thread", e))?;
            thread_cmds.push(ChannelCmds {
                tx: cmd_tx,
                thread: handle.thread().clone(),
            });
            handles.push(handle);
        }
        // Channel ch's commands go to the thread that serves it.
        let by_channel: Vec<ChannelCmds> = (0..channels)
            .map(|ch| thread_cmds[ch % threads].clone())
            .collect();
        Ok(ChannelThreads {
            events,
            by_channel,
            threads: thread_cmds,
            handles,
        })
    }

    /// Wakes every thread (to see a change in [`Shared`] at once).
    fn wake(&self) {
        for c in &self.threads {
            c.thread.unpark();
        }
    }

    /// Starts the channels again for another outcome than the early data's (`layout` and
    /// `session`, holding `held`), at `rate` for a path of round trip `rtt`: on the same links,
    /// their packet numbers going on (with the channel, a packet number is the AEAD nonce).
    /// Returns the state the new threads share, made from `early`'s.
    fn restart(
        &mut self,
        early: Arc<Shared>,
        (layout, session): (hurtle_proto::Layout, u32),
        held: Vec<Vec<std::ops::Range<u64>>>,
        (rate_bps, rtt): (u64, Duration),
        logs: (Option<&std::path::Path>, Instant),
    ) -> Result<Arc<Shared>, SessionError> {
        let carried = self.take_back();
        // A thread lost (it panicked) took its channels with it: the rest must not be
        // renumbered into their places (a channel's packet numbers are its nonces).
        if carried.len() != usize::from(early.channels) {
            return Err(SessionError::Internal("a channel thread ended early"));
        }
        let early = Arc::try_unwrap(early)
            .map_err(|_| SessionError::Internal("a channel thread kept the early data's state"))?;
        let shared = Arc::new(Shared {
            layout,
            session,
            early_left: AtomicU64::new(u64::MAX),
            ..early
        });
        *self = ChannelThreads::start(&shared, carried, held, rate_bps, rtt, logs)?;
        Ok(shared)
    }

    /// Stops every thread and hands back what each channel carries into a new start: its
    /// link, its packet numbers and its log. Everything else of the channels is dropped.
    fn take_back(&mut self) -> Vec<Carried> {
        self.join()
            .into_iter()
            .map(|mut w| {
                w.log.line(|| {
                    "the set-up's outcome differs from the early data's: starting again".into()
                });
                Carried {
                    link: w.link,
                    packets: w.packets,
                    log: Some(w.log),
                }
            })
            .collect()
    }

    /// Stops every thread and hands back their channels; no thread runs afterwards.
    fn join(&mut self) -> Vec<ChannelWorker> {
        for c in &self.threads {
            let _ = c.send(ThreadCmd::Stop);
        }
        self.threads.clear();
        self.by_channel.clear();
        let mut workers: Vec<ChannelWorker> = std::mem::take(&mut self.handles)
            .into_iter()
            .filter_map(|h| h.join().ok())
            .flatten()
            .collect();
        workers.sort_by_key(|w| w.ch);
        workers
    }

    /// Moves every channel to its TCP link of `links` (one per channel, in order), on new
    /// threads as those links want them, with TCP's big frames; the channels in `lost` sent
    /// into the void so far, and send everything again. The rest go on where they were (the
    /// receiver asks for what the old links had in flight).
    fn relink(
        &mut self,
        shared: &Shared,
        links: Vec<LinkOut>,
        lost: &[u16],
    ) -> Result<(), SessionError> {
        let mut workers = self.join();
        // Only now that no thread sends over UDP: TCP takes big frames (fewer headers and
        // seals per byte), and the new threads size their buffers for them.
        shared
            .max_payload
            .store(channel_link::TCP_PAYLOAD, Ordering::Relaxed);
        shared
            .payload
            .store(channel_link::TCP_PAYLOAD, Ordering::Relaxed);
        if workers.len() != links.len() {
            return Err(SessionError::Internal("a channel thread ended early"));
        }
        for (w, link) in workers.iter_mut().zip(links) {
            w.link = link;
            w.sender.set_lossless();
            if lost.contains(&w.ch) {
                let queued = w.sender.on_link_lost();
                w.log
                    .line(|| format!("moved to TCP; {queued} bytes sent over UDP go again"));
            } else {
                w.log.line(|| "moved to TCP".into());
            }
        }
        *self = Self::spawn(workers, self.events.clone())?;
        Ok(())
    }

    /// Stops every thread and adds up what they sent: datagrams, repairs, NACKs served,
    /// parity datagrams, and the time their pacers missed (late, and lost of it).
    fn stop(mut self) -> (u64, u64, u64, u64, (Duration, Duration)) {
        let zero = (Duration::ZERO, Duration::ZERO);
        self.join()
            .iter()
            .fold((0, 0, 0, 0, zero), |(s, r, n, p, (late, lost)), w| {
                (
                    s + w.sent,
                    r + w.resent,
                    n + w.sender.stats().nacks,
                    p + w.parity_sent,
                    (late + w.pacer.late(), lost + w.pacer.lost()),
                )
            })
    }
}

/// What a channel carries from one start of the channel threads to the next: its link, its
/// packet numbers (they go on from the last one sent: with the channel, a packet number is the
/// AEAD nonce), and its log (a new one is opened when there is none).
struct Carried {
    link: LinkOut,
    packets: secure::PacketNumbers,
    log: Option<NetLog>,
}

impl Carried {
    /// A link on which nothing was sent yet.
    fn new(link: LinkOut) -> Carried {
        Carried {
            link,
            packets: secure::PacketNumbers::data(),
            log: None,
        }
    }
}

/// How much new data may go before the receiver's decisions (the early data): two round
/// trips at the first rate (data goes from the receiver's answer on, and the decisions come a
/// round trip later: twice that leaves room for a receiver that takes a while), no more than
/// half of what the receiver's sockets hold when it said the kernel capped them (it reads
/// them only once it has decided), and at least 64 KiB.
fn early_budget(rate_bps: u64, rtt: Duration, channels: u16, accepted: &Accepted) -> u64 {
    let flight = (rate_bps as f64 / 8.0 * rtt.as_secs_f64() * 2.0) as u64;
    let buffers = match accepted.buffer_cap {
        Some(cap) => cap.granted * u64::from(channels) / 2,
        None => u64::MAX,
    };
    flight.min(buffers).max(64 << 10)
}

/// What a session offers: the user's paths walked, the block size that fits them, the
/// manifest, and the warnings so far.
struct Plan {
    walked: walk::Walk,
    block_size: u64,
    entries: Vec<Entry>,
    warnings: Vec<String>,
}

/// Walks `paths` and makes the manifest. A transfer has at most `MAX_BLOCKS` blocks: a
/// bigger one goes in bigger blocks. A sparse file's holes are announced, and their bytes
/// are not sent (looked for before connecting: the receiver would wait meanwhile). A file
/// smaller than a block is not looked at (a hole there would save one block at most, and
/// many small files can look sparse: inline data, compression).
fn plan(paths: &[PathBuf], opts: &SendOptions) -> Result<Plan, SessionError> {
    let walked = walk::collect(
        paths,
        &WalkOptions {
            follow_symlinks: opts.follow_symlinks,
            link_args: opts.link_args.clone(),
            filter: opts.filter.clone(),
        },
    )?;
    let mut warnings = walked.warnings.clone();
    let sizes: Vec<u64> = walked
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .map(|f| f.size)
        .collect();
    let total_bytes: u64 = sizes.iter().sum();
    let block_size = hurtle_proto::layout::fitting_block_size(&sizes, opts.block_size);
    if block_size != opts.block_size {
        warnings.push(format!(
            "chunk size raised to {} KiB: a transfer of {total_bytes} bytes in {} KiB chunks would have more than {} of them",
            block_size >> 10,
            opts.block_size >> 10,
            hurtle_proto::layout::MAX_BLOCKS
        ));
    }
    let entries: Vec<Entry> = walked
        .entries
        .iter()
        .map(|e| Entry {
            holes: if e.sparse && e.size >= block_size && !opts.no_sparse {
                source_holes(&e.abs_path, e.size, block_size)
            } else {
                Vec::new()
            },
            ..e.to_wire()
        })
        .collect();
    Ok(Plan {
        walked,
        block_size,
        entries,
        warnings,
    })
}

/// The holes of the sparse source file at `path`, in whole blocks (see
/// [`crate::fs::hole_blocks`]); none if it cannot be opened or asked, and then its bytes
/// are read and sent, holes or not. A hole filled after this look is still sent right: its
/// value, read when the transfer comes to it, differs from the receiver's, which asks for it.
fn source_holes(path: &std::path::Path, size: u64, block_size: u64) -> Vec<(u64, u64)> {
    std::fs::File::open(path)
        .and_then(|f| crate::fs::hole_blocks(&f, size, block_size))
        .unwrap_or_default()
}

/// Opens a TCP connection to the receiver with the session's dialer.
fn dial(opts: &SendOptions, addr: SocketAddr) -> Result<TcpStream, SessionError> {
    let dialer: &dyn Dialer = opts.dialer.as_deref().unwrap_or(&Direct);
    dialer
        .dial(addr, opts.connect_timeout)
        .map_err(|source| SessionError::Connect { addr, source })
}

/// Dials the TCP data connections, all at once (one after the other, 8 of them would cost 8
/// round trips), each greeted with the session and its channel.
fn dial_data(
    opts: &SendOptions,
    dests: &[SocketAddr],
    session: u32,
    key: &DataKey,
) -> Vec<Dialing> {
    dests
        .iter()
        .enumerate()
        .map(|(ch, &dest)| {
            let opts = opts.clone();
            let greeting = channel_link::greeting(key, session, ch as u16);
            std::thread::spawn(move || {
                let mut s = dial(&opts, dest)?;
                let _ = s.set_nodelay(true);
                s.write_all(&greeting)
                    .map_err(|e| SessionError::io("TCP data connection", e))?;
                Ok(s)
            })
        })
        .collect()
}
