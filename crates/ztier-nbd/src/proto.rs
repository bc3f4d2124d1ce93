//! The NBD protocol's messages (`doc/proto.md` of the NBD project): constants, and the
//! encoding and decoding of the handshake, options, requests and replies, for both ends: the
//! server (`server`) and the client zram writes back through (`client`).
//!
//! Everything is big-endian ("network byte order"). Decoders take a byte slice that holds
//! exactly the message (the caller reads the fixed-size header, then the length it gives,
//! bounded), so a malformed message is an error, never a panic or an unbounded read.

use ztier_base::bytes::{ByteReader, PastEnd};

/// "NBDMAGIC": the server's first eight bytes.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": after NBDMAGIC in newstyle, and before each option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Before every option reply.
pub const REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_PLATFORM: u32 = (1 << 31) + 4;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Info types (in `NBD_REP_INFO` replies and `OPT_INFO`/`OPT_GO` requests).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// `base:allocation` extent flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context served, and its id.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Error values on the wire (the spec's subset of errno).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Maps a host errno to the wire's set (anything else is EIO, as the spec asks).
pub fn wire_errno(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EROFS => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::EOPNOTSUPP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// A name for an option code, for logs.
pub fn option_name(opt: u32) -> &'static str {
    match opt {
        OPT_EXPORT_NAME => "EXPORT_NAME",
        OPT_ABORT => "ABORT",
        OPT_LIST => "LIST",
        OPT_STARTTLS => "STARTTLS",
        OPT_INFO => "INFO",
        OPT_GO => "GO",
        OPT_STRUCTURED_REPLY => "STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "SET_META_CONTEXT",
        _ => "unknown",
    }
}

/// A message that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {what}: {why}")]
pub struct Malformed {
    pub what: &'static str,
    pub why: String,
}

fn malformed(what: &'static str, why: impl Into<String>) -> Malformed {
    Malformed {
        what,
        why: why.into(),
    }
}

/// Reads NBD's big-endian fields from a byte slice, refusing to run past its end: the
/// shared reader ([`ByteReader`]) with the name of the message it reads, for the refusal.
pub struct Cursor<'a> {
    bytes: ByteReader<'a>,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8], what: &'static str) -> Cursor<'a> {
        Cursor {
            bytes: ByteReader::new(bytes),
            what,
        }
    }

    /// The read past the end, in this message's words.
    fn past_end(&self, e: PastEnd) -> Malformed {
        malformed(
            self.what,
            format!("needs {} more bytes, has {}", e.wanted, e.left),
        )
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        self.bytes.take(n).map_err(|e| self.past_end(e))
    }

    pub fn u16(&mut self) -> Result<u16, Malformed> {
        self.bytes.u16_be().map_err(|e| self.past_end(e))
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        self.bytes.u32_be().map_err(|e| self.past_end(e))
    }

    pub fn u64(&mut self) -> Result<u64, Malformed> {
        self.bytes.u64_be().map_err(|e| self.past_end(e))
    }

    /// A u32 length, then that many bytes of UTF-8 (at most `max`).
    pub fn string(&mut self, max: usize) -> Result<String, Malformed> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(malformed(self.what, format!("a string of {len} bytes")));
        }
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| malformed(self.what, "a string is not UTF-8"))
    }

    /// Refuses bytes left over.
    pub fn finish(self) -> Result<(), Malformed> {
        if self.bytes.left() == 0 {
            Ok(())
        } else {
            Err(malformed(
                self.what,
                format!("{} bytes past its end", self.bytes.left()),
            ))
        }
    }
}

/// Longest export name or metadata query accepted (the spec's limit is 4096 bytes).
pub const MAX_STRING: usize = 4096;

/// The data of `OPT_INFO` / `OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub export: String,
    pub infos: Vec<u16>,
}

impl InfoRequest {
    pub fn decode(data: &[u8]) -> Result<InfoRequest, Malformed> {
        let mut c = Cursor::new(data, "NBD_OPT_INFO/GO");
        let export = c.string(MAX_STRING)?;
        let n = c.u16()?;
        let infos = (0..n).map(|_| c.u16()).collect::<Result<_, _>>()?;
        c.finish()?;
        Ok(InfoRequest { export, infos })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        put_string(&mut v, &self.export);
        v.extend((self.infos.len() as u16).to_be_bytes());
        for i in &self.infos {
            v.extend(i.to_be_bytes());
        }
        v
    }
}

/// The data of `OPT_LIST_META_CONTEXT` / `OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    pub fn decode(data: &[u8]) -> Result<MetaContextRequest, Malformed> {
        let mut c = Cursor::new(data, "NBD_OPT_*_META_CONTEXT");
        let export = c.string(MAX_STRING)?;
        let n = c.u32()?;
        let mut queries = Vec::new();
        for _ in 0..n {
            queries.push(c.string(MAX_STRING)?);
        }
        c.finish()?;
        Ok(MetaContextRequest { export, queries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        put_string(&mut v, &self.export);
        v.extend((self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            put_string(&mut v, q);
        }
        v
    }
}

/// One export in `NBD_OPT_LIST`'s answer (an `NBD_REP_SERVER` reply's data):
///
/// ```text
/// 0        4               4+n
/// +--------+----------------+-----------------------------+
/// | n (BE) | name, n bytes  | description, to the end     |
/// +--------+----------------+-----------------------------+
/// ```
///
/// Both UTF-8, both at most [`MAX_STRING`] bytes (the spec's limit for names and
/// descriptions); the description is what nbd-server, nbdkit and libnbd put after the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub name: String,
    pub description: String,
}

