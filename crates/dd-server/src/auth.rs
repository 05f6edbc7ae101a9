//! Credentials: the host administrator's token and, per VM, a **registration**: a data-plane token, a
//! VM-scope admin token (always distinct from each other and from every other token) and a generation.
//!
//! A session (a data-plane connection after HELLO, or one admin request in VM scope) holds the
//! [`Registration`] it authenticated against, never just a VM id. Removing the VM or replacing its
//! tokens **revokes** that registration: every later operation of a session that holds it fails, and
//! connections waiting on [`Registration::revoked`] are closed at once. A VM registered again under
//! the same id gets a new registration (a new generation), so nothing of the old one reaches it.
//!
//! Invariants:
//! * every operation of a session runs inside [`Registration::enter`]; [`Registration::revoke`] waits
//!   for the operations in progress and makes every later `enter` fail, so after `revoke` returns no
//!   operation of the old registration runs (none can act on a VM registered again later);
//! * every comparison of a presented token with a stored one is constant-time in the token's content
//!   (`subtle`), and a lookup compares against every candidate rather than stopping at the first match,
//!   so timing reveals neither which VM a token belongs to nor how much of it matched; an unknown VM
//!   and a wrong token fail the same way. All token checks go through [`Stored::matches`];
//! * no token is kept in clear: the registry keeps, and `persist` writes, the SHA-256 of a per-daemon
//!   salt and the token ([`TokenHash`]). Tokens are random 256-bit values or operator-chosen strings of
//!   at least 16 printable characters; the salt keeps a stolen registrations file from being matched
//!   against precomputed tables. A presented token is hashed once and compared with every candidate.
//!
//! Locks: the registry's map lock and its list of retired token hashes (kept only so that a refused
//! request can be told which VM its token was: [`Registry::kind_of`]) are leaves, never held together
//! nor across an engine call or a revocation; a registration's gate (`enter`/`revoke`) is taken before any engine lock.

use crossbeam_utils::CachePadded;
use dd_engine::{stripe, VmId};
use parking_lot::RwLock;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

/// The salted SHA-256 of a token: all the daemon keeps of it, in memory and on disk.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenHash(pub [u8; 32]);

impl TokenHash {
    /// Lower-case hex (the registrations file's form).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    pub fn from_hex(s: &str) -> Option<TokenHash> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(TokenHash(out))
    }
}

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenHash(..)")
    }
}

/// A stored token (its hash).
#[derive(Clone)]
struct Stored(TokenHash);

impl Stored {
    /// Constant-time equality with the hash of a presented token.
    fn matches(&self, presented: &TokenHash) -> bool {
        bool::from(self.0 .0[..].ct_eq(&presented.0[..]))
    }
}

/// One registration of a VM: its tokens, a generation unique within this daemon, and the gate every
/// operation of its sessions passes.
pub struct Registration {
    pub vm: VmId,
    /// Distinguishes this registration from every earlier and later one of the same VM id.
    pub generation: u64,
    data_token: Stored,
    admin_token: Stored,
    /// `true` until the registration is revoked.
    live: AtomicBool,
    /// Operations in progress, per stripe (`dd_engine::stripe`): every session of the VM enters the
    /// gate once per burst of requests, and a single counter (or a read lock) would be one cache line
    /// written by all of them, on every core (issue 28, item 3). Revocation adds them up.
    inside: Box<[CachePadded<AtomicU64>]>,
    revoked_tx: watch::Sender<bool>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("vm", &self.vm).field("generation", &self.generation).finish()
    }
}

/// Proof that an operation runs while its registration is live (see [`Registration::enter`]); the
/// operation leaves the gate when it is dropped.
#[derive(Debug)]
#[must_use = "the operation is inside the gate only while this is held"]
pub struct Entered<'a> {
    counter: &'a AtomicU64,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Release);
    }
}

impl Registration {
    /// The hashes of the data-plane and admin tokens (for the registrations file).
    pub fn token_hashes(&self) -> (TokenHash, TokenHash) {
        (self.data_token.0, self.admin_token.0)
    }

