//! Files that hold a disk's pages (a saved state, a backing file ztier makes): made private
//! whatever the umask, never reached through a symbolic link, and refused when another user
//! could have written them, as ssh refuses a private key others may change. Such a file is
//! every page of the disk, readable by whoever can open it; and a state is loaded and served
//! as it is (its checksum finds damage, not design), so one another user rewrote would serve
//! their pages.
//!
//! Invariant: a file made here is the process user's, mode 0600, and was not there before
//! (made with `O_EXCL`, so not a file or link planted ahead of it). No locks.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of every file made here.
pub const MODE: u32 = 0o600;

/// A file that may not be used, and why, in words that say what to do.
#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is a symbolic link; name the file itself")]
    Link { path: String },
    #[error(
        "{path} belongs to user {owner}, not to this server's user {me}: another user could \
         have written it (chown it to {me}, or move it away)"
    )]
    Owner { path: String, owner: u32, me: u32 },
    #[error(
        "{path} may be written by other users (mode {mode:04o}): they could have changed it \
         (chmod go-w it, or move it away)"
    )]
    Writable { path: String, mode: u32 },
}

fn io_error(path: &Path, source: io::Error) -> PrivateFileError {
    if source.raw_os_error() == Some(libc::ELOOP) {
        return PrivateFileError::Link {
            path: path.display().to_string(),
        };
    }
    PrivateFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Makes `path`, which must not exist (not even as a link): the process user's, mode 0600
/// whatever the umask, open for reading and writing.
pub fn create(path: &Path) -> Result<File, PrivateFileError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    // The umask can only have taken bits away; set exactly 0600 all the same.
    file.set_permissions(std::fs::Permissions::from_mode(MODE))
        .map_err(|e| io_error(path, e))?;
    Ok(file)
}

/// Opens `path`, which must exist, not through a link, for reading (and writing, if
/// `write`), refused if another user could have written it.
pub fn open(path: &Path, write: bool) -> Result<File, PrivateFileError> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    check(&file, path)?;
    Ok(file)
}

/// Opens `path` for reading and writing if it exists (as [`open`]), or makes it (as
/// [`create`]); `true` if it was made.
pub fn open_or_create(path: &Path) -> Result<(File, bool), PrivateFileError> {
    match create(path) {
        Ok(f) => Ok((f, true)),
        Err(PrivateFileError::Io { source, .. })
            if source.kind() == io::ErrorKind::AlreadyExists =>
        {
            open(path, true).map(|f| (f, false))
        }
        Err(e) => Err(e),
    }
}

/// Refused if another user could have written `file`: owned by someone else (root's files
/// are taken by root only), or writable by its group or by others.
pub fn check(file: &File, path: &Path) -> Result<(), PrivateFileError> {
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    let me = crate::os::effective_uid();
    if meta.uid() != me {
        return Err(PrivateFileError::Owner {
            path: path.display().to_string(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if meta.file_type().is_file() && mode & 0o022 != 0 {
        return Err(PrivateFileError::Writable {
            path: path.display().to_string(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ztier-private-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn made_files_are_0600_and_existing_ones_are_checked() {
        let d = dir("modes");
        let p = d.join("state");
        let f = create(&p).unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
        assert!(create(&p).is_err(), "made twice");
        drop(f);
        open(&p, false).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        let e = open(&p, false).unwrap_err();
        assert!(
            matches!(e, PrivateFileError::Writable { mode: 0o620, .. }),
            "{e}"
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        open(&p, false).unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(
            open(&link, false),
            Err(PrivateFileError::Link { .. })
        ));
        assert!(create(&link).is_err(), "made over a link");
        let _ = std::fs::remove_dir_all(&d);
    }
}
