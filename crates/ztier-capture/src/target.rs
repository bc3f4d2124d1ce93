//! What a capture reads: the processes named (`--pid`, as many as given), or every process of
//! a cgroup and of the cgroups below it (`--cgroup PATH`), so a program of several processes
//! (PostgreSQL's postmaster and backends, a browser) is captured as one, as the kernel would
//! swap it: private pages per process, shared pages once.
//!
//! The processes named are the capture's for its whole length: one that exits ends it. A
//! cgroup's are listed again at every epoch (`cgroup.procs` of PATH and of every directory
//! below it, a cgroup v2 or v1 hierarchy): a process that joined since is read from that
//! epoch on, one that left or exited between two epochs is no longer read (its pages go), and
//! one that exits while an epoch reads it has the epoch read again without it.

use std::path::{Path, PathBuf};

use crate::{CaptureError, Result};

/// The processes a capture reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// These processes, for the whole capture.
    Pids(Vec<u32>),
    /// Every process of this cgroup and of its descendants, listed at each epoch.
    Cgroup(PathBuf),
}

impl Target {
    /// The pids to read now, in increasing order, each once: for a cgroup, its processes
    /// listed now ([`CaptureError::NotACgroup`] if PATH has no `cgroup.procs`).
    pub fn pids(&self) -> Result<Vec<u32>> {
        let mut pids = match self {
            Target::Pids(pids) => pids.clone(),
            Target::Cgroup(path) => {
                if !path.join("cgroup.procs").is_file() {
                    return Err(CaptureError::NotACgroup { path: path.clone() });
                }
                let mut pids = Vec::new();
                cgroup_pids(path, &mut pids)?;
                pids
            }
        };
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// The cgroup's path, for a cgroup.
    pub fn cgroup(&self) -> Option<&Path> {
        match self {
            Target::Pids(_) => None,
            Target::Cgroup(path) => Some(path),
        }
    }
}

/// Appends the pids of `dir/cgroup.procs` and of every cgroup below `dir`.
fn cgroup_pids(dir: &Path, pids: &mut Vec<u32>) -> Result<()> {
    let io = |path: PathBuf| move |error| CaptureError::Io { path, error };
    let procs = dir.join("cgroup.procs");
    let text = std::fs::read_to_string(&procs).map_err(io(procs.clone()))?;
    for line in text.lines().filter(|l| !l.is_empty()) {
        pids.push(line.trim().parse().map_err(|_| CaptureError::Malformed {
            path: procs.clone(),
            reason: format!("not a pid: {line:?}"),
        })?);
    }
    for entry in std::fs::read_dir(dir).map_err(io(dir.to_owned()))? {
        let entry = entry.map_err(io(dir.to_owned()))?;
        // A cgroup's children are its directories (its files are its controls).
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            cgroup_pids(&entry.path(), pids)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_tree_lists_every_process_below_it_once() {
        let dir = std::env::temp_dir().join(format!("ztier-capture-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "30\n10\n").unwrap();
        std::fs::write(dir.join("a/cgroup.procs"), "").unwrap();
        std::fs::write(dir.join("a/b/cgroup.procs"), "20\n10\n").unwrap();
        let target = Target::Cgroup(dir.clone());
        assert_eq!(target.pids().unwrap(), [10, 20, 30]);
        assert_eq!(target.cgroup(), Some(dir.as_path()));
        std::fs::write(dir.join("a/b/cgroup.procs"), "x\n").unwrap();
        assert!(matches!(target.pids(), Err(CaptureError::Malformed { .. })));
        assert!(matches!(
            Target::Cgroup(dir.join("a/missing")).pids(),
            Err(CaptureError::NotACgroup { .. })
        ));
        assert_eq!(Target::Pids(vec![5, 3, 5]).pids().unwrap(), [3, 5]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
