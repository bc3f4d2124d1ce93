//! The CLI's errors a user makes and can mend ([`CliError`]), and how any error reaches the
//! user ([`one_line`]): one line, what was wrong (with the path, address or value) and what to
//! do.
//!
//! Invariants: a [`CliError`] says its cause in its own message and has no `source`, so a
//! chain printed whole never says it twice; its remedy is its variant's, never found by
//! reading another error's words. The library crates keep their typed errors; the commands
//! map the ones a user causes into a variant here, where they know the flag and the value.
//! No locks.

use std::fmt::Write as _;
use std::path::PathBuf;

use ztier_corpus::CorpusError;

/// A mistake on the command line or in the machine's setup, with its remedy.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A corpus that cannot be read, or is not one.
    #[error("the corpus {cause}: {}", corpus_remedy(cause))]
    Corpus { cause: CorpusError },
    /// A file to make (a socket, a saved state) whose directory is not there.
    #[error(
        "{flag} {}: the directory {} does not exist: make it (mkdir -p {}), or pass {flag} a \
         path in one that does",
        path.display(), dir.display(), dir.display()
    )]
    DirMissing {
        path: PathBuf,
        dir: PathBuf,
        flag: &'static str,
    },
    /// An address a listener cannot take as it is written.
    #[error("{flag} {addr}: {why}: give HOST:PORT, with a port from 1 to 65535")]
    BadAddress {
        addr: String,
        flag: &'static str,
        why: String,
    },
    /// A `--config` file that is not there.
    #[error(
        "--config {}: no such file: write one (the package's example: \
         /usr/share/doc/ztier/examples/host.toml; in the source tree, \
         contrib/systemd/host.toml), or pass --config another path",
        path.display()
    )]
    ConfigMissing { path: PathBuf },
    /// A Unix socket a live server answers on.
    #[error("{} is in use: a server {how}: stop it, or pass {flag} another path", path.display())]
    SocketInUse {
        path: PathBuf,
        /// "answers on it", or "is there, too busy to answer".
        how: &'static str,
        flag: &'static str,
    },
    /// A TCP address another process listens on.
    #[error("{addr} is in use by another process: stop it, or pass {flag} another address")]
    AddressInUse { addr: String, flag: &'static str },
    /// The kernel (or a seccomp profile) refuses this process a userfaultfd.
    #[error(
        "userfaultfd is not permitted to this process ({cause}): run as root, or set \
         vm.unprivileged_userfaultfd=1, or give it CAP_SYS_PTRACE or access to /dev/userfaultfd; \
         in a container, allow the userfaultfd system call in its seccomp profile"
    )]
    UserfaultfdNotPermitted { cause: std::io::Error },
    /// A backing store named as a file that cannot be opened or made.
    #[error(
        "{flag} {path}: {}: name a file in a directory that exists (ztier makes the file), \
         or an NBD export (nbd://HOST:PORT/NAME, nbd+unix:///NAME?socket=PATH)",
        file_cause(cause),
        path = path.display()
    )]
    StoreFile {
        flag: &'static str,
        path: PathBuf,
        cause: ztier_blockdev::BlockError,
    },
    /// A backing store named by a URI that is not NBD's.
    #[error(
        "{flag} {uri}: not a file nor an NBD URI (nbd://, nbd+unix://, nbds://, nbds+unix://): \
         serve the store over NBD and pass its URI (for Ceph RBD: qemu-storage-daemon's NBD \
         export of the image)"
    )]
    StoreScheme { flag: &'static str, uri: String },
    /// An NBD export a backing store names that cannot be reached.
    #[error(
        "{flag} {uri}: {cause}: start the NBD server that exports it (or check the URI's host, \
         port, socket and export name)"
    )]
    StoreExport {
        flag: &'static str,
        uri: String,
        cause: String,
    },
    /// A size that must be a whole number of pages.
    #[error(
        "{flag} {bytes}: not a positive whole number of {page_size}-byte pages: give a multiple \
         of {page_size} (such as 64K, 16M, 4G)"
    )]
    NotWholePages {
        flag: &'static str,
        bytes: u64,
        page_size: usize,
    },
    /// A flag of a host of devices given to a server of one device, which would not use it.
    #[error(
        "{flag} is a flag of a host of devices, and this serve has one device: give the \
         devices with --device NAME,size=SIZE (or --config FILE, --state-dir DIR), or leave \
         {flag} out"
    )]
    HostFlagWithoutHost { flag: &'static str },
    /// A `--config` file that does not parse as a host's settings.
    #[error(
        "--config {path}{at}: {message}: fix the file (its keys: `ztier serve --help`, \
         under --config)",
        path = path.display()
    )]
    Config {
        path: PathBuf,
        /// ", line L, column C", or nothing.
        at: String,
        message: String,
    },
    /// A control socket nothing answers on.
    #[error(
        "no ztier serve answers on {path} ({cause}): start `ztier serve`, or pass the --socket \
         (or --control) of the one running",
        path = path.display()
    )]
    NotServing {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Why a store's file could not be had, without the path its error names again.
fn file_cause(cause: &ztier_blockdev::BlockError) -> String {
    use ztier_base::private_file::PrivateFileError;
    match cause {
        ztier_blockdev::BlockError::File(PrivateFileError::Io { source, .. }) => source.to_string(),
        _ => cause.to_string(),
    }
}

/// What to do about a corpus refused: the bound, or what a corpus is.
fn corpus_remedy(cause: &CorpusError) -> &'static str {
    match cause {
        CorpusError::TooLarge { .. } => "pass --max-corpus a larger size, or a smaller corpus",
        _ => {
            "pass --corpus a corpus `ztier capture` wrote (NAME.pages.zst or NAME.pages), or no \
             --corpus for the bundled sample"
        }
    }
}