impl ListEntry {
    pub fn decode(data: &[u8]) -> Result<ListEntry, Malformed> {
        let mut c = Cursor::new(data, "NBD_REP_SERVER");
        let name = c.string(MAX_STRING)?;
        let rest = c.take(data.len() - 4 - name.len())?;
        if rest.len() > MAX_STRING {
            return Err(malformed(
                "NBD_REP_SERVER",
                format!("a description of {} bytes", rest.len()),
            ));
        }
        let description = String::from_utf8(rest.to_vec())
            .map_err(|_| malformed("NBD_REP_SERVER", "a description that is not UTF-8"))?;
        c.finish()?;
        Ok(ListEntry { name, description })
    }

    /// The reply's data; `None` for a name longer than the spec allows (no client could
    /// ask for it). A description past the limit is cut at a character's edge.
    pub fn encode(&self) -> Option<Vec<u8>> {
        if self.name.len() > MAX_STRING {
            return None;
        }
        let mut cut = self.description.len().min(MAX_STRING);
        while !self.description.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut v = Vec::with_capacity(4 + self.name.len() + cut);
        put_string(&mut v, &self.name);
        v.extend(&self.description.as_bytes()[..cut]);
        Some(v)
    }
}

fn put_string(v: &mut Vec<u8>, s: &str) {
    v.extend((s.len() as u32).to_be_bytes());
    v.extend(s.as_bytes());
}

/// The client's flags, its answer to the greeting: `NBD_FLAG_C_FIXED_NEWSTYLE`, and
/// `NBD_FLAG_C_NO_ZEROES` if it takes the short export reply. A client without fixed newstyle,
/// or with a flag not known here, is refused (the spec has the server close the connection).
pub fn decode_client_flags(bytes: &[u8; 4]) -> Result<u32, Malformed> {
    let flags = Cursor::new(bytes, "client flags").u32()?;
    if flags & FLAG_C_FIXED_NEWSTYLE == 0
        || flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0
    {
        return Err(malformed(
            "client flags",
            format!("{flags:#x}: fixed newstyle, and no flag but no-zeroes, is what is served"),
        ));
    }
    Ok(flags)
}

/// An option's header, after its IHAVEOPT magic: (option, data length).
pub fn decode_option_header(bytes: &[u8; 16]) -> Result<(u32, u32), Malformed> {
    let mut c = Cursor::new(bytes, "option header");
    let magic = c.u64()?;
    if magic != IHAVEOPT {
        return Err(malformed("option header", format!("magic {magic:#x}")));
    }
    Ok((c.u32()?, c.u32()?))
}

/// An option reply: magic, option, type, length, data.
pub fn encode_option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend(REP_MAGIC.to_be_bytes());
    v.extend(option.to_be_bytes());
    v.extend(reply.to_be_bytes());
    v.extend((data.len() as u32).to_be_bytes());
    v.extend(data);
    v
}

/// `NBD_INFO_EXPORT`: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut v = INFO_EXPORT.to_be_bytes().to_vec();
    v.extend(size.to_be_bytes());
    v.extend(flags.to_be_bytes());
    v
}

/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred, maximum payload.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut v = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    v.extend(min.to_be_bytes());
    v.extend(preferred.to_be_bytes());
    v.extend(max.to_be_bytes());
    v
}

/// A transmission request's 28-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub const REQUEST_LEN: usize = 28;

