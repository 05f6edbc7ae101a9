//! The guest provisioners' reports on the admin API (issue 18: `/ui/` shows each VM's targets and
//! decisions). A VM's `doubledecker guest provision` sends its last round with the VM's admin token
//! (`PUT /v1/vm/provisioner`); the daemon keeps the latest per VM, in memory only, and shows it to that
//! VM (`GET /v1/vm/provisioner`) and to the host (`GET /v1/provisioner`, every VM's). The body is
//! `dd_provision::report::RoundReport`, the type the guest sends; it is checked (bounded, every number in
//! its domain) before it is kept, and refused with the stable code `invalid_report` naming the field.
//! This module is the store; the routes are in `crate::admin` with the rest of the API (so that neither
//! module needs the other's internals: the store depends on nothing in this crate).
//!
//! Invariants: a VM has at most one report, replaced whole by the next; it goes with the VM's
//! registration (removed with the VM, or with its tokens replaced, so a VM registered again under the
//! same id starts without one); the map's lock is a leaf, never held across I/O or an engine call.

use dd_engine::VmId;
use dd_provision::report::RoundReport;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// A VM's last report as the daemon keeps and shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredReport {
    pub vm: u32,
    /// When the daemon received it, milliseconds since the Unix epoch.
    pub received_unix_ms: u64,
    pub report: RoundReport,
}

/// The latest report of each VM (a leaf lock).
#[derive(Debug, Default)]
pub struct Reports {
    by_vm: Mutex<BTreeMap<u32, StoredReport>>,
}

impl Reports {
    pub fn put(&self, vm: VmId, report: RoundReport) -> StoredReport {
        let received_unix_ms =
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let s = StoredReport { vm: vm.0, received_unix_ms, report };
        self.by_vm.lock().insert(vm.0, s.clone());
        s
    }

    pub fn get(&self, vm: VmId) -> Option<StoredReport> {
        self.by_vm.lock().get(&vm.0).cloned()
    }

    /// Forgets a VM's report (the VM was removed or its tokens replaced).
    pub fn forget(&self, vm: VmId) {
        self.by_vm.lock().remove(&vm.0);
    }

    /// Reports held (at most one per registered VM).
    pub fn count(&self) -> usize {
        self.by_vm.lock().len()
    }

    /// Every VM's report, by VM id.
    pub fn all(&self) -> Vec<StoredReport> {
        self.by_vm.lock().values().cloned().collect()
    }
}
