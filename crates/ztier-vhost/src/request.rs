//! One virtio-blk request: a descriptor chain read, checked and run on the block device.
//!
//! A request is a chain of descriptors: device-readable first (a 16-byte header: `le32
//! type; le32 reserved; le64 sector`, then a write's data or a discard's segments), then
//! device-writable (a read's data, `GET_ID`'s serial), the last writable byte the status.
//! Guest memory is reached only through virtio-queue's `Reader` and `Writer`, which resolve
//! every descriptor against the frontend's memory regions first and refuse one that falls
//! outside them; the guest may change its buffers while they are read, so the header is
//! copied once and never read again.
//!
//! What a malformed request gets (it harms nothing and never panics). The chain is looked
//! over whole first (at most the queue's size of descriptors, or an indirect table's, so a
//! looping chain ends): its status is the last byte of its last descriptor, which must be
//! writable and in the guest's memory, else there is no status to set and the chain is
//! returned used with nothing written. Otherwise: a descriptor outside the guest's memory,
//! a readable descriptor after a writable one, more descriptors than a header, `SEG_MAX`
//! of data and a status, or a header shorter than 16 bytes is `IOERR` with nothing read;
//! data not a whole number of sectors, in the wrong direction for its type, or a range past
//! the end `IOERR` with the device untouched; an unknown type, or a discard with flags,
//! `UNSUPP`; a write to a read-only device `IOERR`. Each is counted.
//!
//! No locks: a queue's requests are run by its own thread with its own scratch buffer.

use std::io::{Read, Write};
use std::ops::Deref;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use virtio_queue::{DescriptorChain, Reader, Writer};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};
use ztier_base::bytes::ByteReader;
use ztier_blockdev::BlockDevice;

use crate::config::{DeviceConfig, MAX_DISCARD_SECTORS, MAX_DISCARD_SEGMENTS, SECTOR};

/// The request header's bytes.
const HEADER_BYTES: usize = 16;
/// A discard or zero-write segment's bytes: `le64 sector; le32 num_sectors; le32 flags`.
const SEGMENT_BYTES: usize = 16;
/// The largest piece of a read or write copied through the scratch buffer at once: a
/// request of any length costs its queue at most this much memory.
pub const SCRATCH_BYTES: usize = 1 << 20;

/// What a request's type says to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    In,
    Out,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    /// A type virtio-blk has that this device does not (or none at all).
    Unknown(u32),
}

impl Kind {
    fn of(t: u32) -> Kind {
        match t {
            VIRTIO_BLK_T_IN => Kind::In,
            VIRTIO_BLK_T_OUT => Kind::Out,
            VIRTIO_BLK_T_FLUSH => Kind::Flush,
            VIRTIO_BLK_T_GET_ID => Kind::GetId,
            VIRTIO_BLK_T_DISCARD => Kind::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => Kind::WriteZeroes,
            other => Kind::Unknown(other),
        }
    }
}

/// How a request ended, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: `OK`.
    Done(Kind),
    /// The device failed it (`IOERR`).
    DeviceError(Kind),
    /// Past the end, in the wrong direction for its type, or not whole sectors: `IOERR`,
    /// the device untouched.
    Refused(Kind),
    /// No request to speak of: a descriptor outside the guest's memory, readable
    /// descriptors after writable ones, too many descriptors, or a short header: `IOERR`.
    Malformed,
    /// A type or flag the device does not do: `UNSUPP`.
    Unsupported,
    /// No status byte to write: the chain's last descriptor is not writable guest memory
    /// (or the chain is empty). Used with nothing written.
    Unanswerable,
}

/// The status byte of an outcome.
fn status(o: Outcome) -> u8 {
    (match o {
        Outcome::Done(_) => VIRTIO_BLK_S_OK,
        Outcome::DeviceError(_)
        | Outcome::Refused(_)
        | Outcome::Malformed
        | Outcome::Unanswerable => VIRTIO_BLK_S_IOERR,
        Outcome::Unsupported => VIRTIO_BLK_S_UNSUPP,
    }) as u8
}

