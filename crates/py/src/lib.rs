//! The `hurtle` Python module: `hurtle.send(paths, to=..., code=..., **options)` and
//! `hurtle.receive(out, listen=..., code=..., **options)`, over the Rust API of the `hurtle`
//! crate.
//!
//! Keyword options mirror the command's flags (`rate="800M"` or bits per second as an int,
//! `channels=4`, `transport="tcp"`, ...); the summary comes back as a dict (the `--json`
//! summary); a failure raises one subclass of `hurtle.Error` per exit-code kind, with `kind`
//! and `exit_code` attributes. The transfer runs with the GIL released: the calling thread
//! takes it back every 100 ms to deliver progress events to the `progress=` callback and to
//! check for signals, so Ctrl-C cancels the transfer (keeping what was verified, as the
//! command does) and then raises `KeyboardInterrupt`.

use hurtle::api::values;
use hurtle::{ErrorKind, Event, Phase, Transfer, Transport, Waiting};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

create_exception!(hurtle, Error, PyException, "A transfer failed.");
create_exception!(
    hurtle,
    UsageError,
    Error,
    "A bad option or value (exit code 2)."
);
create_exception!(
    hurtle,
    RefusedError,
    Error,
    "The receiver refused the transfer (exit code 3)."
);
create_exception!(
    hurtle,
    NetworkError,
    Error,
    "The network failed the transfer (exit code 4)."
);
create_exception!(
    hurtle,
    VerificationError,
    Error,
    "A hash did not match (exit code 5)."
);
create_exception!(
    hurtle,
    StorageError,
    Error,
    "Local storage failed (exit code 6)."
);
create_exception!(
    hurtle,
    IdentityError,
    Error,
    "The receiver proved another identity than the one pinned for it (exit code 9)."
);
create_exception!(
    hurtle,
    InterruptedError,
    Error,
    "The transfer was cancelled; what was verified is kept (exit code 130)."
);
create_exception!(
    hurtle,
    OtherError,
    Error,
    "Any other failure (exit code 1)."
);

/// How long the waiting thread lets the transfer run between two looks with the GIL.
const TICK: Duration = Duration::from_millis(100);
/// How long a cancelled transfer may take to end before the waiting thread gives up on it.
const GRACE: Duration = Duration::from_secs(10);

/// The Python exception of an API error: its kind's class, with `kind` and `exit_code`.
fn py_error(py: Python<'_>, e: &hurtle::Error) -> PyErr {
    let msg = e.to_string();
    let err = match e.kind() {
        ErrorKind::Usage => UsageError::new_err(msg),
        ErrorKind::Refused => RefusedError::new_err(msg),
        ErrorKind::Network => NetworkError::new_err(msg),
        ErrorKind::Verification => VerificationError::new_err(msg),
        ErrorKind::Storage => StorageError::new_err(msg),
        ErrorKind::Identity => IdentityError::new_err(msg),
        ErrorKind::Interrupted => InterruptedError::new_err(msg),
        _ => OtherError::new_err(msg),
    };
    let value = err.value(py);
    let _ = value.setattr("kind", e.kind().as_str());
    let _ = value.setattr("exit_code", e.exit_code());
    err
}

fn usage(py: Python<'_>, what: &str, detail: impl std::fmt::Display) -> PyErr {
    py_error(py, &hurtle::Error::Usage(format!("{what}: {detail}")))
}

/// An int, or a string that `parse` reads.
fn int_or_str(
    py: Python<'_>,
    what: &str,
    v: &Bound<'_, PyAny>,
    parse: fn(&str) -> Result<u64, String>,
) -> PyResult<u64> {
    if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_cow()?;
        return parse(&s).map_err(|e| usage(py, what, e));
    }
    v.extract::<u64>()
        .map_err(|_| usage(py, what, "expected an int or a string"))
}

/// One string, or a list of them (`what` names the option in the error).
fn strings(py: Python<'_>, what: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(s) = v.extract::<String>() {
        return Ok(vec![s]);
    }
    v.extract::<Vec<String>>()
        .map_err(|_| usage(py, what, "expected a string or a list of strings"))
}

/// Seconds as a duration (`what` names the option in the error).
fn seconds(py: Python<'_>, what: &str, secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| usage(py, what, "expected a positive number of seconds"))
}

