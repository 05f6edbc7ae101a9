//! VM registrations that survive restarts: the registrations file (`auth.registrations_file` in
//! `data_dir`, default `registrations.json`).
//!
//! The configuration's `[[vms]]` are the starting point of every start; every change the host
//! administrator makes at run time through the admin API (a VM registered, its weights, quota or tokens
//! changed, a VM removed) is kept here as the VM's whole current registration, and applied over the
//! configuration at the next start. A VM of the configuration removed at run time is kept as removed
//! (a tombstone), so a tenant cut off does not come back with a restart; a VM registered at run time and
//! removed again leaves no record. To return to the configuration alone, stop the daemon and delete the
//! file.
//!
//! Invariants:
//! * the file never holds a token, only its salted SHA-256 (`auth::TokenHash`; the salt is the file's
//!   own, drawn when the file is first written);
//! * it is written whole and atomically (a temporary file of mode 0600 in the same directory, synced,
//!   renamed over the old one, the directory synced): a crash at any moment leaves the old file or the
//!   new one, never a mix; a file with wider permissions is narrowed to 0600 when it is read;
//! * a change is on disk before it is answered: the admin API persists first where the change is a
//!   security one (removal, token replacement: a failed write leaves the old registration in force and
//!   says so) and otherwise rolls the change back when the write fails (`state`).
//!
//! * writes are paced (`auth.registrations_min_write_interval_ms`, default 10): storage is shared with
//!   every tenant, and an admin client changing registrations in a loop otherwise made two syncs per
//!   change, 2,000 a second.
//!
//! Locks: the [`Persisted`] value sits in a mutex of `ServerState` that serialises the admin API's
//! registration changes (taken before a registration's gate and the engine's locks, never on the data
//! path), so the file always matches the last change made.

use crate::auth::TokenHash;
use crate::ServerError;
use dd_engine::VmWeights;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Layout version of the file.
const FILE_VERSION: u32 = 1;

/// One VM's persisted registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    /// The VM is registered with these settings (whatever the configuration says of it).
    Registered {
        id: u32,
        weights: VmWeights,
        /// The VM's own pool quota (absent: the engine's default).
        #[serde(default)]
        max_pools: Option<usize>,
        /// The VM's de-duplication group ("": its own domain).
        #[serde(default)]
        dedup_group: String,
        data_token_sha256: String,
        admin_token_sha256: String,
    },
    /// A VM of the configuration, removed at run time.
    Removed { id: u32 },
}

impl Record {
    pub fn id(&self) -> u32 {
        match self {
            Record::Registered { id, .. } | Record::Removed { id } => *id,
        }
    }