    /// Enters an operation: `None` once the registration is revoked. Keep the guard for the operation's
    /// length; revocation waits for it.
    ///
    /// The protocol is Dekker's: an operation counts itself in, then reads `live`; `revoke` clears
    /// `live`, then reads the counts. Both sides' accesses are sequentially consistent, so either the
    /// operation sees the registration revoked (and leaves), or `revoke` sees it counted (and waits).
    pub fn enter(&self) -> Option<Entered<'_>> {
        let counter = &*self.inside[stripe::index()];
        counter.fetch_add(1, Ordering::SeqCst);
        let entered = Entered { counter };
        self.live.load(Ordering::SeqCst).then_some(entered)
    }

    /// Whether the registration is still live (for a quick check outside an operation).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    /// A receiver that changes (to `true`) when the registration is revoked.
    pub fn revoked(&self) -> watch::Receiver<bool> {
        self.revoked_tx.subscribe()
    }

    /// Revokes the registration: waits for its operations in progress, then fails every later one and
    /// wakes every waiting connection. Idempotent.
    pub fn revoke(&self) {
        self.live.store(false, Ordering::SeqCst);
        // Operations are short (one burst of requests, one admin call): spin briefly, then yield, then
        // sleep, re-reading every stripe until none is inside.
        let mut rounds = 0u32;
        while self.inside.iter().any(|c| c.load(Ordering::SeqCst) != 0) {
            rounds += 1;
            match rounds {
                0..64 => std::hint::spin_loop(),
                64..256 => std::thread::yield_now(),
                _ => std::thread::sleep(std::time::Duration::from_micros(100)),
            }
        }
        let _ = self.revoked_tx.send(true);
    }
}

/// The token registry.
#[derive(Debug)]
pub struct Registry {
    salt: [u8; 32],
    host_token: Stored,
    vms: RwLock<BTreeMap<VmId, Arc<Registration>>>,
    next_generation: AtomicU64,
    /// Hashes of tokens of removed VMs and of replaced tokens, newest last, at most [`RETIRED_KEPT`]:
    /// only so that a 401 can say "this token was VM n's" ([`Registry::kind_of`]).
    retired: parking_lot::Mutex<VecDeque<(TokenHash, VmId)>>,
}

/// Retired token hashes kept for error messages (64 bytes each with the id).
pub const RETIRED_KEPT: usize = 1024;

/// What a presented token is, for the message of a refused request: which kind an endpoint got (never
/// the token itself). Only computed once a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// No `Authorization: Bearer` header, or a malformed one.
    Missing,
    Host,
    VmAdmin(VmId),
    VmData(VmId),
    /// A token of a VM that was removed, or one replaced since.
    Retired(VmId),
    /// A token this daemon does not know.
    Unknown,
}

impl std::fmt::Display for TokenKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenKind::Missing => f.write_str("no bearer token (want `Authorization: Bearer TOKEN`)"),
            TokenKind::Host => f.write_str("the host admin token"),
            TokenKind::VmAdmin(v) => write!(f, "the admin token of VM {}", v.0),
            TokenKind::VmData(v) => {
                write!(f, "the data-plane token of VM {} (for the data plane, not the admin API)", v.0)
            }
            TokenKind::Retired(v) => {
                write!(f, "a token VM {} no longer has (the VM was removed or its tokens replaced)", v.0)
            }
            TokenKind::Unknown => f.write_str("a token this daemon does not know"),
        }
    }
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stored(..)")
    }
}

/// A fresh random token: 32 bytes from the OS generator, hex-encoded.
pub fn generate_token() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Why a token is not acceptable (the admin API names the field).
pub fn token_problem(t: &str) -> Option<&'static str> {
    // Printable ASCII only: a character is a byte (the data plane's limit is in bytes) and no
    // whitespace can be lost or added by an HTTP header. Checked first, so that the length below
    // counts characters (issue 12: 200 two-byte characters were refused as "more than 256").
    if !t.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Some("must be printable ASCII without spaces (0x21-0x7e)");
    }
    if t.len() < crate::config::MIN_TOKEN_LEN || t.len() > dd_proto::MAX_TOKEN_BYTES {
        return Some("must be 16 to 256 characters");
    }
    None
}

impl Registry {
    /// A registry whose token hashes are salted with `salt` (the registrations file's, see `persist`).
    pub fn new(host_token: &str, salt: [u8; 32]) -> Registry {
        let mut r = Registry {
            salt,
            host_token: Stored(TokenHash([0; 32])),
            vms: RwLock::new(BTreeMap::new()),
            next_generation: AtomicU64::new(1),
            retired: parking_lot::Mutex::new(VecDeque::new()),
        };
        r.host_token = Stored(r.hash(host_token.as_bytes()));
        r
    }

    /// The salted hash of a token.
    pub fn hash(&self, token: &[u8]) -> TokenHash {
        let mut h = Sha256::new();
        h.update(self.salt);
        h.update(token);
        TokenHash(h.finalize().into())
    }

    pub fn is_host(&self, token: &[u8]) -> bool {
        self.host_token.matches(&self.hash(token))
    }

    /// The live registration of `vm` if `token` is its data-plane token. An unknown VM is compared
    /// against a dummy hash so it costs the same.
    pub fn authenticate_data(&self, vm: VmId, token: &[u8]) -> Option<Arc<Registration>> {
        let h = self.hash(token);
        let vms = self.vms.read();
        match vms.get(&vm) {
            Some(r) => r.data_token.matches(&h).then(|| r.clone()),
            None => {
                let _ = Stored(TokenHash([0; 32])).matches(&h);
                None
            }
        }
    }

