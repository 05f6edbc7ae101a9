//! The seam between co-operative de-duplication's decisions (`peers`, `pins`) and the network: a
//! request/response exchange with a named peer. The daemon implements it over its pooled, authenticated
//! TCP connections (`dd-server`'s `coop`); the tests implement it with a fake network that loses,
//! delays, reorders and duplicates messages.
//!
//! Contract: a request either returns the peer's epoch (as learnt at the connection's handshake) and
//! the response payload, or fails with a [`TransportError`]; it is bounded in time (a timeout is an
//! error, never a hang). When an epoch is given and the peer runs in another one, nothing is sent and
//! the request fails with [`TransportError::EpochChanged`]. A failed request may still have taken
//! effect on the peer (a lost response): the decisions tolerate it (pins expire, unpins are idempotent).

use crate::wire::PeerRequest;

/// Why a request to a peer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("peer timed out")]
    Timeout,
    #[error("peer refused the connection")]
    Refused,
    #[error("peer closed the connection")]
    Closed,
    #[error("peer is backing off after a failure")]
    Down,
    #[error("peer restarted (epoch changed)")]
    EpochChanged,
    #[error("peer answered status {0}")]
    Status(u16),
    /// Anything else: an address that does not resolve, a peer that did not prove its name, a bad frame.
    #[error("peer failed: {0}")]
    Other(String),
}

/// A request/response exchange with the peers, named by their index in the daemon's peer list.
pub trait PeerTransport {
    /// Sends `req` to `peer` and returns its epoch and the response payload. With `epoch`, fails with
    /// [`TransportError::EpochChanged`] (sending nothing) unless the peer still runs in that epoch.
    fn request(
        &self,
        peer: u32,
        req: &PeerRequest<'_>,
        epoch: Option<u64>,
    ) -> Result<(u64, Vec<u8>), TransportError>;
}
