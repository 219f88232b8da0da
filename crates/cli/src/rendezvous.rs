//! Pairing by code: `hurtle relay`, `hurtle receive --relay` and `hurtle send --code --relay`.
//!
//! The receiver registers with the relay, prints `code: CODE` on stderr (always, even with `-q`
//! or `--json`), and keeps an agent connected to the relay that forwards relayed connections to
//! its own listeners. The sender looks the code up, tries the receiver's addresses directly for
//! about 2 s, and otherwise goes through the relay (parallel TCP). Both say which path was
//! taken: `path: direct to ADDR` / `path: relayed via RELAY` (sender), `path: direct from ADDR` /
//! `path: relayed via RELAY` (receiver).

use crate::ui::{self, PathInfo};
use crate::{fail, resolve, Outcome, OutputArgs};
use anyhow::anyhow;
use clap::Args;
use hurtle_engine::dial::Dialer;
use hurtle_engine::{OwnPorts, ReceiveSummary, Receiver, SessionError};
use hurtle_relay::client::{self, AgentEvent, RelayError};
use hurtle_relay::code::DEFAULT_WORDS;
use hurtle_relay::{Code, Config, Server};
use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Flags of `hurtle relay`.
#[derive(Args)]
pub struct RelayArgs {
    /// Address to listen on, ADDR:PORT.
    #[arg(long, default_value = "0.0.0.0:7401")]
    listen: String,
    /// Seconds a code stays valid unless used.
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    code_ttl: f64,
    /// Seconds of silence after which a client is disconnected.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    idle_timeout: f64,
    /// Lookups one client IP may make at once.
    #[arg(long, value_name = "N", default_value_t = 10)]
    lookup_burst: u32,
    /// Lookups per second one client IP may make on average.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    lookup_per_sec: f64,
    /// Most connections served at once.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// Most codes registered at once.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_codes: usize,
}

fn secs(name: &str, v: f64) -> Result<Duration, (u8, anyhow::Error)> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| (2, anyhow!("--{name} must be a positive number of seconds")))
}

/// `hurtle relay`: serves until killed.
pub fn serve(a: RelayArgs) -> Outcome {
    let addr = resolve(&a.listen).map_err(fail)?;
    let cfg = Config {
        code_ttl: secs("code-ttl", a.code_ttl)?,
        idle_timeout: secs("idle-timeout", a.idle_timeout)?,
        lookup_burst: a.lookup_burst,
        lookup_per_sec: a.lookup_per_sec,
        max_connections: a.max_connections.max(1),
        max_codes: a.max_codes.max(1),
        log: true,
    };
    let server =
        Server::bind(addr, cfg).map_err(|source| fail(SessionError::Listen { addr, source }))?;
    let bound = server
        .local_addr()
        .map_err(|e| fail(SessionError::io("relay socket", e)))?;
    eprintln!("hurtle relay: listening on {bound}");
    server.run().map_err(|e| (4, anyhow!("relay stopped: {e}")))
}

fn relay_fail(e: RelayError) -> (u8, anyhow::Error) {
    (if e.is_network() { 4 } else { 1 }, anyhow::Error::new(e))
}

enum Event {
    Agent(AgentEvent),
    Done(Result<ReceiveSummary, SessionError>),
}

/// `hurtle receive --relay`: registers, prints the code, serves one transfer.
pub fn receive(
    out: &OutputArgs,
    relay: &str,
    receiver: Receiver,
    bound: SocketAddr,
    own_ports: Arc<OwnPorts>,
) -> Outcome {
    let relay_addr = resolve(relay).map_err(fail)?;
    let reg = client::register(relay_addr, bound, DEFAULT_WORDS).map_err(relay_fail)?;
    let code = reg.code.clone();
    let ttl = reg.ttl_secs;
    // One write, so that a reader of the pipe never sees half the code.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("code: {code}\n").as_bytes());
    ui::say(
        out,
        &format!("hurtle: on the sending host: hurtle send FILES --code {code} --relay {relay}   (valid {ttl} s, once)"),
    );
    let (tx, rx) = mpsc::channel::<Event>();
    let agent_tx = tx.clone();
    let agent = reg
        .start_agent(bound.ip(), own_ports, move |e| {
            let _ = agent_tx.send(Event::Agent(e));
        })
        .map_err(|e| fail(SessionError::io("relay agent thread", e)))?;
    let (progress, bar) = ui::progress_bar(out, "receiving");
    std::thread::Builder::new()
        .name("receive".into())
        .spawn(move || {
            let _ = tx.send(Event::Done(receiver.accept_one(progress)));
        })
        .map_err(|e| fail(SessionError::io("receive thread", e)))?;
    let mut info: Option<PathInfo> = None;
    let mut paired = false;
    let end = |bar: ui::Bar, code: u8, e: anyhow::Error| {
        bar.finish();
        Err((code, e))
    };
    loop {
        let Ok(ev) = rx.recv() else {
            return end(bar, 1, anyhow!("the receive thread ended without a result"));
        };
        match ev {
            Event::Agent(AgentEvent::Paired { sender, relayed }) => {
                paired = true;
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
                    relay: relay.to_string(),
                    code_nameplate: code.nameplate,
                });
            }
            Event::Agent(AgentEvent::Refused { port, reason }) => {
                if !out.quiet {
                    eprintln!("hurtle: warning: the relay asked for port {port}: {reason}");
                }
            }
            Event::Agent(AgentEvent::Cancelled(reason)) if !paired => {
                return end(bar, 1, anyhow!("the relay cancelled code {code}: {reason}; run receive again for a new code"));
            }
            Event::Agent(AgentEvent::Expired) if !paired => {
                return end(bar, 1, anyhow!("code {code} expired unused after {ttl} s; run receive again for a new code"));
            }
            Event::Agent(AgentEvent::Lost(reason)) if !paired => {
                return end(bar, 4, anyhow!("lost the relay at {relay}: {reason}"));
            }
            Event::Agent(_) => {}
            Event::Done(result) => {
                bar.finish();
                agent.stop();
                let s = result.map_err(fail)?;
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
}

/// `hurtle send --code --relay`: looks the code up, tries a direct path, else relays. Returns
/// the address the engine should connect to (with the returned dialer).
pub fn pair(
    out: &OutputArgs,
    relay: &str,
    code: &str,
    relay_only: bool,
) -> Result<(SocketAddr, Paired), (u8, anyhow::Error)> {
    let code = Code::parse(code).map_err(|e| (2, anyhow!("bad code {code:?}: {e}")))?;
    let relay_addr = resolve(relay).map_err(fail)?;
    let found = client::lookup(relay_addr, &code).map_err(relay_fail)?;
    let port = found.port();
    let direct = if relay_only {
        None
    } else {
        found.try_direct(Duration::from_secs(2))
    };
    let (to, path) = match &direct {
        Some((addr, _)) => {
            ui::say(out, &format!("path: direct to {addr}"));
            (*addr, "direct")
        }
        None => {
            ui::say(out, &format!("path: relayed via {relay_addr}"));
            (SocketAddr::new(relay_addr.ip(), port), "relayed")
        }
    };
    Ok((
        to,
        Paired {
            dialer: found.into_dialer(direct),
            info: PathInfo {
                path,
                relay: relay.to_string(),
                code_nameplate: code.nameplate,
            },
        },
    ))
}
