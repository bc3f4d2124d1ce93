//! What a server serves: exports by name. The server asks an [`Exports`] at each option that
//! names one (`NBD_OPT_INFO`, `NBD_OPT_GO`, `NBD_OPT_EXPORT_NAME`, the meta-context options)
//! and at `NBD_OPT_LIST`; the set may change at any time (a host makes and ends devices while
//! others are served), and the implementation alone decides what is there. A connection keeps
//! the [`Export`] it was opened with until it ends: removing a name refuses new clients only
//! ([`Server::disconnect_export`](super::Server::disconnect_export) ends the others).
//!
//! Invariants: an export's name and description are at most [`MAX_STRING`] bytes (the spec's
//! limit; a longer one is left out of a list, and cannot be asked for); the empty name is the
//! default export only if the implementation opens one for it.
//!
//! Locking: [`ExportTable::exports`] is a leaf, held only to look up, insert, remove or copy
//! out; the server never calls an [`Exports`] with one of its own locks held.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ztier_blockdev::BlockDevice;

use crate::proto::*;

/// One export as a server serves it: its device and what a client is told of it.
///
/// Cheap to clone (the device and the counters are shared): an [`Exports`] keeps one and
/// hands out clones, so every connection to it counts in the same [`ExportStats`].
#[derive(Clone)]
pub struct Export {
    /// The canonical name (`NBD_INFO_NAME`), which a client that asked for the default
    /// export ("") learns.
    pub name: String,
    pub device: Arc<dyn BlockDevice>,
    /// Said by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`; empty for none.
    pub description: String,
    /// Writes, trims and zeroing are refused (`EPERM`) and `NBD_FLAG_READ_ONLY` is set.
    pub read_only: bool,
    /// The export's own counters, beside the server's totals.
    pub stats: Arc<ExportStats>,
}