/// Runs the request `chain` holds on `dev`; returns how it ended and the bytes written into
/// the guest's buffers (the used length: data and the status byte).
pub fn run<M>(
    chain: DescriptorChain<M>,
    dev: &dyn BlockDevice,
    config: &DeviceConfig,
    scratch: &mut Vec<u8>,
) -> (Outcome, u32)
where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    let mem = chain.memory();
    // The chain looked over whole before anything is read: its length, its order (readable
    // descriptors first, then writable: a Reader and a Writer would each take their own
    // kind from anywhere in it), whether every descriptor lies in the guest's memory, and
    // the last one, whose last byte is the status. The walk is bounded: the iterator follows
    // at most the queue's size of descriptors (or an indirect table's), so a loop ends.
    let mut count = 0usize;
    let mut seen_writable = false;
    let mut ordered = true;
    let mut inside = true;
    let mut last = None;
    for d in chain.clone() {
        count += 1;
        if d.is_write_only() {
            seen_writable = true;
        } else if seen_writable {
            ordered = false;
        }
        inside &= mem.check_range(d.addr(), d.len() as usize, Permissions::Read);
        last = Some(d);
    }
    let Some(status_at) = last
        .filter(|d| d.is_write_only() && d.len() > 0)
        .and_then(|d| d.addr().checked_add(u64::from(d.len()) - 1))
        .filter(|&at| mem.check_range(at, 1, Permissions::Write))
    else {
        return (Outcome::Unanswerable, 0);
    };
    // A header and a status, and at most `seg_max` descriptors of data between them.
    let too_long = count > config.seg_max() as usize + 2;
    let parts = if ordered && inside && !too_long {
        chain
            .clone()
            .reader(mem)
            .ok()
            .zip(chain.clone().writer(mem).ok())
    } else {
        None
    };
    let Some((mut reader, mut writer)) = parts else {
        return answer(mem, status_at, Outcome::Malformed, 0);
    };
    // The status byte is the writer's last: the data is what comes before it.
    let data_bytes = writer.available_bytes() - 1;
    if writer.split_at(data_bytes).is_err() {
        return answer(mem, status_at, Outcome::Malformed, 0);
    }
    let outcome = run_parsed(&mut reader, &mut writer, dev, config, scratch);
    answer(mem, status_at, outcome, writer.bytes_written())
}

/// Writes `outcome`'s status at `status_at` (checked to be writable guest memory) and
/// returns the used length: `data` bytes written before it, and the status.
fn answer<G: GuestMemory + ?Sized>(
    mem: &G,
    status_at: GuestAddress,
    outcome: Outcome,
    data: usize,
) -> (Outcome, u32) {
    let written = mem
        .get_slices(status_at, 1, Permissions::Write)
        .ok()
        .and_then(|mut slices| slices.next())
        .and_then(Result::ok)
        .is_some_and(|slice| slice.write_obj(status(outcome), 0).is_ok());
    if !written {
        return (Outcome::Unanswerable, 0);
    }
    (outcome, u32::try_from(data + 1).unwrap_or(u32::MAX))
}

/// The header read, then the request of its type.
fn run_parsed<B: vm_memory::bitmap::BitmapSlice>(
    reader: &mut Reader<'_, B>,
    writer: &mut Writer<'_, B>,
    dev: &dyn BlockDevice,
    config: &DeviceConfig,
    scratch: &mut Vec<u8>,
) -> Outcome {
    let mut header = [0u8; HEADER_BYTES];
    if reader.read_exact(&mut header).is_err() {
        return Outcome::Malformed;
    }
    let mut fields = ByteReader::new(&header);
    let (Ok(kind), Ok(_reserved), Ok(sector)) = (fields.u32_le(), fields.u32_le(), fields.u64_le())
    else {
        return Outcome::Malformed;
    };
    let kind = Kind::of(kind);
    let writes = matches!(kind, Kind::Out | Kind::Discard | Kind::WriteZeroes);
    if writes && config.read_only {
        return Outcome::Refused(kind);
    }
    match kind {
        Kind::In => {
            // Data only in the writable part; nothing readable past the header.
            if reader.available_bytes() != 0 {
                return Outcome::Refused(kind);
            }
            copy(
                kind,
                dev,
                sector,
                writer.available_bytes(),
                scratch,
                |buf, at| {
                    dev.read_at(at, buf).map_err(|_| ())?;
                    writer.write_all(buf).map_err(|_| ())
                },
            )
        }
        Kind::Out => {
            // The status is the only writable byte.
            if writer.available_bytes() != 0 {
                return Outcome::Refused(kind);
            }
            copy(
                kind,
                dev,
                sector,
                reader.available_bytes(),
                scratch,
                |buf, at| {
                    reader.read_exact(buf).map_err(|_| ())?;
                    dev.write_at(at, buf, false).map_err(|_| ())
                },
            )
        }
        Kind::Flush => match dev.flush() {
            Ok(()) => Outcome::Done(kind),
            Err(_) => Outcome::DeviceError(kind),
        },
        Kind::GetId => {
            let serial = config.serial_bytes();
            let n = serial.len().min(writer.available_bytes());
            match writer.write_all(&serial[..n]) {
                Ok(()) => Outcome::Done(kind),
                Err(_) => Outcome::Refused(kind),
            }
        }
        Kind::Discard | Kind::WriteZeroes => ranges(kind, reader, writer, dev),
        Kind::Unknown(_) => Outcome::Unsupported,
    }
}

