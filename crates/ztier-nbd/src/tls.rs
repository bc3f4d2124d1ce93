//! TLS for NBD, the way the ecosystem does it: `NBD_OPT_STARTTLS` upgrades the socket during
//! option haggling (the spec's "TLS support"), and certificates come from a directory laid
//! out as nbdkit's `--tls-certificates` and libnbd's `tls-certificates=` expect:
//!
//! - a server reads `server-cert.pem` (its certificate, then any intermediates),
//!   `server-key.pem`, and, to verify clients (`verify_peer`), `ca-cert.pem` and the
//!   optional `ca-crl.pem`;
//! - a client reads `ca-cert.pem` (the CAs it trusts) and, if both are there,
//!   `client-cert.pem` and `client-key.pem`, which it shows a server that asks.
//!
//! The TLS stack is rustls with the `aws-lc-rs` provider (TLS 1.2 and 1.3; RSA keys of any
//! size from 2048 bits, as GnuTLS and OpenSSL take them, where `ring` takes only multiples of
//! 512 and refused nbd's own 2432-bit test key). A server certificate with no
//! subjectAltName is matched by its common name, as GnuTLS (libnbd, QEMU) does; one that
//! has a subjectAltName by it alone, as RFC 6125 asks.
//!
//! This module says whether TLS is offered and with which certificates and checks; the
//! bytes of a TLS session, over a socket, are [`crate::transport`]'s. No locks.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::der;

/// Whether a server offers TLS: nbdkit's and qemu-nbd's `--tls=off|on|require`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_UNSUP` (the spec's NOTLS).
    #[default]
    Off,
    /// TLS for the clients that ask, plain for the rest.
    On,
    /// TLS or nothing: every option before `NBD_OPT_STARTTLS` but `NBD_OPT_ABORT` is answered
    /// `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` closes the connection (FORCEDTLS).
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = BadTlsMode;
    fn from_str(s: &str) -> Result<TlsMode, BadTlsMode> {
        match s {
            "off" | "false" | "no" => Ok(TlsMode::Off),
            "on" | "true" | "yes" => Ok(TlsMode::On),
            "require" | "required" | "force" => Ok(TlsMode::Require),
            _ => Err(BadTlsMode(s.to_string())),
        }
    }
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

/// A certificate directory that could not be loaded, or a TLS setting that makes no sense:
/// which file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("TLS {0} needs certificates")]
    NoCertificates(TlsMode),
    #[error("reading {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// A PEM file that does not parse, or holds nothing of what it should.
    #[error("{}: {what}", path.display())]
    Pem { path: PathBuf, what: String },
    /// A key the TLS stack cannot sign with.
    #[error("{}: a key this TLS stack cannot use: {source}", path.display())]
    Key {
        path: PathBuf,
        source: rustls::Error,
    },
    /// rustls refused the configuration the directory makes.
    #[error("{}: {source}", path.display())]
    Config {
        path: PathBuf,
        source: rustls::Error,
    },
    /// The client's verifier could not be made from the directory's CAs and CRLs.
    #[error("{}: {source}", path.display())]
    Verifier {
        path: PathBuf,
        source: rustls::client::VerifierBuilderError,
    },
    #[error("no tls-certificates=DIR in the URI, and no ca-cert.pem in libnbd's default directories ($HOME/.pki/libnbd, $HOME/.config/pki/libnbd, /etc/pki/libnbd)")]
    NoClientDirectory,
    #[error("{name:?} is no server name: {reason}")]
    ServerName { name: String, reason: String },
}

/// A TLS mode not spelled as nbdkit's `--tls` takes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a TLS mode (off, on, require)")]
pub struct BadTlsMode(pub String);

/// A server's TLS setting ([`crate::ServerConfig::tls`]): its mode and, unless it is off, the
/// rustls configuration its handshakes use.
#[derive(Debug, Clone, Default)]
pub struct ServerTls {
    mode: TlsMode,
    config: Option<Arc<rustls::ServerConfig>>,
}

impl ServerTls {
    /// No TLS (the default).
    pub fn off() -> ServerTls {
        ServerTls::default()
    }