impl Export {
    /// A writable export of `device` named `name`, with no description and fresh counters.
    pub fn new(name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Export {
        Export {
            name: name.into(),
            device,
            description: String::new(),
            read_only: false,
            stats: Arc::new(ExportStats::default()),
        }
    }

    pub fn with_description(mut self, description: impl Into<String>) -> Export {
        self.description = description.into();
        self
    }

    pub fn with_read_only(mut self, read_only: bool) -> Export {
        self.read_only = read_only;
        self
    }

    /// The transmission flags this export is served with.
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_CACHE
            | FLAG_CAN_MULTI_CONN;
        if self.read_only {
            f |= FLAG_READ_ONLY;
        } else {
            f |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        if structured {
            f |= FLAG_SEND_DF;
        }
        f
    }
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("name", &self.name)
            .field("size", &self.device.size())
            .field("description", &self.description)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// The exports a server offers, asked at negotiation.
///
/// Implementations are `Send + Sync` and do their own locking; they must not call back into
/// the server (it calls them with none of its locks held, but a host that holds its own
/// lock while asking the server, say [`connections_to`](super::Server::connections_to), must
/// not be called back under it). `open` is a look-up, called once per option that names an
/// export and by [`stats_for`](super::Server::stats_for): it makes nothing.
pub trait Exports: Send + Sync {
    /// The export called `name`, if there is one now; `""` asks for the default export,
    /// which an implementation may have or not (`None` refuses it).
    fn open(&self, name: &str) -> Option<Export>;
    /// Every export's (name, description), in the order `NBD_OPT_LIST` gives them.
    fn list(&self) -> Vec<(String, String)>;
}

/// The one export of a server made by [`Server::new`](super::Server::new): under its name
/// and as the default export.
pub struct SingleExport(Export);

impl SingleExport {
    pub fn new(export: Export) -> SingleExport {
        SingleExport(export)
    }
}

impl Exports for SingleExport {
    fn open(&self, name: &str) -> Option<Export> {
        (name.is_empty() || name == self.0.name).then(|| self.0.clone())
    }

    fn list(&self) -> Vec<(String, String)> {
        vec![(self.0.name.clone(), self.0.description.clone())]
    }
}

/// A table of exports by name, changed while the server serves them: what a host of
/// devices hands [`Server::with_exports`](super::Server::with_exports) unless it keeps its
/// own. The default export is the one named by [`set_default`](Self::set_default), if any.
#[derive(Default)]
pub struct ExportTable {
    /// The exports by name, and the default's name (a leaf lock: held to look up, change or
    /// copy out, never across I/O or a call out).
    exports: RwLock<TableState>,
}

#[derive(Default)]
struct TableState {
    by_name: BTreeMap<String, Export>,
    default: Option<String>,
}

impl ExportTable {
    pub fn new() -> ExportTable {
        ExportTable::default()
    }

    /// Adds `export` under its name, or replaces the one of that name (returned): new
    /// clients get it; connected ones keep the one they opened.
    pub fn insert(&self, export: Export) -> Option<Export> {
        let mut t = self.exports.write().unwrap_or_else(|p| p.into_inner());
        t.by_name.insert(export.name.clone(), export)
    }

    /// Takes the export `name` away from new clients (connected ones keep it until they end
    /// or [`Server::disconnect_export`](super::Server::disconnect_export) ends them).
    pub fn remove(&self, name: &str) -> Option<Export> {
        let mut t = self.exports.write().unwrap_or_else(|p| p.into_inner());
        t.by_name.remove(name)
    }

    /// Names the default export (what a client asking for "" gets), or none.
    pub fn set_default(&self, name: Option<String>) {
        self.exports
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .default = name;
    }

    pub fn get(&self, name: &str) -> Option<Export> {
        let t = self.exports.read().unwrap_or_else(|p| p.into_inner());
        let name = match (name, &t.default) {
            ("", Some(default)) => default.as_str(),
            (name, _) => name,
        };
        t.by_name.get(name).cloned()
    }

    pub fn len(&self) -> usize {
        self.exports
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_name
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Exports for ExportTable {
    fn open(&self, name: &str) -> Option<Export> {
        self.get(name)
    }

    fn list(&self) -> Vec<(String, String)> {
        let t = self.exports.read().unwrap_or_else(|p| p.into_inner());
        t.by_name
            .values()
            .map(|e| (e.name.clone(), e.description.clone()))
            .collect()
    }
}

/// One export's counters, kept with it (every connection that opened it adds to them) and
/// added to the server's totals as well.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Connections admitted to it, in all.
    pub connections: AtomicU64,
    /// Connections in their transmission phase on it now.
    pub live_connections: AtomicU64,
    /// Request headers read (`NBD_CMD_DISC` among them).
    pub requests: AtomicU64,
    /// Replies sent whole.
    pub replies: AtomicU64,
    /// Requests answered with an error (refused by the checks, or failed by the device).
    pub errors: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

impl ExportStats {
    /// The counters, each read once.
    pub fn counts(&self) -> ExportCounts {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ExportCounts {
            connections: load(&self.connections),
            live_connections: load(&self.live_connections),
            requests: load(&self.requests),
            replies: load(&self.replies),
            errors: load(&self.errors),
            bytes_read: load(&self.bytes_read),
            bytes_written: load(&self.bytes_written),
        }
    }
}

/// [`ExportStats`] read once, to print or export.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExportCounts {
    /// Connections admitted to the export, in all.
    pub connections: u64,
    /// Connections on it now.
    pub live_connections: u64,
    /// Request headers read.
    pub requests: u64,
    /// Replies sent whole.
    pub replies: u64,
    /// Requests answered with an error.
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ztier_blockdev::memory::MemoryDevice;

    fn export(name: &str) -> Export {
        Export::new(name, Arc::new(MemoryDevice::new(1 << 20).unwrap()))
    }

    #[test]
    fn a_table_opens_by_name_and_the_default_only_when_named() {
        let t = ExportTable::new();
        assert!(t.open("").is_none() && t.open("a").is_none());
        t.insert(export("a").with_description("first"));
        t.insert(export("b"));
        assert_eq!(t.open("a").unwrap().description, "first");
        assert!(t.open("").is_none(), "no default until one is named");
        t.set_default(Some("b".into()));
        assert_eq!(t.open("").unwrap().name, "b");
        assert_eq!(
            t.list(),
            vec![("a".into(), "first".into()), ("b".into(), String::new())]
        );
        // Clones share the counters.
        t.open("a")
            .unwrap()
            .stats
            .requests
            .fetch_add(3, Ordering::Relaxed);
        assert_eq!(t.open("a").unwrap().stats.counts().requests, 3);
        assert!(t.remove("a").is_some());
        assert!(t.open("a").is_none() && t.len() == 1);
    }
}
