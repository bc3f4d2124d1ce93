//! Where an export is: the NBD URI, as libnbd and QEMU write it (`nbd://`, `nbd+unix://`,
//! and their TLS forms `nbds://`, `nbds+unix://`), parsed and written back.

use std::path::PathBuf;
use std::str::FromStr;

/// The default NBD port.
pub const NBD_PORT: u16 = 10809;

/// Where an export is: `nbd://host[:port][/export]` or `nbd+unix:///export?socket=PATH`,
/// and over TLS, as libnbd writes them, `nbds://host[:port][/export][?QUERY]` or
/// `nbds+unix:///export?socket=PATH[&QUERY]`, the query taking `tls-certificates=DIR` (the
/// directory holding `ca-cert.pem`, and `client-cert.pem` with `client-key.pem` if the
/// server wants a client certificate) and `tls-hostname=NAME` (the name the server's
/// certificate must carry; by default the URI's host, and none on a Unix socket, where only
/// the chain to the CA is checked, as libnbd does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    pub target: Target,
    pub export: String,
    /// TLS (`nbds`): `NBD_OPT_STARTTLS` first, and a server that refuses it is refused.
    pub tls: Option<UriTls>,
}

/// The TLS part of an `nbds://` or `nbds+unix://` URI.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UriTls {
    /// `tls-certificates=DIR`; without it, libnbd's default directories
    /// (`$HOME/.pki/libnbd`, `$HOME/.config/pki/libnbd`, or `/etc/pki/libnbd` for root).
    pub certificates: Option<PathBuf>,
    /// `tls-hostname=NAME`.
    pub hostname: Option<String>,
}

impl Uri {
    /// Whether `s` is meant as an NBD URI (any of the four schemes), so a caller can tell
    /// one from a file name before parsing it.
    pub fn is_nbd_uri(s: &str) -> bool {
        ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
            .iter()
            .any(|p| s.starts_with(p))
    }
}

/// What is wrong with a string given as an NBD URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriProblem {
    #[error("no nbd:// scheme")]
    NoScheme,
    #[error("no ?socket=")]
    NoQuery,
    #[error("nbd+unix takes no host")]
    UnixWithHost,
    #[error("no socket= in the query")]
    NoSocket,
    #[error("no host")]
    NoHost,
    #[error("unclosed [")]
    UnclosedBracket,
    #[error("junk after ]")]
    JunkAfterBracket,
    #[error("bad port")]
    BadPort,
    #[error("{0}= is empty")]
    EmptyTlsKey(String),
    #[error("{0}: TLS with pre-shared keys is not supported")]
    PreSharedKeys(String),
}

/// A string that is not an NBD URI, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not an NBD URI ({problem}): use nbd://HOST[:PORT][/EXPORT] or nbd+unix:///EXPORT?socket=PATH (nbds:// and nbds+unix:// for TLS)")]
pub struct BadUri {
    pub given: String,
    pub problem: UriProblem,
}

/// The query's `tls-*` keys (the others are left to the caller, e.g. `socket`).
fn uri_tls(query: &str) -> std::result::Result<UriTls, UriProblem> {
    let mut tls = UriTls::default();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "tls-certificates" if !v.is_empty() => tls.certificates = Some(PathBuf::from(v)),
            "tls-hostname" if !v.is_empty() => tls.hostname = Some(v.to_string()),
            "tls-certificates" | "tls-hostname" => {
                return Err(UriProblem::EmptyTlsKey(k.to_string()))
            }
            "tls-psk-file" | "tls-username" => {
                return Err(UriProblem::PreSharedKeys(k.to_string()))
            }
            _ => {}
        }
    }
    Ok(tls)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl FromStr for Uri {
    type Err = BadUri;

    fn from_str(given: &str) -> std::result::Result<Uri, BadUri> {
        Uri::parse(given).map_err(|problem| BadUri {
            given: given.to_string(),
            problem,
        })
    }
}

