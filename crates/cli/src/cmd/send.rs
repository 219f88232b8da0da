//! `hurtle send`: to an address (`--to`), to a receiver found by code through a relay
//! (`--code`), or, with a relay and no code, to the receiver that types the code printed here
//! (see [`rendezvous::send_first`]). A receiver that has not started yet is waited for, up to
//! `--wait` seconds: at `--to`, while nothing listens there; by code, while the code is not
//! registered.

use crate::args::{parse_channels, parse_rate, parse_relay_target, SendArgs};
use crate::cmd::{keys, stdin};
use crate::cmd::{resolve, session_failure};
use crate::config::Defaults;
use crate::exit::{Failure, Outcome};
use crate::{interrupt, rendezvous, ui};
use hurtle::api::identity;
use hurtle_engine::net::dial::Waiting;
use hurtle_engine::{Progress, SendOptions, SessionError};
use hurtle_relay::Code;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Runs `hurtle send`.
pub fn run(mut a: SendArgs, defaults: &Defaults) -> Outcome {
    // Whether the receiver, and its code, outlive an interrupt is the receiver's to say (a code
    // printed here says otherwise, in `rendezvous::send_first`).
    interrupt::restart_by(interrupt::Restart::ReceiverDecides);
    let mut opts = SendOptions {
        no_encryption: a.no_encryption,
        ..a.flags.options(a.output.log_dir.clone())
    };
    // The code is checked here, before it costs one of the receiver's tries: a code of another
    // shape, or with a word not in the list, is a usage error (exit 2), with the word meant.
    let code = match keys::given_code(&a.code) {
        Some(c) if a.key.is_none() && a.identity.is_none() => Some(keys::checked_code(&c)?),
        _ => None,
    };
    opts.secret = keys::sender_secret(&a.key, code.as_ref().map(Code::to_string).as_deref())?;
    if let Some(path) = &a.identity {
        let (secret, known) = identity::sender(path, a.known_receivers.as_deref())?;
        opts.secret = Some(secret);
        opts.known_receivers = Some(known);
    }
    if a.flags.channels.is_none() {
        if let Some(c) = defaults.get("channels", parse_channels)? {
            opts.channels = c;
        }
    }
    if a.flags.rate.rate.is_none() && a.flags.rate.rate_fixed.is_none() {
        a.flags.rate.rate = defaults.get("rate", parse_rate)?;
        a.flags.rate.apply(&mut opts);
    }
    let wait = Duration::from_secs(match a.wait {
        Some(w) => w,
        None => wait_from_env()?,
    });
    // `send -`: standard input, copied whole into a file named --name first (see `stdin`).
    let _spooled = if stdin::wanted(&a.paths) {
        let s = stdin::spool(&a.paths, a.name.as_deref(), std::io::stdin().lock())?;
        a.paths = vec![s.path.clone()];
        Some(s)
    } else if a.name.is_some() {
        return Err(stdin::name_without_stdin());
    } else {
        None
    };
    let relay = match &a.relay {
        Some(r) => Some((r.clone(), true)),
        None if a.to.is_none() => defaults
            .get("relay", parse_relay_target)?
            .map(|r| (r, false)),
        None => None,
    };
    match (&a.to, &code) {
        (Some(to), _) => {
            if opts.secret.is_none() {
                return Err(Failure::usage(
                    "give the code the receiver printed: --code CODE (or HURTLE_CODE), or a key file with --key",
                ));
            }
            let to = resolve(to, "receiver")?;
            // A receiver not listening yet is waited for, when the session dials it (after
            // its sources were read).
            let out = a.output.clone();
            opts.dialer = Some(Arc::new(Waiting::new(wait, move |addr| {
                ui::say(
                    &out,
                    &format!(
                        "hurtle: waiting for the receiver at {addr} to listen (up to {} s)...",
                        wait.as_secs()
                    ),
                )
            })));
            transfer(&a, &opts, to, None).map_err(|(e, p)| session_failure(e, false, &p))
        }
        (None, Some(code)) => {
            let (relay, _) = relay.ok_or_else(|| {
                Failure::usage(
                    "--code needs a relay: --relay HOST[:PORT], HURTLE_RELAY or relay in the \
                     configuration file",
                )
            })?;
            let (to, path) = rendezvous::pair(&a.output, &relay, code, a.relay_only, wait)?;
            opts.dialer = Some(path.dialer.clone());
            opts.secret = Some(path.secret.clone());
            transfer(&a, &opts, to, Some(&path)).map_err(|(e, p)| session_failure(e, false, &p))
        }
        (None, None) if a.key.is_some() => Err(Failure::usage("--key needs --to")),
        (None, None) if a.identity.is_some() => Err(Failure::usage("--identity needs --to")),
        (None, None) => {
            let Some((relay, typed)) = relay else {
                return Err(Failure::usage(
                    "give --to HOST and --code, --code with a relay, or a relay (--relay \
                     HOST[:PORT], HURTLE_RELAY or relay in the configuration file) to print a \
                     code here",
                ));
            };
            rendezvous::send_first(&a.output, (&relay, typed), a.relay_only, |to, path| {
                let mut opts = opts.clone();
                opts.dialer = Some(path.dialer.clone());
                opts.secret = Some(path.secret.clone());
                transfer(&a, &opts, to, Some(&path))
            })
        }
    }
}

/// How long a sender waits for its receiver by default (`--wait`).
pub const DEFAULT_WAIT_SECS: u64 = 60;

/// The environment variable for `--wait`.
pub const WAIT_ENV: &str = "HURTLE_WAIT";

/// `--wait` from [`WAIT_ENV`], else [`DEFAULT_WAIT_SECS`].
fn wait_from_env() -> Result<u64, Failure> {
    match std::env::var(WAIT_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| Failure::usage(format!("{WAIT_ENV}={v:?}: not a number of seconds"))),
        _ => Ok(DEFAULT_WAIT_SECS),
    }
}

/// One session to `to` with `opts`, its progress shown, and its summary printed.
fn transfer(
    a: &SendArgs,
    opts: &SendOptions,
    to: SocketAddr,
    path: Option<&rendezvous::Paired>,
) -> Result<(), (SessionError, Arc<Progress>)> {
    let (progress, bar) = ui::progress_bar(&a.output, "sending");
    interrupt::watch(&progress);
    let result = hurtle_engine::send(&a.paths, to, opts, progress.clone());
    bar.finish();
    let s = result.map_err(|e| (e, progress))?;
    if opts.dry_run {
        ui::print_plan(&a.output, &s.file_hashes, &s.warnings);
    } else {
        ui::print_send_summary(&a.output, &s, path.map(|p| &p.info));
    }
    Ok(())
}
