//! The values a user writes, checked as the command line checks its flags: rates (`800M`,
//! `100MB/s`), sizes (`256M`), channel counts, chunk sizes and `HOST[:PORT]` addresses. Each
//! refusal is one line that says what is accepted; the builders turn it into
//! [`Error::Usage`](crate::Error::Usage), the command line's exit code 2.
//!
//! These are the rules of `hurtle send` and `hurtle receive`: the command's flags are parsed
//! with these functions, so that the two cannot drift apart.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

/// The receiver's default control port (`HOST` means `HOST:7400`).
pub const RECEIVER_PORT: u16 = 7400;
/// The relay's default port (`HOST` means `HOST:7401`).
pub const RELAY_PORT: u16 = 7401;
/// The most channels a receiver serves.
pub const MAX_CHANNELS: u16 = 32;

/// The rate forms [`parse_rate`] accepts, for its errors and the command's `--help`.
pub const RATE_FORMS: &str = "bits per second: 800M, 800Mbit, 800Mbit/s, 800Mbps, 1.5G, 250k, \
     1000; bytes per second: 100MB/s, 100MB, 100MiB/s, 100MiB";

/// Parses a rate into bits per second, each unit meaning what it says (the command's flags
/// use it too):
///
/// - a plain number or a decimal prefix (`k`, `M`, `G`, `T`; case does not matter) alone, or
///   followed by `bit`, `bits`, `bit/s`, `bits/s` or `bps`: bits per second (`800M`,
///   `800Mbit/s`, `800Mbps`);
/// - a decimal prefix followed by `B` or `B/s`, or a binary one (`Ki`, `Mi`, `Gi`, `Ti`)
///   followed by `B` or `B/s`: bytes per second (`100MB/s` is 800 Mbit/s, `100MiB/s` is
///   838.9 Mbit/s; `MB` means the same as `MB/s`).
///
/// Anything else is refused with the accepted forms: `Mb` and `Mb/s` (a lowercase `b` is read
/// as bits by some and bytes by others), `MBps`, a binary prefix without `B`, units of time
/// other than `/s`.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let refuse = |why: String| format!("{why} (accepted: {RATE_FORMS})");
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let Ok(v) = num.parse::<f64>() else {
        return Err(refuse(format!("{s:?}: expected a number and a unit")));
    };
    let unit = unit.trim_start();
    let power = |c: char| match c.to_ascii_lowercase() {
        'k' => Some(1),
        'm' => Some(2),
        'g' => Some(3),
        't' => Some(4),
        _ => None,
    };
    let (multiple, binary, rest) = match unit.chars().next().and_then(power) {
        None => (1.0, false, unit),
        Some(p) => match unit[1..].strip_prefix('i') {
            Some(rest) => (1024f64.powi(p), true, rest),
            None => (1000f64.powi(p), false, &unit[1..]),
        },
    };
    let bits_per_unit = match rest {
        "B" | "B/s" => 8.0,
        "" | "bit" | "bits" | "bit/s" | "bits/s" | "bps" if binary => {
            return Err(refuse(format!(
                "{s:?}: a binary prefix (Ki, Mi, Gi, Ti) is for bytes, as in 100MiB/s"
            )))
        }
        "" | "bit" | "bits" | "bit/s" | "bits/s" | "bps" => 1.0,
        "b" | "b/s" => return Err(refuse(format!("{s:?} is ambiguous: write bit/s or B/s"))),
        _ => return Err(refuse(format!("{s:?}: unknown unit {unit:?}"))),
    };
    let scaled = v * multiple * bits_per_unit;
    if !scaled.is_finite() || scaled.round() < 1.0 {
        return Err(refuse(format!("{s:?}: must be at least 1 bit per second")));
    }
    if scaled >= u64::MAX as f64 {
        return Err(refuse(format!("{s:?}: out of range")));
    }
    Ok(scaled.round() as u64)
}

/// Parses `1G`, `64M`, `4096` as bytes (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_scaled(s, 1024.0).map_err(|e| format!("{e} (expected a size like 1G or 64M)"))
}

fn parse_scaled(s: &str, base: f64) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['b', 'B', 'i']);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_lowercase() {
                'k' => base,
                'm' => base * base,
                'g' => base * base * base,
                't' => base * base * base * base,
                _ => return Err(format!("unknown suffix in {s:?}")),
            };
            (&t[..i], m)
        }
        _ => (t, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| format!("not a number: {s:?}"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("must be positive: {s:?}"));
    }
    let scaled = v * mult;
    if scaled < 1.0 || scaled >= u64::MAX as f64 {
        return Err(format!("out of range: {s:?}"));
    }
    Ok(scaled as u64)
}

/// Checks a channel count: 1 to [`MAX_CHANNELS`], an error otherwise (never silently changed).
pub fn check_channels(n: u64) -> Result<u16, String> {
    match u16::try_from(n) {
        Ok(c) if (1..=MAX_CHANNELS).contains(&c) => Ok(c),
        _ => Err(format!(
            "\"{n}\": expected a number of channels from 1 to {MAX_CHANNELS}"
        )),
    }
}

/// Parses a channel count as written (`4`): 1 to [`MAX_CHANNELS`].
pub fn parse_channels(s: &str) -> Result<u16, String> {
    let refuse = || format!("{s:?}: expected a number of channels from 1 to {MAX_CHANNELS}");
    s.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| check_channels(n).ok())
        .ok_or_else(refuse)
}