impl Uri {
    fn parse(s: &str) -> std::result::Result<Uri, UriProblem> {
        let (s, tls) = if let Some(rest) = s.strip_prefix("nbds://") {
            // The query is TLS's: split it off before the export.
            let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
            (format!("nbd://{rest}"), Some(uri_tls(query)?))
        } else if let Some(rest) = s.strip_prefix("nbds+unix://") {
            let tls = uri_tls(rest.split_once('?').map_or("", |(_, q)| q))?;
            (format!("nbd+unix://{rest}"), Some(tls))
        } else {
            (s.to_string(), None)
        };
        let s = s.as_str();
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let (path_part, query) = rest.split_once('?').ok_or(UriProblem::NoQuery)?;
            if !path_part.is_empty() && !path_part.starts_with('/') {
                return Err(UriProblem::UnixWithHost);
            }
            let export = path_part.trim_start_matches('/').to_string();
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .filter(|p| !p.is_empty())
                .ok_or(UriProblem::NoSocket)?;
            return Ok(Uri {
                target: Target::Unix(PathBuf::from(socket)),
                export,
                tls,
            });
        }
        let rest = s.strip_prefix("nbd://").ok_or(UriProblem::NoScheme)?;
        let (authority, export) = match rest.split_once('/') {
            Some((a, e)) => (a, e.to_string()),
            None => (rest, String::new()),
        };
        if authority.is_empty() {
            return Err(UriProblem::NoHost);
        }
        // [v6addr]:port, host:port, host
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or(UriProblem::UnclosedBracket)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| UriProblem::BadPort)?,
                None if after.is_empty() => NBD_PORT,
                None => return Err(UriProblem::JunkAfterBracket),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| UriProblem::BadPort)?),
                None => (authority.to_string(), NBD_PORT),
            }
        };
        Ok(Uri {
            target: Target::Tcp { host, port },
            export,
            tls,
        })
    }
}

impl std::fmt::Display for Uri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        let mut query = Vec::new();
        if let Target::Unix(p) = &self.target {
            query.push(format!("socket={}", p.display()));
        }
        if let Some(t) = &self.tls {
            if let Some(d) = &t.certificates {
                query.push(format!("tls-certificates={}", d.display()));
            }
            if let Some(h) = &t.hostname {
                query.push(format!("tls-hostname={h}"));
            }
        }
        match &self.target {
            Target::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd{s}://[{host}]:{port}/{}", self.export)?
            }
            Target::Tcp { host, port } => write!(f, "nbd{s}://{host}:{port}/{}", self.export)?,
            Target::Unix(_) => write!(f, "nbd{s}+unix:///{}", self.export)?,
        }
        if !query.is_empty() {
            write!(f, "?{}", query.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        let u: Uri = "nbd://example.org:10810/disk".parse().unwrap();
        assert_eq!(
            u.target,
            Target::Tcp {
                host: "example.org".into(),
                port: 10810
            }
        );
        assert_eq!(u.export, "disk");
        let u: Uri = "nbd://10.0.0.2".parse().unwrap();
        assert_eq!(
            u.target,
            Target::Tcp {
                host: "10.0.0.2".into(),
                port: NBD_PORT
            }
        );
        assert_eq!(u.export, "");
        let u: Uri = "nbd://[::1]:10811/x".parse().unwrap();
        assert_eq!(
            u.target,
            Target::Tcp {
                host: "::1".into(),
                port: 10811
            }
        );
        let u: Uri = "nbd+unix:///wb?socket=/run/nbd.sock".parse().unwrap();
        assert_eq!(u.target, Target::Unix("/run/nbd.sock".into()));
        assert_eq!(u.export, "wb");
        assert_eq!(u.to_string(), "nbd+unix:///wb?socket=/run/nbd.sock");
        for bad in [
            "http://x",
            "nbd://",
            "nbd://h:port",
            "nbd+unix:///x",
            "nbd+unix://host/x?socket=/s",
            "nbd://[::1",
        ] {
            assert!(bad.parse::<Uri>().is_err(), "{bad}");
        }
    }
}