impl Request {
    pub fn decode(bytes: &[u8; REQUEST_LEN]) -> Result<Request, Malformed> {
        let mut c = Cursor::new(bytes, "request");
        let magic = c.u32()?;
        if magic != REQUEST_MAGIC {
            return Err(malformed("request", format!("magic {magic:#x}")));
        }
        Ok(Request {
            flags: c.u16()?,
            kind: c.u16()?,
            cookie: c.u64()?,
            offset: c.u64()?,
            length: c.u32()?,
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply's header, as a client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: u64,
}

pub const SIMPLE_REPLY_LEN: usize = 16;

impl SimpleReply {
    pub fn decode(bytes: &[u8; SIMPLE_REPLY_LEN]) -> Result<SimpleReply, Malformed> {
        let mut c = Cursor::new(bytes, "simple reply");
        let magic = c.u32()?;
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(malformed("simple reply", format!("magic {magic:#x}")));
        }
        Ok(SimpleReply {
            error: c.u32()?,
            cookie: c.u64()?,
        })
    }
}

/// An option reply's 20-byte header, as a client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

pub const OPTION_REPLY_HEADER_LEN: usize = 20;

impl OptionReplyHeader {
    pub fn decode(bytes: &[u8; OPTION_REPLY_HEADER_LEN]) -> Result<OptionReplyHeader, Malformed> {
        let mut c = Cursor::new(bytes, "option reply");
        let magic = c.u64()?;
        if magic != REP_MAGIC {
            return Err(malformed("option reply", format!("magic {magic:#x}")));
        }
        Ok(OptionReplyHeader {
            option: c.u32()?,
            reply: c.u32()?,
            len: c.u32()?,
        })
    }
}

/// The server's 18-byte newstyle greeting: its handshake flags.
pub fn decode_greeting(bytes: &[u8; 18]) -> Result<u16, Malformed> {
    let mut c = Cursor::new(bytes, "greeting");
    let (magic, opt_magic) = (c.u64()?, c.u64()?);
    if magic != NBDMAGIC || opt_magic != IHAVEOPT {
        return Err(malformed(
            "greeting",
            "not a newstyle NBD server (oldstyle servers are not supported)",
        ));
    }
    c.u16()
}

/// `NBD_OPT_EXPORT_NAME`'s reply to a client: the export's size and transmission flags
/// (the zeroes after them, if any, are the caller's to read).
pub fn decode_export_name_reply(bytes: &[u8; 10]) -> Result<(u64, u16), Malformed> {
    let mut c = Cursor::new(bytes, "NBD_OPT_EXPORT_NAME's reply");
    Ok((c.u64()?, c.u16()?))
}

/// A simple reply's 16-byte header (data follows for a successful read).
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk's 20-byte header (its payload follows).
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// An error chunk's payload: the error and a message (cut to fit a u16 length).
pub fn error_chunk_payload(error: u32, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut v = error.to_be_bytes().to_vec();
    v.extend((msg.len() as u16).to_be_bytes());
    v.extend(msg);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_magic_is_refused() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 0xdead_beef,
            offset: 1 << 40,
            length: 4096,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert!(Request::decode(&bad).is_err());
    }

    #[test]
    fn client_flags_need_fixed_newstyle_and_nothing_unknown() {
        let flags = |f: u32| decode_client_flags(&f.to_be_bytes());
        assert_eq!(flags(FLAG_C_FIXED_NEWSTYLE), Ok(FLAG_C_FIXED_NEWSTYLE));
        let both = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
        assert_eq!(flags(both), Ok(both));
        for bad in [0, FLAG_C_NO_ZEROES, both | 1 << 2, 1 << 31] {
            let e = flags(bad).unwrap_err();
            assert_eq!(e.what, "client flags");
            assert!(e.why.starts_with(&format!("{bad:#x}")), "{e}");
        }
    }

    #[test]
    fn option_data_round_trips_and_truncation_is_refused() {
        let info = InfoRequest {
            export: "disk".into(),
            infos: vec![INFO_BLOCK_SIZE, INFO_NAME],
        };
        let bytes = info.encode();
        assert_eq!(InfoRequest::decode(&bytes), Ok(info));
        for cut in 0..bytes.len() {
            assert!(InfoRequest::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(InfoRequest::decode(&long).is_err());
        let meta = MetaContextRequest {
            export: String::new(),
            queries: vec![BASE_ALLOCATION.into(), "qemu:".into()],
        };
        assert_eq!(MetaContextRequest::decode(&meta.encode()), Ok(meta));
        // A name claiming 4 GiB is refused without reading further.
        assert!(InfoRequest::decode(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
    }

    #[test]
    fn list_entries_keep_to_the_specs_lengths() {
        let e = ListEntry {
            name: "vm1".into(),
            description: "disk".into(),
        };
        let bytes = e.encode().unwrap();
        assert_eq!(bytes, b"\0\0\0\x03vm1disk");
        assert_eq!(ListEntry::decode(&bytes), Ok(e));
        let long_name = ListEntry {
            name: "n".repeat(MAX_STRING + 1),
            description: String::new(),
        };
        assert!(long_name.encode().is_none());
        // A description past the limit is cut at a character's edge, never inside one.
        let long = ListEntry {
            name: "x".into(),
            description: "é".repeat(MAX_STRING),
        };
        let said = ListEntry::decode(&long.encode().unwrap())
            .unwrap()
            .description;
        assert!(said.len() <= MAX_STRING && said.len() >= MAX_STRING - 1);
        // A name longer than the reply, or bytes that are not UTF-8, are refused.
        assert!(ListEntry::decode(&[0, 0, 0, 5, b'a']).is_err());
        assert!(ListEntry::decode(&[0, 0, 0, 1, b'a', 0xff]).is_err());
        assert!(ListEntry::decode(&[0, 0]).is_err());
    }

    proptest::proptest! {
        /// A list entry decodes whatever a server sends without panicking, and one encoded
        /// decodes back to itself.
        #[test]
        fn list_entries_decode_any_bytes_and_round_trip(
            name in "\\PC{0,40}",
            description in "\\PC{0,40}",
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let entry = ListEntry { name, description };
            let bytes = entry.encode().expect("a short name");
            proptest::prop_assert_eq!(ListEntry::decode(&bytes), Ok(entry));
            let _ = ListEntry::decode(&junk);
        }
    }
}