/// A read or write of `len` bytes from sector `sector`, in pieces through `scratch`: each
/// piece is `step(piece, byte offset)`. Refused, before the device is touched, unless `len`
/// is a whole number of sectors inside the device.
fn copy(
    kind: Kind,
    dev: &dyn BlockDevice,
    sector: u64,
    len: usize,
    scratch: &mut Vec<u8>,
    mut step: impl FnMut(&mut [u8], u64) -> Result<(), ()>,
) -> Outcome {
    let Some(start) = sector.checked_mul(SECTOR) else {
        return Outcome::Refused(kind);
    };
    let inside = start
        .checked_add(len as u64)
        .is_some_and(|end| end <= dev.size());
    if len == 0 || !(len as u64).is_multiple_of(SECTOR) || !inside {
        return Outcome::Refused(kind);
    }
    scratch.resize(SCRATCH_BYTES.min(len), 0);
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(scratch.len());
        if step(&mut scratch[..n], start + done as u64).is_err() {
            return Outcome::DeviceError(kind);
        }
        done += n;
    }
    Outcome::Done(kind)
}

/// A discard or a zero-write: its segments (the rest of the readable part, whole ones), each
/// inside the device, at most [`MAX_DISCARD_SEGMENTS`] of at most [`MAX_DISCARD_SECTORS`];
/// a discard takes no flags, a zero-write only `UNMAP`.
fn ranges<B: vm_memory::bitmap::BitmapSlice>(
    kind: Kind,
    reader: &mut Reader<'_, B>,
    writer: &mut Writer<'_, B>,
    dev: &dyn BlockDevice,
) -> Outcome {
    let bytes = reader.available_bytes();
    let count = bytes / SEGMENT_BYTES;
    if writer.available_bytes() != 0
        || bytes == 0
        || !bytes.is_multiple_of(SEGMENT_BYTES)
        || count > MAX_DISCARD_SEGMENTS as usize
    {
        return Outcome::Refused(kind);
    }
    let mut segments = Vec::with_capacity(count);
    for _ in 0..count {
        let mut s = [0u8; SEGMENT_BYTES];
        if reader.read_exact(&mut s).is_err() {
            return Outcome::Refused(kind);
        }
        let mut fields = ByteReader::new(&s);
        let (Ok(sector), Ok(sectors), Ok(flags)) =
            (fields.u64_le(), fields.u32_le(), fields.u32_le())
        else {
            return Outcome::Refused(kind);
        };
        let unmap = flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0;
        let unknown = flags & !VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0;
        if unknown || (kind == Kind::Discard && flags != 0) {
            return Outcome::Unsupported;
        }
        let range = sector
            .checked_mul(SECTOR)
            .and_then(|start| Some((start, start.checked_add(u64::from(sectors) * SECTOR)?)));
        match range {
            Some((start, end))
                if sectors > 0 && sectors <= MAX_DISCARD_SECTORS && end <= dev.size() =>
            {
                segments.push((start, end - start, unmap))
            }
            _ => return Outcome::Refused(kind),
        }
    }
    // Checked whole before any is applied: a bad segment changes nothing.
    for (start, len, unmap) in segments {
        let r = match kind {
            Kind::Discard => dev.discard(start, len),
            _ => dev.write_zeroes(start, len, unmap),
        };
        if r.is_err() {
            return Outcome::DeviceError(kind);
        }
    }
    Outcome::Done(kind)
}
