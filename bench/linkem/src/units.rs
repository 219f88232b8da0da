//! Parsers for the human-friendly quantities on linkem's command line:
//! durations (`40ms`), bit rates (`300M`), byte sizes (`256k`) and
//! probabilities (`0.01` or `1%`).

use anyhow::{bail, Context, Result};

/// Split `"40ms"` into `(40.0, "ms")`.
fn split_num(s: &str) -> Result<(f64, String)> {
    let s = s.trim();
    let idx = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e'))
        .unwrap_or(s.len());
    // "1e3ms" is odd but harmless; a bare suffix like "ms" is an error.
    let (num, unit) = s.split_at(idx);
    if num.is_empty() {
        bail!("missing number in {s:?}");
    }
    let v: f64 = num
        .parse()
        .with_context(|| format!("bad number in {s:?}"))?;
    if !v.is_finite() || v < 0.0 {
        bail!("value must be finite and non-negative: {s:?}");
    }
    Ok((v, unit.trim().to_ascii_lowercase()))
}

/// Parse a duration into nanoseconds. Units: `ns`, `us`, `ms`, `s`; a bare
/// number is milliseconds (the unit netem users expect).
pub fn parse_duration_ns(s: &str) -> Result<u64> {
    let (v, unit) = split_num(s)?;
    let mul = match unit.as_str() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "" | "ms" => 1e6,
        "s" => 1e9,
        _ => bail!("unknown duration unit in {s:?} (use ns, us, ms, s)"),
    };
    let ns = v * mul;
    if ns > 3.6e12 {
        bail!("duration {s:?} is longer than an hour");
    }
    Ok(ns.round() as u64)
}

/// Parse a bit rate into bits per second (SI, decimal multiples).
/// `0` means unlimited. Accepts `300M`, `300Mbit`, `1.5G`, `800k`, `1000000`.
pub fn parse_rate_bps(s: &str) -> Result<u64> {
    let (v, unit) = split_num(s)?;
    let unit = unit
        .trim_end_matches("bit/s")
        .trim_end_matches("bps")
        .trim_end_matches("bit");
    let mul = match unit {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        _ => bail!("unknown rate unit in {s:?} (use k, M, G; bits per second)"),
    };
    let bps = v * mul;
    if bps > 1e13 {
        bail!("rate {s:?} is implausibly high");
    }
    Ok(bps.round() as u64)
}

/// Parse a byte size (binary multiples): `256k` = 262144, `4M`, `1500`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let (v, unit) = split_num(s)?;
    let unit = unit.trim_end_matches("ib").trim_end_matches('b');
    let mul = match unit {
        "" => 1.0,
        "k" => 1024.0,
        "m" => 1024.0 * 1024.0,
        "g" => 1024.0 * 1024.0 * 1024.0,
        _ => bail!("unknown size unit in {s:?} (use k, M, G; bytes)"),
    };
    let b = v * mul;
    if b > 64.0 * 1024.0 * 1024.0 * 1024.0 {
        bail!("size {s:?} is implausibly large");
    }
    Ok(b.round() as u64)
}

/// Parse a probability: `0.01` or `1%`. Must be in `[0, 1]`.
pub fn parse_prob(s: &str) -> Result<f64> {
    let t = s.trim();
    let p = if let Some(pct) = t.strip_suffix('%') {
        pct.trim()
            .parse::<f64>()
            .with_context(|| format!("bad percentage {s:?}"))?
            / 100.0
    } else {
        t.parse::<f64>()
            .with_context(|| format!("bad probability {s:?}"))?
    };
    if !(0.0..=1.0).contains(&p) {
        bail!("probability {s:?} not in [0, 1]");
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("40ms").unwrap(), 40_000_000);
        assert_eq!(parse_duration_ns("40").unwrap(), 40_000_000);
        assert_eq!(parse_duration_ns("2.5us").unwrap(), 2_500);
        assert_eq!(parse_duration_ns("1s").unwrap(), 1_000_000_000);
        assert_eq!(parse_duration_ns("0").unwrap(), 0);
        assert!(parse_duration_ns("ms").is_err());
        assert!(parse_duration_ns("-1ms").is_err());
        assert!(parse_duration_ns("3 parsecs").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate_bps("300M").unwrap(), 300_000_000);
        assert_eq!(parse_rate_bps("1.5G").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate_bps("800kbit").unwrap(), 800_000);
        assert_eq!(parse_rate_bps("0").unwrap(), 0);
        assert!(parse_rate_bps("12X").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("256k").unwrap(), 262_144);
        assert_eq!(parse_bytes("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("1500").unwrap(), 1500);
    }

    #[test]
    fn probs() {
        assert_eq!(parse_prob("0.01").unwrap(), 0.01);
        assert!((parse_prob("2%").unwrap() - 0.02).abs() < 1e-12);
        assert!(parse_prob("1.5").is_err());
        assert!(parse_prob("nan").is_err());
    }
}