    /// The registration whose VM-scope admin token this is.
    pub fn authenticate_admin(&self, token: &[u8]) -> Option<Arc<Registration>> {
        let h = self.hash(token);
        let vms = self.vms.read();
        let mut found = None;
        for r in vms.values() {
            if r.admin_token.matches(&h) {
                found = Some(r.clone());
            }
        }
        found
    }

    /// What `token` is (see [`TokenKind`]); `None` is [`TokenKind::Missing`].
    pub fn kind_of(&self, token: Option<&[u8]>) -> TokenKind {
        let Some(token) = token else { return TokenKind::Missing };
        let h = self.hash(token);
        if self.host_token.matches(&h) {
            return TokenKind::Host;
        }
        for r in self.vms.read().values() {
            if r.admin_token.matches(&h) {
                return TokenKind::VmAdmin(r.vm);
            }
            if r.data_token.matches(&h) {
                return TokenKind::VmData(r.vm);
            }
        }
        let retired = self.retired.lock();
        match retired.iter().rev().find(|(t, _)| Stored(*t).matches(&h)) {
            Some((_, vm)) => TokenKind::Retired(*vm),
            None => TokenKind::Unknown,
        }
    }

    fn retire(&self, old: &Registration) {
        let mut retired = self.retired.lock();
        retired.push_back((old.data_token.0, old.vm));
        retired.push_back((old.admin_token.0, old.vm));
        while retired.len() > RETIRED_KEPT {
            retired.pop_front();
        }
    }

    /// Whether a token is already in use anywhere (tokens must be unique). `except` skips one VM's
    /// registration (its tokens are being replaced).
    pub fn token_in_use(&self, token: &str, except: Option<VmId>) -> bool {
        let h = self.hash(token.as_bytes());
        let mut used = self.host_token.matches(&h);
        for (id, r) in self.vms.read().iter() {
            if Some(*id) != except {
                used |= r.data_token.matches(&h) | r.admin_token.matches(&h);
            }
        }
        used
    }

    /// Registers `vm` (a new generation). Replaces (and revokes) an earlier registration of the same id.
    pub fn insert(&self, vm: VmId, data_token: &str, admin_token: &str) -> Arc<Registration> {
        let (d, a) = (self.hash(data_token.as_bytes()), self.hash(admin_token.as_bytes()));
        self.insert_hashed(vm, d, a)
    }

    /// [`Registry::insert`] with the tokens' hashes (a registration restored from the file).
    pub fn insert_hashed(
        &self,
        vm: VmId,
        data_token: TokenHash,
        admin_token: TokenHash,
    ) -> Arc<Registration> {
        let reg = Arc::new(Registration {
            vm,
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            data_token: Stored(data_token),
            admin_token: Stored(admin_token),
            live: AtomicBool::new(true),
            inside: (0..stripe::STRIPES).map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
            revoked_tx: watch::channel(false).0,
        });
        let old = self.vms.write().insert(vm, reg.clone());
        if let Some(old) = old {
            self.retire(&old);
            old.revoke();
        }
        reg
    }

    /// Replaces a registered VM's tokens: a new registration; the old one is revoked (its sessions are
    /// cut off) before this returns. `None` for an unknown VM.
    pub fn replace_tokens(&self, vm: VmId, data_token: &str, admin_token: &str) -> Option<Arc<Registration>> {
        if !self.contains(vm) {
            return None;
        }
        Some(self.insert(vm, data_token, admin_token))
    }

