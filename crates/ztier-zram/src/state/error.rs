//! Why a saved state cannot be written, or read into a device: one variant a kind of
//! refusal, with the page, unit and figures it names ([`crate::ZramError::BadState`]
//! carries it). The words are the reasons `ztier serve` prints, and that tests look for.

use std::path::PathBuf;

use ztier_base::private_file::PrivateFileError;
use ztier_swap::{NotTheArea, SwapError};

use crate::writeback::WbFormat;

/// A saved state refused, or its file not written or read (see the module's header).
///
/// Causes are in the message, not also a `source` (a chain printed whole would say them
/// twice).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    // The device a state is loaded into.
    #[error("the device already holds pages")]
    DeviceNotEmpty,
    #[error("the device already has a backing store: load the state with the store given")]
    DeviceHasStore,

    // Saving.
    #[error("writing it: {0}")]
    Write(std::io::Error),
    /// A page recompressed, during a save, by a secondary algorithm set after the save's
    /// header named them.
    #[error(
        "the secondary algorithms changed during the save (page {index} is stored by \
         algorithm {priority}; the save began with {began_with})"
    )]
    SecondaryChangedDuringSave {
        index: u64,
        priority: u32,
        began_with: usize,
    },
    #[error("page {index} is on a backing store that is no longer set")]
    StoreGoneDuringSave { index: u64 },

    // Reading: the bytes.
    #[error("it is truncated")]
    Truncated,
    #[error("reading it: {0}")]
    Read(std::io::Error),
    #[error("its checksum does not match: it is damaged")]
    Checksum,
    #[error("it is not a ztier state")]
    NotAState,
    #[error(
        "it is version {version}; this ztier reads versions 1 to {}",
        super::VERSION
    )]
    Version { version: u32 },
    #[error("a name in it is not UTF-8")]
    NameNotUtf8,
    #[error("an unknown writeback format {code}")]
    UnknownWbFormat { code: u8 },
    #[error("an unknown store kind {kind}")]
    UnknownStoreKind { kind: u8 },

    // Reading: the state against the device.
    #[error(
        "it holds {pages} pages of {page_size} bytes; the device has {device_pages} of \
         {device_page_size}"
    )]
    Geometry {
        pages: u64,
        page_size: usize,
        device_pages: u64,
        device_page_size: usize,
    },
    #[error("it holds compression units of {state} bytes; the device stores units of {device}")]
    UnitSize { state: usize, device: usize },
    #[error("its pages are compressed with {state}; the device uses {device}")]
    Algorithm { state: String, device: String },
    #[error(
        "its secondary algorithms are [{}]; the device has [{}]",
        state.join(", "),
        device.join(", ")
    )]
    SecondaryAlgorithms {
        state: Vec<String>,
        device: Vec<String>,
    },

    // Reading: the records.
    #[error("page {index} is out of order or range")]
    PageOutOfOrder { index: u64 },
    /// Flags no save writes, which a crafted file may carry past the checksum.
    #[error("page {index} is stored by secondary algorithm {priority}; the state names {named}")]
    NoSuchSecondary {
        index: u64,
        priority: usize,
        named: usize,
    },
    #[error("page {index} is marked huge with a size of {size} (a huge page is stored whole)")]
    HugeNotWhole { index: u64, size: usize },
    #[error("page {index} is same-filled with a size of {size}")]
    SameWithSize { index: u64, size: usize },
    #[error("page {index}: a size of {size}")]
    Size { index: u64, size: usize },
    #[error("page {index}: an unknown kind {kind}")]
    UnknownKind { index: u64, kind: u8 },
    #[error("{units} units on the store")]
    TooManyUnits { units: u64 },

    // Reading: the store its written-back pages are on.
    #[error("{pages} of its pages are on a backing store, and none was given")]
    NoStoreGiven { pages: usize },
    #[error(
        "its pages were written back in the {state:?} format; the device writes back in \
         {device:?}"
    )]
    WbFormat { state: WbFormat, device: WbFormat },
    #[error(
        "its pages are on a backing store of {state} slots; the one given has {given}: a \
         different store layout"
    )]
    StoreSlots { state: u64, given: u64 },
    #[error(
        "the backing store is not the one its pages were written back to (its id is {}, the \
         state's {})",
        hex(store),
        hex(state)
    )]
    StoreId { store: [u8; 16], state: [u8; 16] },
    #[error("the backing store is not the one its pages were written back to: {0}")]
    StoreNotTheArea(NotTheArea),
    /// The store could not be reopened for another reason than its header.
    #[error("the backing store: {0}")]
    StoreReopen(SwapError),
    #[error(
        "the backing store changed after the state was saved (pages were written back or \
         freed since): the state no longer describes it"
    )]
    StoreChanged,
    #[error("a unit at slot {first} is not one on the store")]
    NotAUnit { first: u64 },
    #[error(
        "page {index}: its place on the store (slot {first}, byte {at}, {size} bytes) is in \
         no unit the state names"
    )]
    PlaceOutsideUnits {
        index: u64,
        first: u64,
        at: usize,
        size: usize,
    },
    #[error(
        "the unit at slot {first} holds {state} live bytes, but its pages {pages}: it is \
         damaged"
    )]
    UnitLiveBytes { first: u64, state: u32, pages: u64 },

    // Its files (`StateFile`).
    #[error("{action} {}: {cause}", path.display())]
    File {
        /// What was done to it: "removing", "syncing", "creating", …
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("renaming {} to {}: {cause}", from.display(), to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        cause: std::io::Error,
    },
    /// A file made or opened as a disk's pages are (`ztier_base::private_file`).
    #[error(transparent)]
    Private(PrivateFileError),
    /// `PATH.tmp` could not be made, so no state could be saved: refused at start.
    #[error("{} cannot be written: {cause}", path.display())]
    NotWritable {
        path: PathBuf,
        cause: Box<StateError>,
    },
    /// Only a consumed state (`PATH.loaded`) is there: the server that loaded it, or started
    /// with none (`started_empty`), did not stop cleanly.
    #[error("{}", not_stopped_cleanly(path, loaded, *started_empty))]
    NotStoppedCleanly {
        path: PathBuf,
        loaded: PathBuf,
        started_empty: bool,
    },
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// [`StateError::NotStoppedCleanly`]'s words: what the server did, what is lost, and the way
/// out.
fn not_stopped_cleanly(path: &std::path::Path, loaded: &std::path::Path, empty: bool) -> String {
    let (what, serve_it) = if empty {
        ("started with no state".to_string(), String::new())
    } else {
        (
            format!("loaded or saved {}", loaded.display()),
            format!(
                ", or rename it to {} to serve it as it was, without those writes",
                path.display()
            ),
        )
    };
    format!(
        "the server that {what} did not stop cleanly: writes it took since are lost; move {} \
         away to start empty{serve_it}",
        loaded.display()
    )
}
