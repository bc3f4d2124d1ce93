//! NBD, the network block device protocol: [`proto`] (messages, for server and client),
//! [`server`], which serves any [`ztier_blockdev::BlockDevice`], [`client`], which makes a
//! remote export one, [`transport`] (the sockets both run over, and their bytes in the clear
//! or TLS) and [`tls`] (what TLS is offered, and the certificates). It knows nothing of zram.
#![forbid(unsafe_code)]

mod buffers;
pub mod client;
pub mod der;
pub mod proto;
pub mod server;
pub mod tls;
pub mod transport;

pub use client::{
    BadUri, Client, ClientConfig, ClientTlsError, LinkState, LinkStatus, Uri, UriTls,
};
pub use server::{
    Export, ExportCounts, ExportStats, ExportTable, Exports, Listener, Peer, Server, ServerConfig,
    SingleExport, Stream,
};
pub use tls::{BadTlsMode, ServerTls, TlsError, TlsMode};
