//! Defaults from the environment and a configuration file, for flags a user would otherwise
//! repeat on every command (the relay above all). Precedence: a flag, then its environment
//! variable, then the file, then the built-in default.
//!
//! The file is TOML at `$HURTLE_CONFIG`, else `$XDG_CONFIG_HOME/hurtle/config.toml`, else
//! `~/.config/hurtle/config.toml`; a missing file is no error, an unknown key or a bad value is
//! a usage error that names the file:
//!
//! ```toml
//! relay = "relay.example.org:7401"   # HURTLE_RELAY: send --code, receive --relay
//! channels = 4                       # HURTLE_CHANNELS: send
//! rate = "800M"                      # HURTLE_RATE: send --rate
//! out = "/data/incoming"             # HURTLE_OUT: receive --out
//! ```

use crate::exit::Failure;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The keys the file may hold, with their environment variables.
pub const KEYS: [(&str, &str); 4] = [
    ("relay", "HURTLE_RELAY"),
    ("channels", "HURTLE_CHANNELS"),
    ("rate", "HURTLE_RATE"),
    ("out", "HURTLE_OUT"),
];

/// Defaults read once at start.
pub struct Defaults {
    env: BTreeMap<&'static str, String>,
    file: BTreeMap<String, String>,
    path: PathBuf,
}

impl Defaults {
    /// Reads the environment and the file.
    pub fn load() -> Result<Defaults, Failure> {
        let path = config_path(|k| std::env::var_os(k));
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(Failure::usage(format!(
                    "cannot read the configuration file {}: {e}",
                    path.display()
                )))
            }
        };
        Defaults::from_parts(|k| std::env::var(k).ok(), text.as_deref(), path)
    }

    /// Defaults from an environment lookup and the file's text (if any) read from `path`.
    pub fn from_parts(
        env: impl Fn(&str) -> Option<String>,
        text: Option<&str>,
        path: PathBuf,
    ) -> Result<Defaults, Failure> {
        let env = KEYS
            .iter()
            .filter_map(|&(_, var)| env(var).filter(|v| !v.is_empty()).map(|v| (var, v)))
            .collect();
        let mut file = BTreeMap::new();
        if let Some(text) = text {
            let bad = |what: String| Failure::usage(format!("{}: {what}", path.display()));
            let table: toml::Table = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
            for (key, value) in table {
                if !KEYS.iter().any(|&(k, _)| k == key) {
                    let known: Vec<&str> = KEYS.iter().map(|&(k, _)| k).collect();
                    return Err(bad(format!(
                        "unknown key {key:?} (known: {})",
                        known.join(", ")
                    )));
                }
                let text = match value {
                    toml::Value::String(s) => s,
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    other => {
                        return Err(bad(format!(
                            "{key} must be a string or a number, not {}",
                            other.type_str()
                        )))
                    }
                };
                file.insert(key, text);
            }
        }
        Ok(Defaults { env, file, path })
    }

    /// The value for `key` (one of [`KEYS`]) from the environment or the file, parsed, with a
    /// usage error naming where a bad value came from; `None` when neither sets it.
    pub fn get<T>(
        &self,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, Failure> {
        let var = KEYS
            .iter()
            .find(|&&(k, _)| k == key)
            .map(|&(_, v)| v)
            .unwrap_or_default();
        if let Some(v) = self.env.get(var) {
            return parse(v)
                .map(Some)
                .map_err(|e| Failure::usage(format!("{var}={v}: {e}")));
        }
        match self.file.get(key) {
            Some(v) => parse(v).map(Some).map_err(|e| {
                Failure::usage(format!("{} ({key} = {v:?}): {e}", self.path.display()))
            }),
            None => Ok(None),
        }
    }
}

/// Where the file is: `HURTLE_CONFIG`, else under `XDG_CONFIG_HOME`, else under `~/.config`.
fn config_path(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    let set = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = set("HURTLE_CONFIG") {
        return p;
    }
    let base = set("XDG_CONFIG_HOME")
        .or_else(|| set("HOME").map(|h| h.join(".config")))
        .unwrap_or_else(|| Path::new(".config").to_path_buf());
    base.join("hurtle").join("config.toml")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{parse_channels, parse_relay_target};

    fn defaults(env: &[(&str, &str)], file: Option<&str>) -> Result<Defaults, Failure> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Defaults::from_parts(
            move |k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            file,
            "/etc/x/config.toml".into(),
        )
    }

    #[test]
    fn the_environment_comes_before_the_file() {
        let file = "relay = \"file.example:9\"\nchannels = 3\n";
        let d = defaults(&[("HURTLE_RELAY", "env.example")], Some(file)).unwrap();
        let relay = d.get("relay", parse_relay_target).unwrap().unwrap();
        assert_eq!(relay.to_string(), "env.example:7401");
        assert_eq!(d.get("channels", parse_channels).unwrap(), Some(3));
        let d = defaults(&[], Some(file)).unwrap();
        let relay = d.get("relay", parse_relay_target).unwrap().unwrap();
        assert_eq!(relay.to_string(), "file.example:9");
        let d = defaults(&[("HURTLE_RELAY", "")], None).unwrap();
        assert!(d.get("relay", parse_relay_target).unwrap().is_none());
    }

    #[test]
    fn bad_values_and_keys_name_their_origin() {
        let d = defaults(&[("HURTLE_CHANNELS", "0")], None).unwrap();
        let e = d.get("channels", parse_channels).unwrap_err();
        assert_eq!(e.code, crate::exit::USAGE);
        assert!(
            e.error.to_string().starts_with("HURTLE_CHANNELS=0: "),
            "{}",
            e.error
        );
        let d = defaults(&[], Some("channels = 99")).unwrap();
        let e = d.get("channels", parse_channels).unwrap_err();
        assert!(e
            .error
            .to_string()
            .contains("/etc/x/config.toml (channels = \"99\")"));
        let e = defaults(&[], Some("relai = \"x\"")).err().unwrap();
        assert!(
            e.error.to_string().contains("unknown key \"relai\""),
            "{}",
            e.error
        );
        assert!(defaults(&[], Some("relay = [1]")).is_err());
        assert!(defaults(&[], Some("not toml")).is_err());
    }

    #[test]
    fn the_file_is_found_by_xdg_rules() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(
            config_path(env(&[("HURTLE_CONFIG", "/c.toml"), ("HOME", "/h")])),
            PathBuf::from("/c.toml")
        );
        assert_eq!(
            config_path(env(&[("XDG_CONFIG_HOME", "/x"), ("HOME", "/h")])),
            PathBuf::from("/x/hurtle/config.toml")
        );
        assert_eq!(
            config_path(env(&[("HOME", "/h")])),
            PathBuf::from("/h/.config/hurtle/config.toml")
        );
    }
}