/// One path, or a list of them.
fn paths(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    if let Ok(p) = v.extract::<PathBuf>() {
        return Ok(vec![p]);
    }
    v.extract::<Vec<PathBuf>>()
        .map_err(|_| usage(py, "paths", "expected a path or a list of paths"))
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Waiting => "waiting",
        Phase::Connecting => "connecting",
        Phase::SettingUp => "setting_up",
        Phase::Moving => "moving",
        _ => "other",
    }
}

/// An event as a dict: `{"event": NAME, ...}`.
fn event_dict<'py>(py: Python<'py>, e: &Event) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match e {
        Event::Phase(p) => {
            d.set_item("event", "phase")?;
            d.set_item("phase", phase_name(*p))?;
        }
        Event::Progress(s) => {
            d.set_item("event", "progress")?;
            d.set_item("total", s.total)?;
            d.set_item("resumed", s.resumed)?;
            d.set_item("sent", s.sent)?;
            d.set_item("confirmed", s.confirmed)?;
            d.set_item("rate_bps", s.rate_bps)?;
            d.set_item("moving_bps", s.moving_bps)?;
            d.set_item("files_done", s.files_done)?;
            d.set_item("elapsed", s.elapsed.as_secs_f64())?;
            d.set_item("phase", phase_name(s.phase))?;
            d.set_item("peer", s.peer.map(|a| a.to_string()))?;
            d.set_item("bottleneck", s.bottleneck.as_deref())?;
            d.set_item("path", s.path)?;
            d.set_item("moving", s.moving.clone())?;
        }
        Event::Waiting(w) => {
            d.set_item("event", "waiting")?;
            match w {
                Waiting::Listener { addr, up_to } => {
                    d.set_item("for", "listener")?;
                    d.set_item("address", addr.to_string())?;
                    d.set_item("up_to", up_to.as_secs_f64())?;
                }
                Waiting::Registration { code, up_to } => {
                    d.set_item("for", "registration")?;
                    d.set_item("code", code)?;
                    d.set_item("up_to", up_to.as_secs_f64())?;
                }
                Waiting::Receiver { code, valid } => {
                    d.set_item("for", "receiver")?;
                    d.set_item("code", code)?;
                    d.set_item("valid", valid.as_secs_f64())?;
                }
                _ => d.set_item("for", "other")?,
            }
        }
        Event::Found { to, relayed } => {
            d.set_item("event", "found")?;
            d.set_item("to", to.to_string())?;
            d.set_item("relayed", relayed)?;
        }
        Event::WrongCode { tries } => {
            d.set_item("event", "wrong_code")?;
            d.set_item("tries", tries)?;
        }
        Event::Bottleneck(b) => {
            d.set_item("event", "bottleneck")?;
            d.set_item("detail", b)?;
        }
        Event::FileStarted(name) => {
            d.set_item("event", "file_started")?;
            d.set_item("path", name)?;
        }
        Event::FileDone { done } => {
            d.set_item("event", "file_done")?;
            d.set_item("done", done)?;
        }
        Event::Path(p) => {
            d.set_item("event", "path")?;
            d.set_item("path", p)?;
        }
        _ => d.set_item("event", "other")?,
    }
    Ok(d)
}

/// Runs `transfer` to its end with the GIL released, taking it back every [`TICK`] to hand
/// events to `progress` and to check for signals. A signal (Ctrl-C), or an exception from
/// `progress`, cancels the transfer, waits for it to end (keeping what was verified), and is
/// raised. The summary comes back as a dict.
fn run<S: Serialize + Send + 'static>(
    py: Python<'_>,
    transfer: Transfer<S>,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let deliver = |py: Python<'_>| -> PyResult<()> {
        while let Ok(e) = transfer.events().try_recv() {
            if let Some(cb) = progress {
                cb.call1((event_dict(py, &e)?,))?;
            }
        }
        Ok(())
    };
    loop {
        let finished = py.detach(|| transfer.wait_timeout(TICK));
        let looked = deliver(py).and_then(|()| py.check_signals());
        if let Err(e) = looked {
            transfer.cancel();
            py.detach(|| transfer.wait_timeout(GRACE));
            return Err(e);
        }
        if finished {
            break;
        }
    }
    deliver(py)?;
    match transfer.wait() {
        Ok(summary) => {
            let text = serde_json::to_string(&summary)
                .map_err(|e| OtherError::new_err(format!("summary: {e}")))?;
            Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
        }
        Err(e) => Err(py_error(py, &e)),
    }
}