impl CliError {
    /// A `--config` file's TOML error, its place as line and column (toml's own rendering
    /// draws the line over several).
    pub fn config(path: &std::path::Path, text: &str, e: &toml::de::Error) -> CliError {
        let at = e.span().map_or(String::new(), |span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!(", line {line}, column {column}")
        });
        CliError::Config {
            path: path.to_owned(),
            at,
            message: e.message().trim_end().replace('\n', "; "),
        }
    }

    /// An NBD export `flag` names that could not be reached, said in words that do not name
    /// it again: the client's reason without the "connecting to URI" it puts before it (the
    /// error names the URI already).
    pub fn store_export(flag: &'static str, uri: &str, e: &ztier_blockdev::BlockError) -> Self {
        let reply = match e {
            ztier_blockdev::BlockError::Io(io) => io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<ztier_nbd::client::BadReply>()),
            _ => None,
        };
        CliError::StoreExport {
            flag,
            uri: uri.to_owned(),
            cause: reply.map_or_else(|| e.to_string(), |r| r.why.to_string()),
        }
    }

    /// A replay's error, as the user's mistake it is where it is one: the writeback file
    /// that cannot be made, a userfaultfd refused.
    pub fn from_replay(e: ztier_replay::ReplayError) -> anyhow::Error {
        match e {
            ztier_replay::ReplayError::WritebackFile { path, source } => CliError::StoreFile {
                flag: "--writeback-file",
                path,
                cause: source,
            }
            .into(),
            ztier_replay::ReplayError::Region {
                source: ztier_uffd::Error::NotPermitted(cause),
                ..
            } => CliError::UserfaultfdNotPermitted { cause }.into(),
            e => e.into(),
        }
    }

    /// A listener's bind refused: in use if the address is taken, else the error as it is.
    pub fn bind(addr: &str, flag: &'static str, e: std::io::Error) -> anyhow::Error {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            CliError::AddressInUse {
                addr: addr.to_owned(),
                flag,
            }
            .into()
        } else if e.kind() == std::io::ErrorKind::InvalidInput {
            CliError::BadAddress {
                addr: addr.to_owned(),
                flag,
                why: e.to_string(),
            }
            .into()
        } else {
            anyhow::Error::new(e).context(format!("{flag} {addr}"))
        }
    }
}

/// An error and its causes on one line, each cause said once: a cause whose words the line
/// holds already (an error that says its source in its own message, then names it as its
/// source too) is left out, and so are line breaks.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let words = cause.to_string().replace('\n', " ");
        let words = words.trim();
        if words.is_empty() || line.contains(words) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        let _ = write!(line, "{words}");
    }
    line
}

/// A command line clap refused, on one line as every other error: clap's own words (the
/// error and any tip), without its usage block, and where to look next. Help and version
/// requests are not errors and are not passed here.
pub fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let words: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more"))
        .map(|l| {
            l.strip_prefix("error: ")
                .or_else(|| l.strip_prefix("tip: "))
                .unwrap_or(l)
        })
        .collect();
    let mut line = String::new();
    for w in words {
        if !line.is_empty() {
            // A line that ends in a colon introduces the next (a list of missing flags).
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(w);
    }
    format!("{line}: try --help")
}