/// Parses a chunk size as written (`1M`, `64K`, bytes): a power of two from 1K to 64M.
pub fn parse_chunk_size(s: &str) -> Result<u64, String> {
    check_chunk_size(parse_size(s)?)
        .map_err(|_| format!("{s:?}: must be a power of two from 1K to 64M"))
}

/// Checks that `dir` is, or can be made, a writable directory (`what` names it in the
/// message: `out`, `--out`), before anything listens. The message is one line.
pub fn check_out_dir(dir: &Path, what: &str) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "{what} {}: exists and is not a directory",
                dir.display()
            ))
        }
        Ok(_) => {}
        Err(_) => std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {what} {}: {e}", dir.display()))?,
    }
    tempfile::Builder::new()
        .prefix(".hurtle-check-")
        .tempfile_in(dir)
        .map_err(|e| format!("cannot write into {what} {}: {e}", dir.display()))?;
    Ok(())
}

/// Checks a chunk size: a power of two from 1K to 64M.
pub fn check_chunk_size(v: u64) -> Result<u64, String> {
    if v.is_power_of_two() && (1024..=64 << 20).contains(&v) {
        Ok(v)
    } else {
        Err(format!("\"{v}\": must be a power of two from 1K to 64M"))
    }
}

/// Checks a datagram payload: 512 to 8900 bytes.
pub fn check_payload(v: u64) -> Result<u16, String> {
    let (lo, hi) = (
        hurtle_proto::wire::MIN_PAYLOAD,
        hurtle_proto::wire::MAX_PAYLOAD,
    );
    match u16::try_from(v) {
        Ok(p) if (lo..=hi).contains(&p) => Ok(p),
        _ => Err(format!("{v} is not in {lo}..={hi}")),
    }
}

/// A host name or IP address and a port, as given; resolved only when used, so that an
/// unknown host is a network error and a malformed address a usage error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Name or address, without brackets.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl HostPort {
    /// Parses `HOST`, `HOST:PORT`, `[V6]`, `[V6]:PORT` or a bare IPv6 address; `default_port`
    /// when none is given. Port 0 only when `zero_ok` (an address to listen on).
    pub fn parse(s: &str, default_port: u16, zero_ok: bool) -> Result<HostPort, String> {
        let s = s.trim();
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("{s:?}: a '[' without its ']'"))?;
            match after {
                "" => (host, None),
                p => (
                    host,
                    Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| format!("{s:?}: expected ':PORT' after ']'"))?,
                    ),
                ),
            }
        } else if s.matches(':').count() > 1 {
            (s, None)
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{s:?}: no host (expected HOST or HOST:PORT)"));
        }
        let port = match port {
            None => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(0) if !zero_ok => return Err(format!("{s:?}: port 0 cannot be connected to")),
                Ok(n) => n,
                Err(_) => return Err(format!("{s:?}: {p:?} is not a port (0 to 65535)")),
            },
        };
        Ok(HostPort {
            host: host.to_string(),
            port,
        })
    }

    /// The first address the name resolves to; `what` names it in the message (a name that
    /// does not resolve is a network failure, not a usage one).
    pub fn resolve(&self, what: &str) -> Result<SocketAddr, String> {
        let unresolved =
            |detail: String| format!("cannot resolve the {what} host {:?}: {detail}", self.host);
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| unresolved(e.to_string()))?
            .next()
            .ok_or_else(|| unresolved("no address".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_mean_bits_or_bytes_as_written() {
        assert_eq!(parse_rate("800M"), Ok(800_000_000));
        assert_eq!(parse_rate("100MB/s"), Ok(800_000_000));
        assert_eq!(parse_rate("100MiB/s"), Ok(838_860_800));
        assert!(parse_rate("100Mb").unwrap_err().contains("ambiguous"));
        assert!(parse_rate("0").is_err());
    }

    #[test]
    fn counts_and_sizes_out_of_range_are_refused() {
        assert_eq!(check_channels(32), Ok(32));
        assert!(check_channels(0).is_err() && check_channels(33).is_err());
        assert_eq!(check_chunk_size(64 << 10), Ok(64 << 10));
        assert!(check_chunk_size(3 << 10).is_err() && check_chunk_size(128 << 20).is_err());
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert!(check_payload(100).is_err());
        assert_eq!(parse_channels(" 4 "), Ok(4));
        for bad in ["0", "33", "70000", "-1", "x"] {
            let e = parse_channels(bad).unwrap_err();
            assert!(e.starts_with(&format!("{bad:?}: expected")), "{e}");
        }
        assert_eq!(parse_chunk_size("64K"), Ok(64 << 10));
        assert_eq!(
            parse_chunk_size("3K").unwrap_err(),
            "\"3K\": must be a power of two from 1K to 64M"
        );
    }

    #[test]
    fn an_out_dir_is_made_and_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("a/b");
        assert_eq!(check_out_dir(&made, "out"), Ok(()));
        assert!(made.is_dir());
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = check_out_dir(&file, "--out").unwrap_err();
        assert_eq!(
            e,
            format!("--out {}: exists and is not a directory", file.display())
        );
    }

    #[test]
    fn addresses_take_a_default_port() {
        let to = |s| HostPort::parse(s, RECEIVER_PORT, false);
        assert_eq!(to("[::1]").unwrap().port, 7400);
        assert_eq!(to("h:9").unwrap().to_string(), "h:9");
        for bad in ["", ":7400", "host:", "host:0", "[::1"] {
            assert!(to(bad).is_err(), "{bad:?}");
        }
        assert_eq!(HostPort::parse("0.0.0.0:0", 7400, true).unwrap().port, 0);
    }
}
