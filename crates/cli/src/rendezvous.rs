//! Pairing by code, on the two ends: `hurtle receive --relay` and `hurtle send --code` (the relay
//! server itself is `cmd/relay.rs`), and the other way round, for a sender that starts first:
//! `hurtle send FILES` with a relay prints the code ([`send_first`]), `hurtle receive CODE`
//! answers it (`receive` with a code).
//!
//! The receiver registers with the relay, prints `code: CODE` on stderr (always, even with `-q`
//! or `--json`), and keeps an agent connected to the relay that forwards relayed connections to
//! its own listeners. The sender (given a code `send` has already checked: its shape and its
//! words, so that a typo never reaches the relay) looks the code up, tries the receiver's
//! addresses directly for about 2 s, and otherwise goes through the relay (parallel TCP). Both
//! say which path was taken: `path: direct to ADDR` / `path: relayed via RELAY` (sender), `path: direct from ADDR` /
//! `path: relayed via RELAY` (receiver).
//!
//! The relay gets the code's nameplate only; the words are the password of the peers' key
//! agreement. So a lookup is not proof of the right sender: the agent's `Paired` event means
//! someone looked the nameplate up, and the relay cancels a code after three lookups (the
//! fourth fails). A cancelled or expired code ends the receiver only while no sender is
//! connected to it; a session in progress carries on. A sender given a code not registered yet
//! looks it up again once a second, for `--wait` seconds.
//!
//! A sender that starts first offers: the relay gives it a nameplate, it prints `code: CODE`
//! and waits. The receiver given that code registers as a receiver does, answering the offer;
//! the relay tells the sender the receiver's own nameplate, and the sender looks it up and
//! sends as above: the receiver still listens and the sender still dials. The sender counts
//! the receivers that answered with another code (the key agreement fails): each is told so
//! through the relay (its registration is cancelled, and it ends with exit 3), and the
//! [`CODE_TRIES`]th spends the code (the sender ends with exit 3).
//!
//! The steps themselves are the library's (`hurtle::api::pairing`), which `hurtle::Sender` and
//! `hurtle::Receiver` run too: this module words what they return as the command's lines and
//! exit codes, and keeps the receiver's agent events for its `path:` line.

use crate::args::{HostPort, OutputArgs};
use crate::cmd::{resolve, session_failure};
use crate::exit::{self, Failure, Outcome};
use crate::ui::{self, PathInfo};
use anyhow::anyhow;
use hurtle::api::pairing::{self, OfferEnd, Route, Unregistered};
use hurtle_engine::handshake::CODE_TRIES;
use hurtle_engine::net::dial::Dialer;
use hurtle_engine::progress::Phase;
use hurtle_engine::{
    Keyring, OwnPorts, Progress, ReceiveSummary, Receiver, RelayedUdp, SessionError,
};
use hurtle_proto::secure::Secret;
use hurtle_relay::client::AgentEvent;
use hurtle_relay::Code;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::Duration;

enum Event {
    Agent(AgentEvent),
    Done(Box<Result<ReceiveSummary, SessionError>>),
}

