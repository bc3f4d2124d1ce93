//! `ztier serve --config FILE`: a host's devices and settings in TOML (a `[host]` table and
//! a `[[device]]` table per device, the keys of `--device`), merged under the flags: a flag
//! given wins over the file.

use std::path::PathBuf;

use anyhow::{bail, Context};
use serde::Deserialize;
use ztier_host::{DeviceSpec, HostConfig};

use super::ServeArgs;
use crate::error::CliError;
use crate::size::{parse_positive_duration, parse_size};

/// `--config`'s file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    host: HostTable,
    #[serde(default)]
    device: Vec<toml::Table>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostTable {
    target: Option<toml::Value>,
    limit: Option<toml::Value>,
    interval: Option<String>,
    state_dir: Option<PathBuf>,
    store_dir: Option<PathBuf>,
    shared_store: Option<String>,
    shared_store_size: Option<toml::Value>,
    vhost_user_dir: Option<PathBuf>,
    socket: Option<PathBuf>,
    listen: Option<String>,
    control: Option<PathBuf>,
    metrics: Option<String>,
    max_connections: Option<usize>,
}

/// Connections a host of devices serves at once unless told: its guests together, each
/// usually one NBD connection (a VMM's swap disk), some a few.
const HOST_CONNECTIONS: usize = 1024;

/// A TOML value as the word a flag would be (`"64G"`, `65536`, `true`).
fn word(key: &str, v: &toml::Value) -> anyhow::Result<Vec<String>> {
    Ok(match v {
        toml::Value::String(s) => vec![s.clone()],
        toml::Value::Integer(i) => vec![i.to_string()],
        toml::Value::Boolean(b) => vec![b.to_string()],
        toml::Value::Array(items) => {
            let mut words = Vec::new();
            for item in items {
                words.extend(word(key, item)?);
            }
            words
        }
        other => bail!("{key}: {other} is not a string, a number or true/false"),
    })
}

/// The config file's `[[device]]` tables as specs.
fn device_specs(file: &ConfigFile) -> anyhow::Result<Vec<DeviceSpec>> {
    let mut specs = Vec::new();
    for (i, table) in file.device.iter().enumerate() {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (key, value) in table {
            for w in word(key, value).with_context(|| format!("[[device]] {}", i + 1))? {
                pairs.push((key.clone(), w));
            }
        }
        let spec =
            DeviceSpec::from_pairs(None, pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .with_context(|| format!("--config's [[device]] number {}", i + 1))?;
        specs.push(spec);
    }
    Ok(specs)
}

/// What the host runs with: the config file's settings under the flags'.
pub(super) struct Settings {
    pub(super) specs: Vec<DeviceSpec>,
    pub(super) host: HostConfig,
    pub(super) vhost_dir: Option<PathBuf>,
    pub(super) metrics: Option<String>,
    /// The one store every device writes back to, and the size to make its file at.
    pub(super) shared_store: Option<(String, Option<u64>)>,
    /// The flags, with the config's socket, listen and control where no flag gave them.
    pub(super) args: ServeArgs,
}

pub(super) fn settings(args: &ServeArgs) -> anyhow::Result<Settings> {
    let h = &args.host;
    let file: ConfigFile = match &h.config {
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(CliError::ConfigMissing { path: path.clone() }.into())
                }
                read => read.with_context(|| format!("reading --config {}", path.display()))?,
            };
            toml::from_str(&text).map_err(|e| CliError::config(path, &text, &e))?
        }
        None => ConfigFile::default(),
    };
    let size_of = |key: &str, v: &Option<toml::Value>| -> anyhow::Result<Option<u64>> {
        match v {
            None => Ok(None),
            Some(v) => {
                let w = word(key, v)?.join("");
                Ok(Some(
                    parse_size(&w).map_err(|e| anyhow::anyhow!("[host] {key}: {e}"))?,
                ))
            }
        }
    };
    let mut specs = device_specs(&file)?;
    // A device given by a flag and in the file: the flag's.
    for spec in &h.devices {
        specs.retain(|s| s.name != spec.name);
        specs.push(spec.clone());
    }
    let interval = match (&h.budget_interval, &file.host.interval) {
        (Some(d), _) => Some(*d),
        (None, Some(w)) => {
            Some(parse_positive_duration(w).map_err(|e| anyhow::anyhow!("[host] interval: {e}"))?)
        }
        (None, None) => None,
    };
    let host = HostConfig {
        target: h.host_target.or(size_of("target", &file.host.target)?),
        limit: h
            .host_limit
            .or(size_of("limit", &file.host.limit)?)
            .unwrap_or(0),
        interval,
        state_dir: h.state_dir.clone().or(file.host.state_dir),
        store_dir: h.store_dir.clone().or(file.host.store_dir),
        shared_store: None,
    };
    let shared_store = match h.shared_store.clone().or(file.host.shared_store) {
        Some(store) => Some((
            store,
            h.shared_store_size
                .or(size_of("shared_store_size", &file.host.shared_store_size)?),
        )),
        None => None,
    };
    let mut merged = args.clone();
    if merged.socket.is_none() && merged.listen.is_none() {
        merged.socket = file.host.socket;
        merged.listen = file.host.listen;
    }
    merged.control = merged.control.or(file.host.control);
    merged.max_connections = Some(
        merged
            .max_connections
            .or(file.host.max_connections)
            .unwrap_or(HOST_CONNECTIONS),
    );
    Ok(Settings {
        specs,
        host,
        vhost_dir: h.vhost_user_dir.clone().or(file.host.vhost_user_dir),
        metrics: h.metrics.clone().or(file.host.metrics),
        shared_store,
        args: merged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The config shipped beside the systemd unit reads as it says.
    #[test]
    fn the_shipped_config_reads() {
        let text = include_str!("../../../../contrib/systemd/host.toml");
        let file: ConfigFile = toml::from_str(text).unwrap();
        let specs = device_specs(&file).unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].name, "vm1");
        assert_eq!(specs[0].size, 64 << 30);
        assert_eq!(specs[0].mem_low, 512 << 20);
        assert_eq!(specs[1].compressor.to_string(), "zstd:level=3");
        assert_eq!(
            file.host.socket.as_deref(),
            Some(Path::new("/run/ztier/nbd.sock"))
        );
        assert!(file.host.target.is_some() && file.host.limit.is_some());
    }
}
