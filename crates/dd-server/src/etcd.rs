//! etcd membership for co-operative de-duplication (`coop.membership = "etcd"`), through etcd's v3
//! JSON gateway over plain HTTP (`coop.etcd.endpoint`, e.g. the local etcd on 127.0.0.1:2379).
//!
//! Each daemon keeps one key, `prefix + node_name -> coop.listen`, attached to a lease of
//! `lease_ttl_s` seconds that it renews every third of that. A daemon that dies stops renewing, its key
//! disappears when the lease expires, and the others drop it from their peer lists at their next
//! refresh: liveness comes from the lease, not from a failure detector of our own. The peer list is the
//! range of keys under the prefix (minus this daemon).
//!
//! Invariants: every call is blocking and bounded by the agent's timeouts (run on the blocking pool,
//! never under an engine lock); a lease that etcd reports expired (TTL absent or 0 on keep-alive) is
//! replaced by a fresh one and the key is written again.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::time::Duration;

/// Errors talking to etcd (the refresh logs them and retries at the next tick).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    #[error("etcd request {path}: {message}")]
    Http { path: &'static str, message: String },
    #[error("etcd answered {path} without {field}")]
    Missing { path: &'static str, field: &'static str },
}

pub struct Etcd {
    endpoint: String,
    prefix: String,
    ttl_s: u64,
    agent: ureq::Agent,
    /// The current lease id, as etcd spells it (a decimal string).
    lease: Mutex<Option<String>>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd").field("endpoint", &self.endpoint).field("prefix", &self.prefix).finish()
    }
}

/// The first key after every key that starts with `prefix` (etcd's `range_end` for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

impl Etcd {
    pub fn new(endpoint: &str, prefix: &str, ttl_s: u64, timeout: Duration) -> Etcd {
        Etcd {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            prefix: prefix.to_string(),
            ttl_s,
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
            lease: Mutex::new(None),
        }
    }

    fn post(&self, path: &'static str, body: Value) -> Result<Value, EtcdError> {
        let url = format!("{}{}", self.endpoint, path);
        let resp = self
            .agent
            .post(&url)
            .send_json(body)
            .map_err(|e| EtcdError::Http { path, message: e.to_string() })?;
        resp.into_json::<Value>().map_err(|e| EtcdError::Http { path, message: e.to_string() })
    }

    /// Writes (or keeps alive) this daemon's key under its lease.
    pub fn register(&self, name: &str, addr: &str) -> Result<(), EtcdError> {
        let current = self.lease.lock().clone();
        if let Some(id) = current {
            let r = self.post("/v3/lease/keepalive", json!({ "ID": id }))?;
            let ttl = r["result"]["TTL"].as_str().and_then(|t| t.parse::<i64>().ok()).unwrap_or(0);
            if ttl > 0 {
                return Ok(());
            }
            // Expired (we were away longer than the TTL): start over with a new lease.
        }
        let r = self.post("/v3/lease/grant", json!({ "TTL": self.ttl_s }))?;
        let id = match &r["ID"] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => return Err(EtcdError::Missing { path: "/v3/lease/grant", field: "ID" }),
        };
        let key = format!("{}{name}", self.prefix);
        self.post("/v3/kv/put", json!({ "key": B64.encode(key), "value": B64.encode(addr), "lease": id }))?;
        *self.lease.lock() = Some(id);
        Ok(())
    }

    /// Every registered daemon: (name, address).
    pub fn members(&self) -> Result<Vec<(String, String)>, EtcdError> {
        let p = self.prefix.as_bytes();
        let r = self
            .post("/v3/kv/range", json!({ "key": B64.encode(p), "range_end": B64.encode(prefix_end(p)) }))?;
        let mut out = Vec::new();
        for kv in r["kvs"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let dec = |f: &str| {
                kv[f].as_str().and_then(|s| B64.decode(s).ok()).and_then(|b| String::from_utf8(b).ok())
            };
            if let (Some(k), Some(v)) = (dec("key"), dec("value")) {
                if let Some(name) = k.strip_prefix(&self.prefix) {
                    out.push((name.to_string(), v));
                }
            }
        }
        Ok(out)
    }

    /// Revokes the lease (graceful shutdown: peers see this daemon leave at once).
    pub fn revoke(&self) {
        if let Some(id) = self.lease.lock().take() {
            let _ = self.post("/v3/lease/revoke", json!({ "ID": id }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end(b"/dd/"), b"/dd0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