    /// A registered record's token hashes (`None` for a tombstone or a corrupt hash).
    pub fn hashes(&self) -> Option<(TokenHash, TokenHash)> {
        match self {
            Record::Registered { data_token_sha256, admin_token_sha256, .. } => {
                Some((TokenHash::from_hex(data_token_sha256)?, TokenHash::from_hex(admin_token_sha256)?))
            }
            Record::Removed { .. } => None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBody {
    version: u32,
    /// Hex of the 32-byte salt of every token hash.
    salt: String,
    vms: Vec<Record>,
}

/// The registrations file and its records.
#[derive(Debug)]
pub struct Persisted {
    /// `None`: persistence is off (`auth.registrations_file = ""`).
    path: Option<PathBuf>,
    salt: [u8; 32],
    records: BTreeMap<u32, Record>,
    /// Ids of the configuration's VMs (their removal leaves a tombstone).
    configured: BTreeSet<u32>,
    /// Writes are at least this far apart (`auth.registrations_min_write_interval_ms`).
    min_write_interval: Duration,
    /// When the last write ended.
    last_write: Option<Instant>,
}

fn io_err(path: &Path, what: &str, e: impl std::fmt::Display) -> ServerError {
    ServerError::Io(format!("{what} {}: {e}", path.display()))
}

impl Persisted {
    /// Reads the file at `path` (absent: no records yet, a fresh salt). `configured` lists the
    /// configuration's VM ids.
    pub fn open(path: Option<PathBuf>, configured: BTreeSet<u32>) -> Result<Persisted, ServerError> {
        let mut p = Persisted {
            path: None,
            salt: [0; 32],
            records: BTreeMap::new(),
            configured,
            min_write_interval: Duration::ZERO,
            last_write: None,
        };
        rand::rngs::OsRng.fill_bytes(&mut p.salt);
        let Some(path) = path else { return Ok(p) };
        match std::fs::read(&path) {
            Ok(bytes) => {
                narrow_mode(&path);
                let body: FileBody =
                    serde_json::from_slice(&bytes).map_err(|e| io_err(&path, "parsing", e))?;
                if body.version != FILE_VERSION {
                    return Err(io_err(&path, "reading", format!("unknown version {}", body.version)));
                }
                let salt =
                    TokenHash::from_hex(&body.salt).ok_or_else(|| io_err(&path, "reading", "bad salt"))?;
                p.salt = salt.0;
                for r in body.vms {
                    if matches!(r, Record::Registered { .. }) && r.hashes().is_none() {
                        return Err(io_err(&path, "reading", format!("bad token hash of VM {}", r.id())));
                    }
                    p.records.insert(r.id(), r);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path, "reading", e)),
        }
        p.path = Some(path);
        Ok(p)
    }

    /// Paces writes: the next one starts at least `d` after the last one ended.
    pub fn set_min_write_interval(&mut self, d: Duration) {
        self.min_write_interval = d;
    }

    /// The salt of every token hash.
    pub fn salt(&self) -> [u8; 32] {
        self.salt
    }

    /// Records held: one per registered VM, plus one per VM of the configuration file removed at run
    /// time (which keeps it removed across restarts).
    pub fn record_count(&self) -> usize {
        self.records.len()
    }

    /// The records, in VM id order.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.values()
    }

    /// Keeps `rec` as its VM's record and writes the file; on a failed write the record set is as
    /// before.
    pub fn set(&mut self, rec: Record) -> Result<(), ServerError> {
        let id = rec.id();
        let old = self.records.insert(id, rec);
        self.write().inspect_err(|_| self.restore(id, old))
    }

    /// Records that `vm` was removed and writes the file (a tombstone for a configured VM, no record
    /// otherwise); on a failed write the record set is as before.
    pub fn remove(&mut self, vm: u32) -> Result<(), ServerError> {
        let old = if self.configured.contains(&vm) {
            self.records.insert(vm, Record::Removed { id: vm })
        } else {
            self.records.remove(&vm)
        };
        self.write().inspect_err(|_| self.restore(vm, old))
    }

    fn restore(&mut self, id: u32, old: Option<Record>) {
        match old {
            Some(r) => self.records.insert(id, r),
            None => self.records.remove(&id),
        };
    }

    /// The whole file, atomically (see the module documentation), once `min_write_interval` has passed
    /// since the last write. The wait holds the caller's lock, which only the admin API's registration
    /// changes take (they queue behind it, never the data path).
    fn write(&mut self) -> Result<(), ServerError> {
        let Some(path) = &self.path else { return Ok(()) };
        if let Some(last) = self.last_write {
            let wait = self.min_write_interval.saturating_sub(last.elapsed());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        let written = self.write_now(path);
        self.last_write = Some(Instant::now());
        written
    }

    fn write_now(&self, path: &Path) -> Result<(), ServerError> {
        let body = FileBody {
            version: FILE_VERSION,
            salt: TokenHash(self.salt).to_hex(),
            vms: self.records.values().cloned().collect(),
        };
        let text = serde_json::to_vec_pretty(&body).expect("plain data serialises");
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tmp = path.with_extension("json.tmp");
        let w = || -> std::io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        w().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err(path, "writing", e)
        })
    }
}

/// Narrows a file readable or writable by others to 0600 (it holds only hashes, but they are the keys
/// to every VM's data).
fn narrow_mode(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            tracing::warn!("{} was readable by others: narrowed to mode 0600", path.display());
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn rec(id: u32) -> Record {
        Record::Registered {
            id,
            weights: VmWeights::equal(100),
            max_pools: Some(3),
            dedup_group: "g1".into(),
            data_token_sha256: "ab".repeat(32),
            admin_token_sha256: "cd".repeat(32),
        }
    }

    #[test]
    fn records_round_trip_with_their_salt_and_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registrations.json");
        let mut p = Persisted::open(Some(path.clone()), [1].into()).unwrap();
        assert!(!path.exists(), "nothing is written before a change");
        p.set(rec(5)).unwrap();
        p.remove(1).unwrap();
        p.set(rec(6)).unwrap();
        p.remove(6).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let back = Persisted::open(Some(path.clone()), [1].into()).unwrap();
        assert_eq!(back.salt(), p.salt());
        let got: Vec<Record> = back.records().cloned().collect();
        assert_eq!(got, vec![Record::Removed { id: 1 }, rec(5)], "a run-time VM removed leaves nothing");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("token\""), "no clear token field: {text}");
    }

    #[test]
    fn a_wider_mode_is_narrowed_and_a_bad_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let mut p = Persisted::open(Some(path.clone()), BTreeSet::new()).unwrap();
        p.set(rec(2)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Persisted::open(Some(path.clone()), BTreeSet::new()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "{not json").unwrap();
        let e = Persisted::open(Some(path.clone()), BTreeSet::new()).unwrap_err();
        assert!(e.to_string().contains("r.json"), "{e}");
    }

    #[test]
    fn a_failed_write_keeps_the_records_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: the rename fails.
        let path = dir.path().join("r.json");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), "").unwrap();
        let mut p = Persisted::open(Some(dir.path().join("absent.json")), BTreeSet::new()).unwrap();
        p.path = Some(path);
        assert!(p.set(rec(4)).is_err());
        assert_eq!(p.records().count(), 0);
    }
}
