//! Credentials: the host administrator's token and, per VM, a data-plane token and a VM-scope admin
//! token (always distinct from each other and from every other token).
//!
//! Invariants: every comparison of a presented token with a stored one is constant-time in the
//! token's content (`subtle`), and a lookup compares against every candidate rather than stopping at the
//! first match, so timing reveals neither which VM a token belongs to nor how much of it matched. An
//! unknown VM and a wrong token fail the same way. The registry's lock is a leaf: it is never held
//! across an engine call.

use dd_engine::VmId;
use parking_lot::RwLock;
use rand::RngCore;
use std::collections::BTreeMap;
use subtle::ConstantTimeEq;

#[derive(Debug, Clone)]
struct VmCreds {
    data_token: Vec<u8>,
    admin_token: Vec<u8>,
}

/// The token registry.
#[derive(Debug)]
pub struct Registry {
    host_token: Vec<u8>,
    vms: RwLock<BTreeMap<VmId, VmCreds>>,
}

/// Constant-time equality of two byte strings (the length is not secret: tokens have public lengths).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// A fresh random token: 32 bytes from the OS generator, hex-encoded.
pub fn generate_token() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Registry {
    pub fn new(host_token: &str) -> Registry {
        Registry { host_token: host_token.as_bytes().to_vec(), vms: RwLock::new(BTreeMap::new()) }
    }

    pub fn is_host(&self, token: &[u8]) -> bool {
        ct_eq(&self.host_token, token)
    }

    /// Whether `token` is `vm`'s data-plane token. An unknown VM is compared against a dummy token so it
    /// costs the same.
    pub fn check_data(&self, vm: VmId, token: &[u8]) -> bool {
        let vms = self.vms.read();
        match vms.get(&vm) {
            Some(c) => ct_eq(&c.data_token, token),
            None => {
                let dummy = vec![0u8; token.len()];
                let _ = ct_eq(&dummy, token);
                false
            }
        }
    }

    /// The VM whose VM-scope admin token this is.
    pub fn vm_of_admin_token(&self, token: &[u8]) -> Option<VmId> {
        let vms = self.vms.read();
        let mut found = None;
        for (id, c) in vms.iter() {
            if ct_eq(&c.admin_token, token) {
                found = Some(*id);
            }
        }
        found
    }

    /// Whether a token is already in use anywhere (tokens must be unique).
    pub fn token_in_use(&self, token: &str) -> bool {
        let t = token.as_bytes();
        self.is_host(t)
            || self.vms.read().values().any(|c| ct_eq(&c.data_token, t) | ct_eq(&c.admin_token, t))
    }

    pub fn insert(&self, vm: VmId, data_token: &str, admin_token: &str) {
        self.vms.write().insert(
            vm,
            VmCreds {
                data_token: data_token.as_bytes().to_vec(),
                admin_token: admin_token.as_bytes().to_vec(),
            },
        );
    }

    pub fn remove(&self, vm: VmId) -> bool {
        self.vms.write().remove(&vm).is_some()
    }

    pub fn contains(&self, vm: VmId) -> bool {
        self.vms.read().contains_key(&vm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_authenticate_only_their_vm_and_scope() {
        let r = Registry::new("host-token-0123456789");
        r.insert(VmId(1), "data-one-0123456789", "admin-one-0123456789");
        r.insert(VmId(2), "data-two-0123456789", "admin-two-0123456789");
        assert!(r.check_data(VmId(1), b"data-one-0123456789"));
        assert!(!r.check_data(VmId(2), b"data-one-0123456789"));
        assert!(!r.check_data(VmId(3), b"data-one-0123456789"));
        assert!(!r.check_data(VmId(1), b"admin-one-0123456789"), "the admin token is not a data token");
        assert_eq!(r.vm_of_admin_token(b"admin-two-0123456789"), Some(VmId(2)));
        assert_eq!(r.vm_of_admin_token(b"data-two-0123456789"), None);
        assert_eq!(r.vm_of_admin_token(b"host-token-0123456789"), None);
        assert!(r.is_host(b"host-token-0123456789"));
        assert!(!r.is_host(b"host-token-012345678"));
        assert!(r.token_in_use("data-two-0123456789"));
        assert!(r.remove(VmId(2)));
        assert!(!r.check_data(VmId(2), b"data-two-0123456789"));
    }

    #[test]
    fn generated_tokens_are_long_and_distinct() {
        let a = generate_token();
        assert_eq!(a.len(), 64);
        assert_ne!(a, generate_token());
    }
}
