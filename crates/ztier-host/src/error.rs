//! Why the host refuses: each kind of refusal, with the device's name and the cause kept
//! whole (a zram error, a store's, a file's).

use std::path::PathBuf;

use ztier_zram::ZramError;

/// Why the host refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error("a device named {0} exists")]
    Exists(String),
    #[error("no device named {0}")]
    NoSuchDevice(String),
    #[error("device {name}")]
    Device {
        name: String,
        source: Box<ZramError>,
    },
    #[error("device {name}: its store {}", path.display())]
    Store {
        name: String,
        path: PathBuf,
        source: ztier_blockdev::BlockError,
    },
    #[error("device {name}: its state {}", path.display())]
    State {
        name: String,
        path: PathBuf,
        source: Box<ZramError>,
    },
    #[error("device {name}: starting its policy")]
    Policy {
        name: String,
        source: std::io::Error,
    },
    /// A device's saved spec (`NAME.spec` in the state directory) that cannot be written
    /// or read back.
    #[error("the saved spec {}", path.display())]
    SavedSpec {
        path: PathBuf,
        #[source]
        why: crate::spec::SavedSpecError,
    },
    #[error("the budget's thread: {0}")]
    Budget(std::io::Error),
    #[error(
        "a target needs every device to have a store: give a store directory or a shared store"
    )]
    TargetWithoutStores,
    #[error("a host's devices write back to a store directory or to one shared store, not both")]
    TwoKindsOfStore,
    #[error(
        "device {name}: store_limit limits a device's part of the host's shared store, and \
         this host has none (give it --shared-store)"
    )]
    StoreLimitWithoutSharedStore { name: String },
    /// A device's part of the shared store (its saved map, `NAME.volume` in the state
    /// directory) that cannot be saved or taken back.
    #[error("device {name}: its part of the shared store ({})", path.display())]
    Volume {
        name: String,
        path: PathBuf,
        #[source]
        why: VolumeError,
    },
}

/// Why a device's part of the shared store could not be saved or taken back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    File(#[from] ztier_base::private_file::PrivateFileError),
    #[error("{0}")]
    Thin(#[from] ztier_blockdev::thin::ThinError),
    #[error("{0}")]
    Store(#[from] ztier_blockdev::BlockError),
}
