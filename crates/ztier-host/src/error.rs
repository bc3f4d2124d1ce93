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
    #[error("a target needs every device to have a store: give a store directory")]
    TargetWithoutStores,
}