    /// Unregisters `vm` and revokes its registration (waiting for its operations in progress).
    pub fn remove(&self, vm: VmId) -> bool {
        let old = self.vms.write().remove(&vm);
        match old {
            Some(r) => {
                self.retire(&r);
                r.revoke();
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, vm: VmId) -> bool {
        self.vms.read().contains_key(&vm)
    }

    /// (registrations, retired token hashes): the registry's tables (the second at most
    /// [`RETIRED_KEPT`]).
    pub fn table_sizes(&self) -> (usize, usize) {
        (self.vms.read().len(), self.retired.lock().len())
    }

    /// The live registration of `vm`.
    pub fn get(&self, vm: VmId) -> Option<Arc<Registration>> {
        self.vms.read().get(&vm).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_authenticate_only_their_vm_and_scope() {
        let r = Registry::new("host-token-0123456789", [7; 32]);
        r.insert(VmId(1), "data-one-0123456789", "admin-one-0123456789");
        r.insert(VmId(2), "data-two-0123456789", "admin-two-0123456789");
        assert!(r.authenticate_data(VmId(1), b"data-one-0123456789").is_some());
        assert!(r.authenticate_data(VmId(2), b"data-one-0123456789").is_none());
        assert!(r.authenticate_data(VmId(3), b"data-one-0123456789").is_none());
        assert!(r.authenticate_data(VmId(1), b"admin-one-0123456789").is_none(), "admin is not data");
        assert_eq!(r.authenticate_admin(b"admin-two-0123456789").map(|x| x.vm), Some(VmId(2)));
        assert!(r.authenticate_admin(b"data-two-0123456789").is_none());
        assert!(r.authenticate_admin(b"host-token-0123456789").is_none());
        assert!(r.is_host(b"host-token-0123456789"));
        assert!(!r.is_host(b"host-token-012345678"));
        assert!(r.token_in_use("data-two-0123456789", None));
        assert!(!r.token_in_use("data-two-0123456789", Some(VmId(2))));
        assert!(r.remove(VmId(2)));
        assert!(r.authenticate_data(VmId(2), b"data-two-0123456789").is_none());
    }

    #[test]
    fn removal_and_replacement_revoke_the_old_registration() {
        let r = Registry::new("host-token-0123456789", [7; 32]);
        let a = r.insert(VmId(1), "data-one-0123456789", "admin-one-0123456789");
        assert!(a.enter().is_some());
        let mut rx = a.revoked();
        let b = r.replace_tokens(VmId(1), "data-new-0123456789", "admin-new-0123456789").unwrap();
        assert!(a.enter().is_none() && !a.is_live());
        assert!(rx.has_changed().unwrap() && *rx.borrow_and_update());
        assert!(b.generation > a.generation && b.enter().is_some());
        assert!(r.authenticate_data(VmId(1), b"data-one-0123456789").is_none());
        assert!(r.remove(VmId(1)));
        assert!(b.enter().is_none());
        let c = r.insert(VmId(1), "data-one-0123456789", "admin-one-0123456789");
        assert!(c.generation > b.generation && a.enter().is_none());
    }

    /// `revoke` returns only once every operation entered on any thread has left (the gate is striped
    /// per thread, so the waiting must add the stripes up), and no operation enters after it.
    #[test]
    fn revoke_waits_for_operations_in_progress_on_other_threads() {
        let r = Registry::new("host-token-0123456789", [7; 32]);
        let a = r.insert(VmId(1), "data-one-0123456789", "admin-one-0123456789");
        let left = AtomicBool::new(false);
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            for _ in 0..3 {
                let (a, left, entered_tx) = (&a, &left, entered_tx.clone());
                s.spawn(move || {
                    let g = a.enter().expect("live");
                    entered_tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    left.store(true, Ordering::SeqCst);
                    drop(g);
                });
            }
            for _ in 0..3 {
                entered_rx.recv().unwrap();
            }
            r.remove(VmId(1));
            assert!(left.load(Ordering::SeqCst), "revoke returned while operations were inside");
            assert!(a.enter().is_none() && !a.is_live());
        });
        assert!(a.inside.iter().all(|c| c.load(Ordering::SeqCst) == 0), "a refused enter stayed counted");
    }

    #[test]
    fn tokens_are_kept_as_salted_hashes() {
        let a = Registry::new("host-token-0123456789", [1; 32]);
        let b = Registry::new("host-token-0123456789", [2; 32]);
        let t = b"data-one-0123456789";
        assert_ne!(a.hash(t), b.hash(t), "the salt changes the hash");
        assert_eq!(a.hash(t), a.hash(t));
        let reg = a.insert(VmId(1), "data-one-0123456789", "admin-one-0123456789");
        let (d, adm) = reg.token_hashes();
        assert!(d == a.hash(t) && adm != d);
        assert_eq!(TokenHash::from_hex(&d.to_hex()), Some(d));
        assert_eq!(TokenHash::from_hex("zz"), None);
        // A registration restored from its hashes authenticates the same tokens.
        let c = Registry::new("host-token-0123456789", [1; 32]);
        c.insert_hashed(VmId(1), d, adm);
        assert!(c.authenticate_data(VmId(1), t).is_some());
        assert_eq!(c.authenticate_admin(b"admin-one-0123456789").map(|r| r.vm), Some(VmId(1)));
    }

    #[test]
    fn token_rules() {
        assert_eq!(token_problem("0123456789abcdef"), None);
        assert!(token_problem("short").is_some());
        assert!(token_problem(&"x".repeat(257)).is_some());
        assert!(token_problem("0123456789 abcdef").is_some());
        assert!(token_problem("0123456789abcdefé").is_some(), "multibyte characters");
    }

    #[test]
    fn generated_tokens_are_long_and_distinct() {
        let a = generate_token();
        assert_eq!(a.len(), 64);
        assert_ne!(a, generate_token());
        assert_eq!(token_problem(&a), None);
    }
}
