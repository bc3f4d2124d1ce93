//! A server's backing stores: a one-device server's (`--backing-dev`: a file, or an NBD
//! export whose identity is pinned once written) and its state file (`--state`), opened,
//! loaded and saved; a host's shared store (`--shared-store`: a file or an NBD export, its
//! label pinned as the export's identity). A host's own store directory is `ztier_host`'s.
//! No locks.

use std::sync::Arc;

use anyhow::{bail, Context};
use ztier_blockdev::BlockDevice;
use ztier_nbd::{Client, ClientConfig};
use ztier_zram::{Backing, Device, StateFile};

use super::ServeArgs;
use crate::error::CliError;

/// Saves the device's state at `path` ([`StateFile::save`]: a temporary file beside it,
/// synced, then renamed into place, so a crash mid-save leaves the files as they were). At
/// a clean stop (`stopped`) it becomes `path`; while the server goes on serving, the
/// consumed `path.loaded`. A line says what.
pub(super) fn save_state(
    device: &Device,
    path: &std::path::Path,
    stopped: bool,
) -> anyhow::Result<String> {
    let start = std::time::Instant::now();
    let file = StateFile::new(path);
    let summary = file.save(device, stopped)?;
    let to = if stopped {
        path.to_path_buf()
    } else {
        file.loaded_path()
    };
    Ok(format!(
        "state saved to {}: {} pages ({} of them on the backing store), {} bytes, \
         mem_used_total {}, in {:.2} s",
        to.display(),
        summary.pages,
        summary.from_backing_store,
        summary.bytes,
        device.mm_stat().mem_used_total,
        start.elapsed().as_secs_f64()
    ))
}

/// Loads the state at `path` into the new device, if there is one, with the backing store
/// the flags name (not formatted: the state decides whether its pages are there). Returns
/// whether a state was loaded, and the NBD client of a remote store it opened.
pub(super) fn load_state(
    device: &Device,
    path: &std::path::Path,
    args: &ServeArgs,
) -> anyhow::Result<(bool, Option<Arc<Client>>)> {
    let start = std::time::Instant::now();
    // Refused here if the directory cannot take a state, or the state was consumed by a
    // server that did not stop cleanly.
    let Some(file) = StateFile::new(path)
        .open()
        .with_context(|| format!("--state {}", path.display()))?
    else {
        return Ok((false, None));
    };
    let mut input = std::io::BufReader::with_capacity(1 << 20, file);
    let context = || {
        format!(
            "loading the state {} (move it away to start empty)",
            path.display()
        )
    };
    let (summary, link) = match open_store(args)? {
        Some((store, link)) => {
            let summary = device
                .load_state_with_store(&mut input, store, args.writeback_format)
                .with_context(context)?;
            if let (Some(client), Some(backing)) = (&link, device.backing()) {
                let (offset, len) = backing.identity();
                client
                    .pin_identity(offset, len)
                    .context("reading back the backing store's identity")?;
                client.set_log(|line| eprintln!("ztier serve: {line}"));
            }
            (summary, link)
        }
        None => {
            let summary =
                device
                    .load_state(&mut input)
                    .with_context(|| match &args.backing_dev {
                        Some(b) => format!("{} (the backing store {b} is missing)", context()),
                        None => context(),
                    })?;
            (summary, None)
        }
    };
    eprintln!(
        "ztier serve: state loaded from {}: {} pages ({} of them on the backing store), \
         mem_used_total {}, in {:.2} s",
        path.display(),
        summary.pages,
        summary.from_backing_store,
        device.mm_stat().mem_used_total,
        start.elapsed().as_secs_f64()
    );
    Ok((true, link))
}

/// A backing store's block device, and the NBD client under it if it is remote.
pub(super) type OpenedStore = (Arc<dyn BlockDevice>, Option<Arc<Client>>);

/// The backing store `--backing-dev` names, opened as it is (a file only if it exists, at
/// its own size), for a state to re-attach.
pub(super) fn open_store(args: &ServeArgs) -> anyhow::Result<Option<OpenedStore>> {
    let Some(spec) = &args.backing_dev else {
        return Ok(None);
    };
    if ztier_nbd::Uri::is_nbd_uri(spec) {
        let client = connect_export(args, "--backing-dev", spec)?;
        return Ok(Some((
            Arc::clone(&client) as Arc<dyn BlockDevice>,
            Some(client),
        )));
    }
    refuse_foreign_uri("--backing-dev", spec)?;
    let path = std::path::Path::new(spec);
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    let file = ztier_blockdev::file::FileDevice::open(path, meta.len()).map_err(|cause| {
        CliError::StoreFile {
            flag: "--backing-dev",
            path: spec.into(),
            cause,
        }
    })?;
    warn_if_readable_by_others(spec);
    Ok(Some((Arc::new(file), None)))
}

