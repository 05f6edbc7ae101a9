//! A blocking client of the daemon's admin API (`docs/admin-api.yaml`): JSON over HTTP/1.1 with a bearer
//! token per call (host scope or a VM's scope), used by the CLI's `vm`/`pool`/`stats` commands, the lab
//! against a daemon and the benchmarks.
//!
//! Errors keep the API's stable error code: a non-2xx answer is [`AdminError::Status`] with the `code`
//! and `message` of the JSON error body (`unknown_pool`, `bad_request`, ...), so callers match on the
//! code, not on message text.

use crate::tls::{client_config, TlsError};
use serde::de::DeserializeOwned;
use std::path::Path;
use std::time::Duration;

/// Errors of an admin API call; each names the call (`method path`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The daemon answered with an error status; `code` is the API's stable error code (empty when the
    /// body was not the API's JSON error).
    #[error("{method} {path}: HTTP {status} {code}: {message}")]
    Status { method: String, path: String, status: u16, code: String, message: String },
    /// No answer: connection refused, reset, timed out.
    #[error("{method} {path}: {message}")]
    Transport { method: String, path: String, message: String },
    /// A 2xx answer whose body is not the JSON the caller asked for.
    #[error("{method} {path}: bad JSON answer: {message}")]
    BadAnswer { method: String, path: String, message: String },
}

impl AdminError {
    /// The API's error code of a [`AdminError::Status`] answer.
    pub fn code(&self) -> Option<&str> {
        match self {
            AdminError::Status { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The admin API of one daemon.
#[derive(Debug, Clone)]
pub struct AdminClient {
    /// `http://host:port`, without a trailing slash.
    base: String,
    agent: ureq::Agent,
}

/// Default per-call timeout (connect, send and receive together).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

impl AdminClient {
    /// `addr` is `host:port` or a base URL (`http://host:port`).
    pub fn new(addr: &str) -> AdminClient {
        AdminClient::with_timeout(addr, DEFAULT_TIMEOUT)
    }

    pub fn with_timeout(addr: &str, timeout: Duration) -> AdminClient {
        let addr = addr.trim_end_matches('/');
        let base = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
        AdminClient { base, agent: ureq::AgentBuilder::new().timeout(timeout).build() }
    }

    /// An admin API behind TLS: `addr` is `host:port` or `https://host:port`, and the daemon's
    /// certificate must chain to a CA of the PEM file `ca_file` (and name the host of `addr`).
    pub fn with_tls(addr: &str, timeout: Duration, ca_file: &Path) -> Result<AdminClient, TlsError> {
        let addr = addr.trim_end_matches('/');
        let base = match addr.split_once("://") {
            Some((_, rest)) => format!("https://{rest}"),
            None => format!("https://{addr}"),
        };
        let agent = ureq::AgentBuilder::new().timeout(timeout).tls_config(client_config(ca_file)?).build();
        Ok(AdminClient { base, agent })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// One call with `token`; decodes the JSON answer into `T` (an empty answer, such as a 204, decodes
    /// as JSON `null`: use `serde_json::Value` or `()`-like targets for those).
    pub fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, AdminError> {
        let url = format!("{}{}", self.base, path);
        let req = self.agent.request(method, &url).set("Authorization", &format!("Bearer {token}"));
        let (m, p) = (method.to_string(), path.to_string());
        let r = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let (code, message) = match serde_json::from_str::<serde_json::Value>(&text) {
                    Ok(v) if v["code"].is_string() => (
                        v["code"].as_str().unwrap_or_default().to_string(),
                        v["message"].as_str().unwrap_or_default().to_string(),
                    ),
                    _ => (String::new(), text),
                };
                return Err(AdminError::Status { method: m, path: p, status, code, message });
            }
            Err(e) => return Err(AdminError::Transport { method: m, path: p, message: e.to_string() }),
        };
        let text = resp.into_string().map_err(|e| AdminError::Transport {
            method: m.clone(),
            path: p.clone(),
            message: e.to_string(),
        })?;
        let text = if text.trim().is_empty() { "null" } else { text.as_str() };
        serde_json::from_str(text).map_err(|e| AdminError::BadAnswer {
            method: m,
            path: p,
            message: e.to_string(),
        })
    }
}