/// Sends `paths` (a path or a list; directories recursively) to a receiver, and returns the
/// summary as a dict. The receiver is `to="HOST[:PORT]"`, or found by `code` at `relay`; with
/// `relay` and no code the sender starts first: it offers a code at the relay, says it in a
/// `waiting` event (`{"event": "waiting", "for": "receiver", "code": ...}`), and sends to the
/// receiver given it (`receive(out, relay=..., sender_code=...)` or `hurtle receive CODE`).
/// `include` and `exclude` (a pattern or a list) are rsync's filter rules, the includes tried
/// first; `dry_run` moves nothing and the summary says what would move. `identity` (an
/// identity key file) replaces the code; the receiver is pinned in `known_receivers`.
#[pyfunction]
#[pyo3(signature = (paths, *, to=None, code=None, relay=None, key=None, identity=None,
    known_receivers=None, wait=None,
    channels=None, rate=None, rate_fixed=None, fair=false, transport="auto", chunk_size=None,
    payload=None, checksum=false, follow_symlinks=false, no_sparse=false, no_fec=false,
    no_encryption=false, cold_start=false, relay_only=false, include=None, exclude=None,
    dry_run=false, delete=false, log_dir=None, progress=None, progress_interval=0.2))]
#[allow(clippy::too_many_arguments)]
fn send(
    py: Python<'_>,
    paths: &Bound<'_, PyAny>,
    to: Option<String>,
    code: Option<String>,
    relay: Option<String>,
    key: Option<PathBuf>,
    identity: Option<PathBuf>,
    known_receivers: Option<PathBuf>,
    wait: Option<f64>,
    channels: Option<u64>,
    rate: Option<&Bound<'_, PyAny>>,
    rate_fixed: Option<&Bound<'_, PyAny>>,
    fair: bool,
    transport: &str,
    chunk_size: Option<&Bound<'_, PyAny>>,
    payload: Option<u64>,
    checksum: bool,
    follow_symlinks: bool,
    no_sparse: bool,
    no_fec: bool,
    no_encryption: bool,
    cold_start: bool,
    relay_only: bool,
    include: Option<&Bound<'_, PyAny>>,
    exclude: Option<&Bound<'_, PyAny>>,
    dry_run: bool,
    delete: bool,
    log_dir: Option<PathBuf>,
    progress: Option<&Bound<'_, PyAny>>,
    progress_interval: f64,
) -> PyResult<Py<PyAny>> {
    let paths = self::paths(py, paths)?;
    let mut b = hurtle::Sender::builder()
        .fair(fair)
        .checksum(checksum)
        .follow_symlinks(follow_symlinks)
        .no_sparse(no_sparse)
        .fec(!no_fec)
        .no_encryption(no_encryption)
        .cold_start(cold_start)
        .relay_only(relay_only)
        .dry_run(dry_run)
        .delete(delete)
        .progress_interval(interval(py, progress_interval)?);
    if let Some(w) = wait {
        b = b.wait(seconds(py, "wait", w)?);
    }
    if let Some(p) = include {
        for pattern in strings(py, "include", p)? {
            b = b.include(pattern);
        }
    }
    if let Some(p) = exclude {
        for pattern in strings(py, "exclude", p)? {
            b = b.exclude(pattern);
        }
    }
    b = b.transport(match transport {
        "auto" => Transport::Auto,
        "udp" => Transport::Udp,
        "tcp" => Transport::Tcp,
        t => {
            return Err(usage(
                py,
                "transport",
                format!("{t:?}: expected auto, udp or tcp"),
            ))
        }
    });
    if let Some(to) = to {
        b = b.to(to);
    }
    if let Some(code) = code {
        b = b.code(code);
    }
    if let Some(relay) = relay {
        b = b.relay(relay);
    }
    if let Some(key) = key {
        b = b.key_file(key);
    }
    if let Some(path) = identity {
        b = b.identity_file(path);
    }
    if let Some(path) = known_receivers {
        b = b.known_receivers(path);
    }
    if let Some(c) = channels {
        b = b.channels(c);
    }
    if let Some(r) = rate {
        b = b.rate_bps(int_or_str(py, "rate", r, values::parse_rate)?);
    }
    if let Some(r) = rate_fixed {
        b = b.rate_fixed_bps(int_or_str(py, "rate_fixed", r, values::parse_rate)?);
    }
    if let Some(c) = chunk_size {
        b = b.chunk_size(int_or_str(py, "chunk_size", c, values::parse_size)?);
    }
    if let Some(p) = payload {
        b = b.payload(p);
    }
    if let Some(d) = log_dir {
        b = b.log_dir(d);
    }
    let transfer = b
        .build()
        .and_then(|s| s.send(paths))
        .map_err(|e| py_error(py, &e))?;
    run(py, transfer, progress)
}