    /// `mode` with the certificates of `dir` (nbdkit's layout: `server-cert.pem`,
    /// `server-key.pem`; with `verify_peer`, clients must show a certificate that
    /// `ca-cert.pem` signed, and `ca-crl.pem` is honoured if present). With `mode` off the
    /// directory is not read.
    pub fn from_dir(mode: TlsMode, dir: &Path, verify_peer: bool) -> Result<ServerTls, TlsError> {
        if mode == TlsMode::Off {
            return Ok(ServerTls::off());
        }
        Ok(ServerTls {
            mode,
            config: Some(server_config(dir, verify_peer)?),
        })
    }

    /// `mode` with a rustls configuration made elsewhere (`None` only with mode off).
    pub fn new(
        mode: TlsMode,
        config: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<ServerTls, TlsError> {
        match (mode, &config) {
            (TlsMode::Off, _) => Ok(ServerTls::off()),
            (_, None) => Err(TlsError::NoCertificates(mode)),
            (_, Some(_)) => Ok(ServerTls { mode, config }),
        }
    }

    /// Where nbdkit looks when `--tls-certificates` is not given: `$HOME/.pki/nbdkit` for
    /// a user other than root, `/etc/pki/nbdkit` for root; `None` if it holds no
    /// `server-cert.pem`.
    pub fn default_dir() -> Option<PathBuf> {
        let dir = if rustix::process::geteuid().is_root() {
            PathBuf::from("/etc/pki/nbdkit")
        } else {
            PathBuf::from(std::env::var_os("HOME")?).join(".pki/nbdkit")
        };
        dir.join("server-cert.pem").exists().then_some(dir)
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// The configuration STARTTLS uses, if TLS is offered.
    pub(crate) fn config(&self) -> Option<&Arc<rustls::ServerConfig>> {
        self.config.as_ref().filter(|_| self.mode != TlsMode::Off)
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A PEM file at `path` that is not what it should be.
fn pem(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

/// rustls refused the configuration made from `path`.
fn config(path: &Path, source: rustls::Error) -> TlsError {
    TlsError::Config {
        path: path.to_path_buf(),
        source,
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(path, e))?;
    if certs.is_empty() {
        return Err(pem(path, "it holds no PEM certificate"));
    }
    Ok(certs)
}

/// The private key in `path`, checked to be one the provider can sign with (so a key it
/// cannot use is named by its own file, not by the directory).
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_file(path)?;
    let key = PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| pem(path, format!("no PEM private key ({e})")))?;
    provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|source| TlsError::Key {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(key)
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|source| TlsError::Config {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(roots)
}

fn crls(dir: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let path = dir.join("ca-crl.pem");
    if !path.exists() {
        return Ok(Vec::new());
    }
    let bytes = read_file(&path)?;
    CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(&path, e))
}

/// A server's rustls configuration from a certificate directory.
fn server_config(dir: &Path, verify_peer: bool) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(&dir.join("server-cert.pem"))?;
    let key = private_key(&dir.join("server-key.pem"))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| config(dir, source))?;
    let builder = if verify_peer {
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots(&dir.join("ca-cert.pem"))?),
            provider(),
        )
        .with_crls(crls(dir)?)
        .build()
        .map_err(|e| pem(dir, e))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut made = builder
        .with_single_cert(chain, key)
        .map_err(|source| config(dir, source))?;
    // No session tickets: NBD clients do not resume, and tickets are bytes sent after the
    // handshake that nobody reads.
    made.send_tls13_tickets = 0;
    Ok(Arc::new(made))
}

/// Where a client finds its certificates when the URI names no `tls-certificates`: as
/// libnbd, `$HOME/.pki/libnbd` or `$HOME/.config/pki/libnbd` (not root), else
/// `/etc/pki/libnbd`; the first holding `ca-cert.pem`.
fn default_client_dir() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut dirs = Vec::new();
    if !rustix::process::geteuid().is_root() {
        if let Some(h) = &home {
            dirs.push(h.join(".pki/libnbd"));
            dirs.push(h.join(".config/pki/libnbd"));
        }
    } else {
        dirs.push(PathBuf::from("/etc/pki/libnbd"));
    }
    dirs.into_iter().find(|d| d.join("ca-cert.pem").exists())
}