/// `hurtle receive --relay`: registers, prints the code, serves one transfer; with `answer`
/// (a code a sender printed), registers answering that sender's offer instead.
pub fn receive(
    out: &OutputArgs,
    relay: &HostPort,
    receiver: Receiver,
    (bound, own_ports, relayed_udp): (SocketAddr, Arc<OwnPorts>, Option<Arc<RelayedUdp>>),
    keyring: Keyring,
    answer: Option<Code>,
) -> Outcome {
    let relay_addr = resolve(relay, "relay")?;
    let reg =
        pairing::register(relay_addr, bound, &keyring, answer.as_ref()).map_err(|e| {
            match (e, &answer) {
                (Unregistered::NoOffer, Some(code)) => Failure::new(
                    exit::OTHER,
                    anyhow!(
                    "no sender is waiting with code {code} at the relay {relay} (it expired or \
                     was used, or its number is mistyped)"
                ),
                ),
                (Unregistered::Relay(e), _) => Failure::from(e),
                _ => Failure::new(
                    exit::OTHER,
                    anyhow!("the relay {relay} refused the registration"),
                ),
            }
        })?;
    let code = reg.code.clone();
    let ttl = reg.ttl_secs;
    if answer.is_some() {
        // After an interrupt, the sender's code is gone with its session: the message says so.
        crate::interrupt::restart_by(crate::interrupt::Restart::SenderCode);
    }
    if answer.is_none() {
        // One write, so that a reader of the pipe never sees half the code.
        let _ =
            std::io::Write::write_all(&mut std::io::stderr(), format!("code: {code}\n").as_bytes());
        ui::say(
            out,
            &format!("hurtle: on the sending host: hurtle send FILES --code {code} --relay {relay}   (valid {ttl} s, once)"),
        );
    } else {
        ui::say(
            out,
            &format!("hurtle: the sender of code {code} is waiting at the relay {relay}"),
        );
    }
    let (tx, rx) = mpsc::channel::<Event>();
    let agent_tx = tx.clone();
    let agent = reg
        .start_agent(bound.ip(), own_ports, move |e| {
            let _ = agent_tx.send(Event::Agent(e));
        })
        .map_err(|e| SessionError::io("relay agent thread", e))?;
    let (progress, bar) = ui::progress_bar(out, "receiving");
    crate::interrupt::watch(&progress);
    let watched = progress.clone();
    bar.waiting_for(format!("with code {code}"));
    std::thread::Builder::new()
        .name("receive".into())
        .spawn(move || {
            let _ = tx.send(Event::Done(Box::new(receiver.accept_one(progress))));
        })
        .map_err(|e| SessionError::io("receive thread", e))?;
    let mut info: Option<PathInfo> = None;
    let mut paired = false;
    let end = |bar: ui::Bar, code: u8, e: anyhow::Error| {
        bar.finish();
        Err(Failure::new(code, e))
    };
    loop {
        let Ok(ev) = rx.recv() else {
            return end(
                bar,
                exit::OTHER,
                anyhow!("the receive thread ended without a result"),
            );
        };
        match ev {
            Event::Agent(AgentEvent::Paired { sender, relayed }) => {
                paired = true;
                if let (Some(true), Some(r)) = (relayed, &relayed_udp) {
                    r.paired_through_relay();
                }
                let path = match relayed {
                    Some(true) => {
                        ui::say(out, &format!("path: relayed via {relay_addr}"));
                        "relayed"
                    }
                    Some(false) => {
                        ui::say(out, &format!("path: direct from {sender}"));
                        "direct"
                    }
                    None => "unknown",
                };
                info = Some(PathInfo {
                    path,
                    relay: Some(relay.to_string()),
                    code_nameplate: Some(code.nameplate),
                });
            }
            // The sender's datagrams go through the relay: the session's channels bind there.
            Event::Agent(AgentEvent::Udp { port, tokens }) => {
                if let Some(r) = &relayed_udp {
                    pairing::relay_datagrams(r, relay_addr, port, &tokens);
                }
            }
            Event::Agent(AgentEvent::Refused { port, reason }) => {
                if !out.quiet {
                    ui::warning(&format!("the relay asked for port {port}: {reason}"));
                }
            }
            Event::Agent(AgentEvent::Cancelled(reason))
                if watched.phase() == Phase::Idle && answer.is_some() =>
            {
                return end(
                    bar,
                    exit::REFUSED,
                    anyhow!("code {code} was refused: {reason}; check the code the sender printed and run receive again"),
                );
            }
            Event::Agent(AgentEvent::Cancelled(reason)) if watched.phase() == Phase::Idle => {
                return end(bar, exit::OTHER, anyhow!("the relay cancelled code {code}: {reason}; run receive again for a new code"));
            }
            Event::Agent(AgentEvent::Expired) if watched.phase() == Phase::Idle => {
                let how = if paired {
                    "without a sender connecting"
                } else {
                    "unused"
                };
                return end(
                    bar,
                    exit::OTHER,
                    anyhow!(
                        "code {code} expired {how} after {ttl} s; run receive again for a new code"
                    ),
                );
            }
            Event::Agent(AgentEvent::Lost(reason)) if !paired => {
                return end(
                    bar,
                    exit::NETWORK,
                    anyhow!("lost the relay at {relay}: {reason}"),
                );
            }
            Event::Agent(_) => {}
            Event::Done(result) => {
                bar.finish();
                agent.stop();
                let s = (*result).map_err(|e| session_failure(e, true, &watched))?;
                ui::print_receive_summary(out, &s, info.as_ref());
                return Ok(());
            }
        }
    }
}

/// The sender's path to the receiver, found by code.
pub struct Paired {
    /// How the engine opens its connections.
    pub dialer: Arc<dyn Dialer>,
    /// For the summary.
    pub info: PathInfo,
    /// The code, as the key agreement's secret.
    pub secret: Secret,
}