/// Says so when an existing backing file (one ztier makes is 0600) may be read by other
/// users: every page written back is in it. Its mode is the owner's choice; it is used as
/// it is.
pub(super) fn warn_if_readable_by_others(path: &str) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o044 != 0 {
            eprintln!(
                "ztier serve: WARNING: the backing file {path} may be read by other users \
                 (mode {mode:04o}), and it holds every page written back: chmod go-r it"
            );
        }
    }
}

/// The NBD export `flag` (`--backing-dev`, `--shared-store`) names, connected with
/// `--backing-timeout`.
pub(super) fn connect_export(
    args: &ServeArgs,
    flag: &'static str,
    spec: &str,
) -> anyhow::Result<Arc<Client>> {
    let uri: ztier_nbd::Uri = spec
        .parse()
        .map_err(|e| anyhow::anyhow!("{flag} {spec}: {e}"))?;
    let config = ClientConfig {
        io_timeout: args.backing_timeout,
        ..ClientConfig::default()
    };
    let client =
        Client::connect_with(&uri, config).map_err(|e| CliError::store_export(flag, spec, &e))?;
    Ok(Arc::new(client))
}

/// A store named by a URI of a scheme ztier does not speak (`rbd://`, `ceph://`, `http://`):
/// refused rather than taken for a file of that name.
pub(super) fn refuse_foreign_uri(flag: &'static str, spec: &str) -> Result<(), CliError> {
    if spec.contains("://") && !ztier_nbd::Uri::is_nbd_uri(spec) {
        return Err(CliError::StoreScheme {
            flag,
            uri: spec.to_owned(),
        });
    }
    Ok(())
}

/// The backing store `--backing-dev` names, and the NBD client under it if it is remote.
pub(super) fn backing_store(
    args: &ServeArgs,
) -> anyhow::Result<Option<(Backing, Option<Arc<Client>>)>> {
    let Some(spec) = &args.backing_dev else {
        return Ok(None);
    };
    if ztier_nbd::Uri::is_nbd_uri(spec) {
        let client = connect_export(args, "--backing-dev", spec)?;
        let backing = Backing::new(
            Arc::clone(&client) as Arc<dyn BlockDevice>,
            args.writeback_format,
        )
        .with_context(|| format!("setting up the backing store {spec}"))?;
        // Written by Backing::new: from now on only this store is ever read back.
        let (offset, len) = backing.identity();
        client.pin_identity(offset, len).with_context(|| {
            format!("reading back the identity just written to {}", client.uri())
        })?;
        client.set_log(|line| eprintln!("ztier serve: {line}"));
        return Ok(Some((backing, Some(client))));
    }
    let bytes = args
        .backing_size
        .unwrap_or(Backing::size_for(args.size.unwrap_or(0)));
    refuse_foreign_uri("--backing-dev", spec)?;
    let file = ztier_blockdev::file::FileDevice::open(std::path::Path::new(spec), bytes).map_err(
        |cause| CliError::StoreFile {
            flag: "--backing-dev",
            path: spec.into(),
            cause,
        },
    )?;
    warn_if_readable_by_others(spec);
    let backing = Backing::new(Arc::new(file), args.writeback_format)
        .with_context(|| format!("setting up the backing store {spec}"))?;
    Ok(Some((backing, None)))
}

/// The host's one store (`--shared-store`): an NBD export, or a file (made at `size` if
/// missing), cut into extents each device takes its own of.
pub(super) fn open_shared_store(
    args: &ServeArgs,
    spec: &str,
    size: Option<u64>,
) -> anyhow::Result<Arc<ztier_blockdev::thin::ThinStore>> {
    refuse_foreign_uri("--shared-store", spec)?;
    let mut remote = None;
    let device: Arc<dyn ztier_blockdev::BlockDevice> = if ztier_nbd::Uri::is_nbd_uri(spec) {
        let client = connect_export(args, "--shared-store", spec)?;
        client.set_log(|line| eprintln!("ztier serve: {line}"));
        remote = Some(Arc::clone(&client));
        client
    } else {
        let path = std::path::Path::new(spec);
        let bytes = match (size, std::fs::metadata(path)) {
            (Some(size), _) => size,
            (None, Ok(meta)) => meta.len(),
            (None, Err(_)) => {
                bail!("the shared store {spec} does not exist: give --shared-store-size to make it")
            }
        };
        let file = ztier_blockdev::file::FileDevice::open(path, bytes).map_err(|cause| {
            CliError::StoreFile {
                flag: "--shared-store",
                path: spec.into(),
                cause,
            }
        })?;
        warn_if_readable_by_others(spec);
        Arc::new(file)
    };
    let store = ztier_blockdev::thin::ThinStore::labelled(
        device,
        ztier_blockdev::thin::DEFAULT_EXTENT_SIZE,
    )
    .with_context(|| format!("the shared store {spec}"))?;
    // Its label is the export's identity: the client waits for a lost store, reconnects,
    // and refuses one that came back empty or is another.
    if let (Some(client), Some((offset, len))) = (remote, store.identity()) {
        client
            .pin_identity(offset, len)
            .with_context(|| format!("reading back the label of the shared store {spec}"))?;
    }
    Ok(store)
}