/// How a client checks and names the server (from an `nbds://` URI).
pub(crate) struct ClientTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    /// The name sent (SNI) and checked; for a Unix socket with no `tls-hostname`,
    /// "localhost", and only the chain is checked.
    pub(crate) name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientTls({:?})", self.name)
    }
}

/// A client's rustls configuration: the CAs of `dir` (or libnbd's default directories),
/// its own certificate if the directory has one, and the server's name to check (`None`:
/// the chain alone, as libnbd does on a Unix socket with no `tls-hostname`).
pub(crate) fn client_tls(dir: Option<&Path>, name: Option<&str>) -> Result<ClientTls, TlsError> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => default_client_dir().ok_or(TlsError::NoClientDirectory)?,
    };
    let roots = Arc::new(roots(&dir.join("ca-cert.pem"))?);
    let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .with_crls(crls(&dir)?)
        .build()
        .map_err(|source| TlsError::Verifier {
            path: dir.clone(),
            source,
        })?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| config(&dir, source))?;
    let check = match name {
        Some(_) => NameCheck::SubjectAltNameOrCommonName,
        None => NameCheck::ChainOnly,
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerVerifier { webpki, check }));
    let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    let config = if cert.exists() && key.exists() {
        builder
            .with_client_auth_cert(certificates(&cert)?, private_key(&key)?)
            .map_err(|source| config(&cert, source))?
    } else {
        builder.with_no_client_auth()
    };
    let name = ServerName::try_from(name.unwrap_or("localhost").to_string()).map_err(|e| {
        TlsError::ServerName {
            name: name.unwrap_or("").to_string(),
            reason: e.to_string(),
        }
    })?;
    Ok(ClientTls {
        config: Arc::new(config),
        name,
    })
}

/// What a client checks of a server certificate's name (its chain is always checked
/// against the CAs, and revocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameCheck {
    /// None: a Unix socket, which has no host name to check (libnbd's way).
    ChainOnly,
    /// The name against the subjectAltName, or, in a certificate with none, against the
    /// subject's common name (GnuTLS's way, which libnbd and QEMU use).
    SubjectAltNameOrCommonName,
}

/// WebPKI's verifier with the name check libnbd's users expect.
#[derive(Debug)]
struct ServerVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    check: NameCheck,
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // WebPKI checks the chain (and revocation) first and the name last: a name error
        // means the chain passed.
        let verified =
            self.webpki
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        let Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) = &verified
        else {
            return verified;
        };
        let name_matches = || match (server_name, der::names(end_entity)) {
            // GnuTLS's rule: one common name, and it is the host's.
            (ServerName::DnsName(dns), Some(names)) if !names.has_subject_alt_name => {
                matches!(&names.common_names[..], [cn] if cn.eq_ignore_ascii_case(dns.as_ref()))
            }
            _ => false,
        };
        match self.check {
            NameCheck::ChainOnly => Ok(ServerCertVerified::assertion()),
            NameCheck::SubjectAltNameOrCommonName if name_matches() => {
                Ok(ServerCertVerified::assertion())
            }
            NameCheck::SubjectAltNameOrCommonName => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_nbdkit_spells_them_and_a_bad_directory_names_its_file() {
        for (s, m) in [
            ("off", TlsMode::Off),
            ("on", TlsMode::On),
            ("require", TlsMode::Require),
        ] {
            assert_eq!(s.parse::<TlsMode>(), Ok(m));
            assert_eq!(m.to_string(), s);
        }
        assert!("sometimes".parse::<TlsMode>().is_err());
        // Off reads nothing; on and require need the files, and say which is missing.
        let none = Path::new("/nonexistent/ztier-tls");
        assert_eq!(
            ServerTls::from_dir(TlsMode::Off, none, true)
                .unwrap()
                .mode(),
            TlsMode::Off
        );
        let e = ServerTls::from_dir(TlsMode::Require, none, false).unwrap_err();
        assert!(e.to_string().contains("server-cert.pem"), "{e}");
        assert!(ServerTls::new(TlsMode::On, None).is_err());
        let e = client_tls(Some(none), None).unwrap_err();
        assert!(e.to_string().contains("ca-cert.pem"), "{e}");
    }
}