/// `hurtle send --code --relay`: looks the code up (waiting up to `wait` for it to be
/// registered), tries a direct path, else relays ([`pairing::find`]). Returns the address the
/// engine should connect to (with the returned dialer).
pub fn pair(
    out: &OutputArgs,
    relay: &HostPort,
    code: &Code,
    relay_only: bool,
    wait: Duration,
) -> Result<(SocketAddr, Paired), Failure> {
    let relay_addr = resolve(relay, "relay")?;
    let route = pairing::find(relay_addr, code, relay_only, wait, || {
        ui::say(
            out,
            &format!(
                "hurtle: waiting for the receiver of code {code} to register at the relay {relay} (up to {} s)...",
                wait.as_secs()
            ),
        )
    })?;
    Ok(paired(
        out,
        (relay, relay_addr),
        route,
        code,
        Secret::code(&code.to_string()),
    ))
}

/// The path to a receiver found by `code` at the relay (`relay` as given, and its address):
/// says which it is, and gives where the engine connects to; `secret` is the session's.
fn paired(
    out: &OutputArgs,
    (relay, relay_addr): (&HostPort, SocketAddr),
    route: Route,
    code: &Code,
    secret: Secret,
) -> (SocketAddr, Paired) {
    let path = if route.relayed {
        ui::say(out, &format!("path: relayed via {relay_addr}"));
        "relayed"
    } else {
        ui::say(out, &format!("path: direct to {}", route.to));
        "direct"
    };
    (
        route.to,
        Paired {
            dialer: route.dialer,
            secret,
            info: PathInfo {
                path,
                relay: Some(relay.to_string()),
                code_nameplate: Some(code.nameplate),
            },
        },
    )
}

/// `hurtle send FILES` with a relay and no code: offers, prints the code and the command the
/// receiving side types (`hurtle receive CODE` when the relay is configured, `typed` false;
/// with `--code` and `--relay` when it was given on the command line), and waits for a
/// receiver to answer ([`pairing::answered`]); then `transfer` sends to it (the address and the
/// path, as [`pair`] gives them). A receiver with another code is told so and waited past, up
/// to [`CODE_TRIES`] of them.
pub fn send_first(
    out: &OutputArgs,
    (relay, typed): (&HostPort, bool),
    relay_only: bool,
    mut transfer: impl FnMut(SocketAddr, Paired) -> Result<(), (SessionError, Arc<Progress>)>,
) -> Outcome {
    let relay_addr = resolve(relay, "relay")?;
    let offering = pairing::offer(relay_addr)?;
    // After an interrupt, the code printed here is gone: the message says so.
    crate::interrupt::restart_by(crate::interrupt::Restart::SenderCode);
    let (code, ttl) = (offering.code.clone(), offering.ttl_secs);
    // One write, so that a reader of the pipe never sees half the code.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("code: {code}\n").as_bytes());
    let other_side = if typed {
        format!("hurtle receive --code {code} --relay {relay}")
    } else {
        format!("hurtle receive {code}")
    };
    ui::say(
        out,
        &format!("hurtle: on the receiving host: {other_side}   (valid {ttl} s)"),
    );
    let sent = pairing::answered(
        offering,
        relay_addr,
        relay_only,
        |route, secret| {
            let (to, paired) = paired(out, (relay, relay_addr), route, &code, secret);
            transfer(to, paired)
        },
        |wrong| {
            if !out.quiet {
                ui::warning(&format!(
                    "a receiver answered with another code ({wrong} of {CODE_TRIES} tries); still waiting for {other_side}"
                ));
            }
        },
        // An interrupt while waiting ends the process (`interrupt`).
        || false,
    );
    sent.map_err(|end| match end {
        OfferEnd::Expired => Failure::new(
            exit::OTHER,
            anyhow!("code {code} expired after {ttl} s without a receiver; run send again for a new code"),
        ),
        OfferEnd::Lost(reason) => Failure::new(
            exit::NETWORK,
            anyhow!("lost the relay at {relay}: {reason}"),
        ),
        OfferEnd::Relay(e) => e.into(),
        OfferEnd::Spent { tries } => Failure::new(
            exit::REFUSED,
            anyhow!("code {code} was answered {tries} times with another code and is no longer valid; nothing was sent (run send again for a new code)"),
        ),
        OfferEnd::Failed(e, progress) => session_failure(e, false, &progress),
        OfferEnd::Thread(e) => SessionError::io("relay offer thread", e).into(),
        _ => Failure::new(exit::OTHER, anyhow!("the offer of code {code} ended")),
    })
}
