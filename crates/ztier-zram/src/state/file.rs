//! A state's files at `PATH` (the protocol is the parent module's header): a state is
//! served at most once (consumed when loaded), saved to `PATH.tmp`, synced and renamed into
//! place, and every file made private (`ztier_base::private_file`). Saves are one at a time
//! in the process (a static mutex, taken alone).

use ztier_base::private_file::{self, PrivateFileError};

use super::{StateError, StateSummary};
use crate::{Device, Result};

/// A state's files at `PATH` (see the module's header for the protocol): `PATH`, a state
/// no server has loaded; `PATH.loaded`, the one a running server loaded or saved while it
/// went on serving (or, empty, the mark of a server that started with none); `PATH.tmp`, a
/// save under way.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: std::path::PathBuf,
}

/// `action` ("removing", "syncing", …) on `path` failed with `cause`.
fn file_error(action: &'static str, path: &std::path::Path, cause: std::io::Error) -> StateError {
    StateError::File {
        action,
        path: path.to_owned(),
        cause,
    }
}

fn rename_error(from: &std::path::Path, to: &std::path::Path, cause: std::io::Error) -> StateError {
    StateError::Rename {
        from: from.to_owned(),
        to: to.to_owned(),
        cause,
    }
}

/// Removes `path` if it is there (a file or a link, never what a link points to).
fn remove_if_there(path: &std::path::Path) -> std::result::Result<(), StateError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(file_error("removing", path, e)),
    }
}

impl StateFile {
    pub fn new(path: impl Into<std::path::PathBuf>) -> StateFile {
        StateFile { path: path.into() }
    }

    /// `PATH`.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    fn with(&self, suffix: &str) -> std::path::PathBuf {
        let mut p = self.path.as_os_str().to_owned();
        p.push(suffix);
        p.into()
    }

    /// `PATH.loaded`: the state a running server consumed.
    pub fn loaded_path(&self) -> std::path::PathBuf {
        self.with(".loaded")
    }

    fn tmp_path(&self) -> std::path::PathBuf {
        self.with(".tmp")
    }

    /// Removes `PATH.tmp`, the file of a save that will not finish (the process is ending in
    /// the middle of one): the other files stay as they were, as after a crash.
    pub fn remove_unfinished_save(&self) {
        let _ = std::fs::remove_file(self.tmp_path());
    }

    /// Makes the directory's changes durable (a rename, a removal).
    fn sync_dir(&self) -> Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| file_error("syncing", dir, e).into())
    }

    /// At start, before anything is served: proves the directory takes the state (`PATH.tmp`
    /// made and removed), and opens the state to load. `None` if there is none; refused if
    /// the only one is consumed (a server that loaded it, or started with none, did not stop
    /// cleanly: what it served since is lost, and serving the state would hide that).
    pub fn open(&self) -> Result<Option<std::fs::File>> {
        let tmp = self.tmp_path();
        self.fresh_tmp().map_err(|cause| StateError::NotWritable {
            path: self.path.clone(),
            cause: Box::new(cause),
        })?;
        std::fs::remove_file(&tmp).map_err(|e| file_error("removing", &tmp, e))?;
        // Not through a link, and not one another user could have written (module
        // `ztier_base::private_file`).
        match private_file::open(&self.path, false) {
            Ok(f) => return Ok(Some(f)),
            Err(PrivateFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StateError::Private(e).into()),
        }
        let loaded = self.loaded_path();
        match std::fs::metadata(&loaded) {
            Ok(m) => Err(StateError::NotStoppedCleanly {
                path: self.path.clone(),
                loaded,
                started_empty: m.len() == 0,
            }
            .into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file_error("looking at", &loaded, e).into()),
        }
    }

    /// Once a state is loaded (`loaded`), or none was there, and before a client is served:
    /// `PATH` becomes `PATH.loaded` (or an empty `PATH.loaded` is made), so a server that does
    /// not stop cleanly leaves no state that would load as if nothing had been written since.
    pub fn consume(&self, loaded: bool) -> Result<()> {
        let to = self.loaded_path();
        if loaded {
            std::fs::rename(&self.path, &to).map_err(|e| rename_error(&self.path, &to, e))?;
        } else {
            remove_if_there(&to)?;
            private_file::create(&to)
                .map_err(StateError::Private)?
                .sync_all()
                .map_err(|e| file_error("creating", &to, e))?;
        }
        self.sync_dir()
    }

    /// `PATH.tmp`, made anew (one left by a save cut short, or a link, is removed first):
    /// mode 0600, the process user's.
    fn fresh_tmp(&self) -> std::result::Result<std::fs::File, StateError> {
        let tmp = self.tmp_path();
        remove_if_there(&tmp)?;
        private_file::create(&tmp).map_err(StateError::Private)
    }

    /// Saves `device`'s state: to `PATH.tmp`, synced, then renamed into place. At a clean
    /// stop (`stopped`, the server taking no more requests) it becomes `PATH` and
    /// `PATH.loaded` goes; while the server goes on serving it becomes `PATH.loaded` (a
    /// state the writes after it would make stale). A save that fails leaves the files as
    /// they were, but for `PATH.tmp`.
    ///
    /// Saves are one at a time in the process (a `ctl save` and the stop's, or two `ctl
    /// save`s, would otherwise write one `PATH.tmp` together and rename each other's away).
    pub fn save(&self, device: &Device, stopped: bool) -> Result<StateSummary> {
        static ONE_SAVE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        // A save that panicked left nothing the next needs undone: its PATH.tmp is rewritten.
        let _saving = ONE_SAVE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let tmp = self.tmp_path();
        let file = self.fresh_tmp()?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let summary = device.save_state(&mut out)?;
        let file = out
            .into_inner()
            .map_err(|e| file_error("writing", &tmp, e.into_error()))?;
        file.sync_all()
            .map_err(|e| file_error("syncing", &tmp, e))?;
        let to = if stopped {
            self.path.clone()
        } else {
            self.loaded_path()
        };
        std::fs::rename(&tmp, &to).map_err(|e| rename_error(&tmp, &to, e))?;
        if stopped {
            // The rename durable before the consumed state goes: a power loss must never
            // keep the removal without the rename (the next start would be empty, silently).
            self.sync_dir()?;
            match std::fs::remove_file(self.loaded_path()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(file_error("removing", &self.loaded_path(), e).into()),
            }
        }
        self.sync_dir()?;
        Ok(summary)
    }
}