fn interval(py: Python<'_>, secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        usage(
            py,
            "progress_interval",
            "expected a positive number of seconds",
        )
    })
}

/// Receives one transfer into `out` and returns the summary as a dict. Listens on
/// `listen="HOST[:PORT]"` (default `0.0.0.0:7400`) for a sender holding `code` (default a new
/// one) or one of the keys in the file `keys`; with `relay="HOST[:PORT]"` the code is the
/// relay's, for a sender that finds this receiver there; with `relay` and `sender_code` (the
/// code a sender started first printed, `send(paths, relay=...)` without a code), it answers
/// that sender. With `identity` (this receiver's
/// identity key file) and `authorized` (its senders' public keys), senders holding one of those
/// keys are accepted without a code. `ready(address, code)` is called once it listens.
#[pyfunction]
#[pyo3(signature = (out, *, listen=None, relay=None, code=None, sender_code=None, keys=None, identity=None,
    authorized=None, overwrite=false,
    allow_delete=false, buffer_memory=None, max_channels=None, no_encryption=false, log_dir=None,
    idle_timeout=None, progress=None, ready=None, progress_interval=0.2))]
#[allow(clippy::too_many_arguments)]
fn receive(
    py: Python<'_>,
    out: PathBuf,
    listen: Option<String>,
    relay: Option<String>,
    code: Option<String>,
    sender_code: Option<String>,
    keys: Option<PathBuf>,
    identity: Option<PathBuf>,
    authorized: Option<PathBuf>,
    overwrite: bool,
    allow_delete: bool,
    buffer_memory: Option<&Bound<'_, PyAny>>,
    max_channels: Option<u64>,
    no_encryption: bool,
    log_dir: Option<PathBuf>,
    idle_timeout: Option<f64>,
    progress: Option<&Bound<'_, PyAny>>,
    ready: Option<&Bound<'_, PyAny>>,
    progress_interval: f64,
) -> PyResult<Py<PyAny>> {
    let mut b = hurtle::Receiver::builder()
        .out(out)
        .overwrite(overwrite)
        .allow_delete(allow_delete)
        .no_encryption(no_encryption)
        .progress_interval(interval(py, progress_interval)?);
    if let Some(l) = listen {
        b = b.listen(l);
    }
    if let Some(r) = relay {
        b = b.relay(r);
    }
    if let Some(c) = code {
        b = b.code(c);
    }
    if let Some(c) = sender_code {
        b = b.sender_code(c);
    }
    if let Some(k) = keys {
        b = b.keys_file(k);
    }
    if let Some(path) = identity {
        b = b.identity_file(path);
    }
    if let Some(path) = authorized {
        b = b.authorized_file(path);
    }
    if let Some(m) = buffer_memory {
        b = b.buffer_memory(int_or_str(py, "buffer_memory", m, values::parse_size)?);
    }
    if let Some(c) = max_channels {
        b = b.max_channels(c);
    }
    if let Some(d) = log_dir {
        b = b.log_dir(d);
    }
    if let Some(t) = idle_timeout {
        b = b.idle_timeout(seconds(py, "idle_timeout", t)?);
    }
    let receiver = py.detach(|| b.build()).map_err(|e| py_error(py, &e))?;
    if let Some(cb) = ready {
        cb.call1((receiver.local_addr().to_string(), receiver.code()))?;
    }
    let transfer = receiver.receive().map_err(|e| py_error(py, &e))?;
    run(py, transfer, progress)
}

/// The `hurtle` module.
#[pymodule]
#[pyo3(name = "hurtle")]
fn hurtle_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(send, m)?)?;
    m.add_function(wrap_pyfunction!(receive, m)?)?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("UsageError", py.get_type::<UsageError>())?;
    m.add("RefusedError", py.get_type::<RefusedError>())?;
    m.add("NetworkError", py.get_type::<NetworkError>())?;
    m.add("VerificationError", py.get_type::<VerificationError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    m.add("IdentityError", py.get_type::<IdentityError>())?;
    m.add("InterruptedError", py.get_type::<InterruptedError>())?;
    m.add("OtherError", py.get_type::<OtherError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
