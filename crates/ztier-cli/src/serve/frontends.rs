//! The front ends `ztier serve` runs on its one device: the NBD server, the vhost-user-blk
//! server, or both, each knowing only the block-device trait. Stopped together: a signal, a
//! `--run` command's end, or one of them failing ends both.

use std::sync::Arc;

/// The servers of one device (at least one of them).
pub(super) struct Frontends {
    pub(super) nbd: Option<Arc<ztier_nbd::Server>>,
    pub(super) vhost: Option<Arc<ztier_vhost::Server>>,
}

impl Frontends {
    /// Stops taking connections and ends those served, each finishing what it has in hand.
    pub(super) fn stop(&self) {
        if let Some(s) = &self.nbd {
            s.stop();
        }
        if let Some(s) = &self.vhost {
            s.stop();
        }
    }

    /// Cuts the connections at once (the second signal), whatever they have in hand.
    pub(super) fn stop_now(&self) {
        if let Some(s) = &self.nbd {
            s.stop_now();
        }
        if let Some(s) = &self.vhost {
            s.stop_now();
        }
    }

    pub(super) fn is_stopping(&self) -> bool {
        self.nbd.as_ref().is_some_and(|s| s.is_stopping())
            || self.vhost.as_ref().is_some_and(|s| s.is_stopping())
    }
}
