//! `hurtle receive`: checks `--out`, listens, and serves one transfer (or, with `--serve`, each
//! transfer until interrupted; with `--relay`, one transfer paired by code; with a code a
//! sender printed, `hurtle receive CODE`, one transfer from that sender, through the relay).

use crate::args::{parse_relay_target, HostPort, ReceiveArgs, RECEIVER_PORT};
use crate::cmd::keys;
use crate::cmd::{resolve, session_failure};
use crate::config::Defaults;
use crate::exit::{self, Failure, Outcome};
use crate::{interrupt, rendezvous, ui};
use hurtle_engine::mirror::DRY_RUN;
use hurtle_engine::{ReceiveOptions, Receiver, RelayedUdp, SessionError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Runs `hurtle receive`.
pub fn run(a: ReceiveArgs, defaults: &Defaults) -> Outcome {
    let out = match a.out.clone() {
        Some(out) => out,
        None => defaults
            .get("out", |s| Ok(PathBuf::from(s)))?
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    // A code a sender printed (positional, or --code with --relay): answered through the relay.
    let answer = match a
        .sender_code
        .clone()
        .or(a.code.clone().filter(|_| a.relay.is_some()))
    {
        Some(c) => Some(keys::checked_code(&c)?),
        None => None,
    };
    let free = check_out(&out)?;
    let relay = match a.relay.as_deref() {
        None if answer.is_some() => {
            Some(defaults.get("relay", parse_relay_target)?.ok_or_else(|| {
                Failure::usage(
                    "a code a sender printed is found through its relay: --relay HOST[:PORT], \
                 HURTLE_RELAY or relay in the configuration file",
                )
            })?)
        }
        None => None,
        Some("") => Some(defaults.get("relay", parse_relay_target)?.ok_or_else(|| {
            Failure::usage(
                "--relay without a value needs HURTLE_RELAY or relay in the configuration file",
            )
        })?),
        Some(r) => Some(parse_relay_target(r).map_err(Failure::usage)?),
    };
    let listen = a.listen.clone().unwrap_or(HostPort {
        host: "0.0.0.0".into(),
        port: if relay.is_some() { 0 } else { RECEIVER_PORT },
    });
    let addr = resolve(&listen, "listening")?;
    // The code: given, or new and printed (a relay's code comes from the relay); none when only
    // keys are accepted.
    // A code given is checked as a sender checks it, so that a sender can give it.
    let given = match keys::given_code(&a.code).filter(|_| relay.is_none()) {
        Some(c) => Some(keys::checked_code(&c)?.to_string()),
        None => None,
    };
    let fresh = given.is_none() && a.keys.is_none() && a.authorized.is_none() && relay.is_none();
    let code = if fresh { Some(keys::new_code()) } else { given };
    // After an interrupt, a code printed here is gone: the message says so.
    if fresh || relay.is_some() {
        interrupt::restart_by(interrupt::Restart::ReceiverCode);
    }
    // Paired by code through a relay: the sender's datagrams may come through it.
    let relayed_udp = match &relay {
        Some(r) => Some(Arc::new(RelayedUdp::new(resolve(r, "relay")?.ip()))),
        None => None,
    };
    let opts = ReceiveOptions {
        relayed_udp: relayed_udp.clone(),
        keys: hurtle::api::identity::receiver(
            keys::keyring(&a.keys, code.as_deref())?,
            a.identity.as_deref(),
            a.authorized.as_deref(),
        )?,
        no_encryption: a.no_encryption,
        out_dir: out.clone(),
        overwrite: a.overwrite,
        allow_delete: a.allow_delete,
        log_dir: a.output.log_dir.clone(),
        buffer_memory: usize::try_from(a.buffer_memory).unwrap_or(usize::MAX),
        write_queue: a.write_queue.into(),
        ..ReceiveOptions::default()
    };
    ui::log_engine_events(&a.output);
    let own_ports = opts.own_ports.clone();
    let keyring = opts.keys.clone();
    let receiver = Receiver::bind(addr, opts)?;
    let bound = receiver.local_addr()?;
    let free = free.map_or(String::new(), |f| format!(" ({} free)", ui::bytes(f)));
    ui::say(
        &a.output,
        &format!(
            "hurtle: listening on {bound}, receiving into {}{free}",
            out.display()
        ),
    );
    if let Some(id) = keyring.identity() {
        // What senders pin on first use, to compare with the fingerprint their warning names.
        let fp = id.public().fingerprint();
        ui::say(&a.output, &format!("hurtle: identity {fp}"));
    }
    if let Some(relay) = &relay {
        return rendezvous::receive(
            &a.output,
            relay,
            receiver,
            (bound, own_ports, relayed_udp),
            keyring,
            answer,
        );
    }
    if let Some(code) = code.as_deref().filter(|_| fresh) {
        // Always, even with -q or --json: the sender needs it. One write, so that a reader of
        // the pipe never sees half of it.
        let _ =
            std::io::Write::write_all(&mut std::io::stderr(), format!("code: {code}\n").as_bytes());
        ui::say(
            &a.output,
            &format!(
                "hurtle: on the sending host: hurtle send FILES --to THIS_HOST:{} --code {code}",
                bound.port()
            ),
        );
    }
    loop {
        let (progress, bar) = ui::progress_bar(&a.output, "receiving");
        interrupt::watch(&progress);
        let result = receiver.accept_one(progress.clone());
        bar.finish();
        match result {
            // A sender's dry run: what it would change here, as the plan's list.
            Ok(s) if s.warnings.iter().any(|w| w.starts_with(DRY_RUN)) => {
                ui::print_plan(&a.output, &s.file_hashes, &s.warnings)
            }
            Ok(s) => ui::print_receive_summary(&a.output, &s, None),
            // A spent code ends a served receiver that has nothing else to accept.
            Err(e @ SessionError::CodeSpent(_)) if keyring.is_empty() => {
                return Err(session_failure(e, true, &progress))
            }
            Err(e) if a.serve && !progress.interrupted() => {
                // One write, so a reader never sees half the line.
                let line = format!("hurtle: transfer failed: {e}");
                eprintln!("{line}");
                continue;
            }
            Err(e) => return Err(session_failure(e, true, &progress)),
        }
        if !a.serve {
            return Ok(());
        }
    }
}

/// Checks that `out` is, or can be made, a writable directory, before anything listens (the
/// library's check, [`hurtle::api::values::check_out_dir`]: exit 6 if not); returns the space
/// free there when the file system says.
pub(crate) fn check_out(out: &Path) -> Result<Option<u64>, Failure> {
    hurtle::api::values::check_out_dir(out, "--out")
        .map_err(|e| Failure::new(exit::STORAGE, anyhow::anyhow!(e)))?;
    Ok(hurtle_engine::fs::free_space(out))
}
