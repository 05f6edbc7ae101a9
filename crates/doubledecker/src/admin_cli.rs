//! `doubledecker vm ...`, `pool ...`, `stats ...`: a thin client of the daemon's admin API
//! (`docs/admin-api.yaml`). One token story for every command: the URL comes from `--admin-url` or
//! `DD_ADMIN_URL`; the host admin token from `--token`, `DD_HOST_TOKEN` or the daemon's token file
//! (`dd-data/admin.token`); a VM's admin token (`pool`, `stats --vm`) from `--token` or
//! `DD_VM_ADMIN_TOKEN`; a VM's data-plane token (`guest watch`, `mount`) from `--token` or
//! `DD_VM_DATA_TOKEN`. The older names `DD_ADMIN_TOKEN` and `DD_VM_TOKEN` still work.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use dd_client::admin::AdminClient;
use serde_json::{json, Value};
use std::path::PathBuf;

/// The admin API's address. Every command that talks to the admin API takes the same form,
/// `http://HOST:PORT` (a bare `HOST:PORT` is read as `http://HOST:PORT`), or `https://HOST:PORT` for a
/// daemon whose admin listener has TLS on, with the CA file that signed its certificate.
#[derive(Args, Debug, Clone)]
pub struct ApiUrl {
    /// Admin API base URL, `http://HOST:PORT` (or `https://HOST:PORT` with --tls-ca).
    #[arg(long, env = "DD_ADMIN_URL", default_value = "http://127.0.0.1:7412", global = true)]
    admin_url: String,
    /// For an `https://` admin URL: the PEM file of the CA that signed the daemon's certificate (the only
    /// CA trusted).
    #[arg(long, env = "DD_TLS_CA_FILE", global = true)]
    tls_ca: Option<PathBuf>,
}

/// Host scope (`vm ...`): the host admin token.
#[derive(Args, Debug, Clone)]
pub struct HostConn {
    #[command(flatten)]
    url: ApiUrl,
    /// The host admin token (default: $DD_HOST_TOKEN, else the token file).
    #[arg(long, env = "DD_HOST_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// The file holding the host admin token, read when neither --token nor $DD_HOST_TOKEN is given;
    /// the daemon writes it in its data directory.
    #[arg(long, default_value = "dd-data/admin.token", global = true)]
    token_file: PathBuf,
}

/// VM scope (`pool ...`): one VM's admin token.
#[derive(Args, Debug, Clone)]
pub struct VmConn {
    #[command(flatten)]
    url: ApiUrl,
    /// The VM's admin token, printed by `vm add` (`vm tokens ID --rotate` replaces a lost one).
    #[arg(long, env = "DD_VM_ADMIN_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
}

/// `stats`: host scope, or VM scope with `--vm`.
#[derive(Args, Debug, Clone)]
pub struct StatsConn {
    #[command(flatten)]
    url: ApiUrl,
    /// The host admin token (default: $DD_HOST_TOKEN, else --token-file); with --vm, the VM's admin
    /// token (default: $DD_VM_ADMIN_TOKEN).
    #[arg(long)]
    token: Option<String>,
    /// Without --vm: the file holding the host admin token, read when neither --token nor
    /// $DD_HOST_TOKEN is given.
    #[arg(long, default_value = "dd-data/admin.token")]
    token_file: PathBuf,
}

/// The environment variable holding a VM's admin token (`pool`, `stats --vm`).
pub const VM_ADMIN_TOKEN_ENV: &str = "DD_VM_ADMIN_TOKEN";
/// The environment variable holding a VM's data-plane token (`guest watch`, `mount`).
pub const VM_DATA_TOKEN_ENV: &str = "DD_VM_DATA_TOKEN";

/// The first of `names` set in the environment (non-empty).
fn env_first(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

/// The host admin token: the flag (clap already read $DD_HOST_TOKEN into it), then the older name
/// `DD_ADMIN_TOKEN` scripts may still set, then the token file.
pub(crate) fn host_token(token: &Option<String>, file: &std::path::Path) -> Result<String> {
    if let Some(t) = token.clone().or_else(|| env_first(&["DD_HOST_TOKEN", "DD_ADMIN_TOKEN"])) {
        return Ok(t);
    }
    let t = std::fs::read_to_string(file)
        .with_context(|| format!("no --token, no DD_HOST_TOKEN, and cannot read {}", file.display()))?;
    Ok(t.trim().to_string())
}

/// A VM's admin token: the flag ($DD_VM_ADMIN_TOKEN), then the older name `DD_VM_TOKEN`.
fn vm_token(token: &Option<String>) -> Result<String> {
    token.clone().or_else(|| env_first(&[VM_ADMIN_TOKEN_ENV, "DD_VM_TOKEN"])).ok_or_else(|| {
        anyhow!(
            "VM-scope commands need the VM's admin token: --token or {VM_ADMIN_TOKEN_ENV} \
             (`vm add` prints it; `vm tokens ID --rotate` replaces a lost one)"
        )
    })
}

impl ApiUrl {
    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> Result<Value> {
        Ok(self.client()?.call(method, path, token, body.as_ref())?)
    }

    /// The admin client for this URL: TLS for `https://` (which needs --tls-ca), plain otherwise.
    fn client(&self) -> Result<AdminClient> {
        let timeout = dd_client::admin::DEFAULT_TIMEOUT;
        match (self.admin_url.starts_with("https://"), &self.tls_ca) {
            (true, Some(ca)) => Ok(AdminClient::with_tls(&self.admin_url, timeout, ca)?),
            (true, None) => bail!(
                "{} is https: give the PEM file of the CA that signed the daemon's certificate \
                 (--tls-ca FILE or DD_TLS_CA_FILE)",
                self.admin_url
            ),
            (false, _) => Ok(AdminClient::with_timeout(&self.admin_url, timeout)),
        }
    }
}

/// How `vm add` and `vm tokens --rotate` print a VM's credentials.
#[derive(Args, Debug, Clone, Copy)]
pub struct CredsFormat {
    /// Print the JSON answer of the admin API instead of text.
    #[arg(long, conflicts_with = "env")]
    json: bool,
    /// Print `export DD_VM_ADMIN_TOKEN=...` and `export DD_VM_DATA_TOKEN=...` lines, to be run by the
    /// shell: `eval "$(doubledecker ... --env)"` with this command.
    #[arg(long)]
    env: bool,
}

#[derive(Subcommand, Debug)]
pub enum VmCommand {
    /// Register a VM; prints its data-plane and admin tokens (shown only once: `--env` prints them as
    /// shell exports).
    Add {
        /// The VM's id (any number not yet registered).
        id: u32,
        /// The VM's weight in the memory store.
        #[arg(long, default_value_t = 100)]
        mem_weight: u32,
        /// The VM's weight in the SSD store.
        #[arg(long, default_value_t = 100)]
        ssd_weight: u32,
        #[command(flatten)]
        format: CredsFormat,
    },
    /// List VMs.
    List {
        /// Print the JSON answer of the admin API instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Change a VM's weights.
    SetWeights {
        /// The VM's id.
        id: u32,
        /// The new weight in the memory store.
        #[arg(long)]
        mem: u32,
        /// The new weight in the SSD store.
        #[arg(long)]
        ssd: u32,
    },
    /// Replace a VM's data-plane and admin tokens (for a lost or leaked token); its pools stay, and
    /// sessions and requests of the old tokens are cut off.
    Tokens {
        /// The VM's id.
        id: u32,
        /// Generate new tokens and print them (required: tokens are never shown again after they are
        /// issued).
        #[arg(long, required = true)]
        rotate: bool,
        #[command(flatten)]
        format: CredsFormat,
    },
    /// Remove a VM and every pool it has.
    Remove {
        /// The VM's id.
        id: u32,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Create a pool (a container) for the VM whose admin token is given.
    Create {
        /// mem, ssd, hybrid or none.
        #[arg(long, default_value = "mem")]
        store: String,
        /// Weight (mem, ssd) or memory weight (hybrid).
        #[arg(long, default_value_t = 100)]
        weight: u32,
        /// SSD weight of a hybrid spec.
        #[arg(long, default_value_t = 100)]
        ssd_weight: u32,
        /// A persistent pool (its pages survive until the pool is destroyed; the default, ephemeral,
        /// drops a page once it is read back).
        #[arg(long)]
        persistent: bool,
        /// Print the JSON answer of the admin API instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the VM's pools.
    List {
        /// Print the JSON answer of the admin API instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Change a pool's <T, W>.
    SetSpec {
        /// The pool's id (as `pool create` or `pool list` print it).
        pool: u32,
        /// mem, ssd, hybrid or none.
        #[arg(long)]
        store: String,
        /// Weight (mem, ssd) or memory weight (hybrid). Default: the pool's weight now (its memory
        /// weight if hybrid), 100 if it has none.
        #[arg(long)]
        weight: Option<u32>,
        /// SSD weight of a hybrid spec. Default: the pool's SSD weight now (its weight if on the SSD
        /// store), 100 if it has none.
        #[arg(long)]
        ssd_weight: Option<u32>,
    },
    /// Destroy a pool and its pages.
    Destroy {
        /// The pool's id.
        pool: u32,
    },
}

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Print the JSON document instead of tables.
    #[arg(long)]
    json: bool,
    /// VM scope: the VM of the given admin token only.
    #[arg(long)]
    vm: bool,
}

fn spec(store: &str, weight: u32, ssd_weight: u32) -> Result<Value> {
    Ok(match store {
        "mem" | "ssd" => json!({ "type": store, "weight": weight }),
        "hybrid" => json!({ "type": "hybrid", "mem_weight": weight, "ssd_weight": ssd_weight }),
        "none" => json!({ "type": "none" }),
        other => bail!("--store must be mem, ssd, hybrid or none, not {other:?}"),
    })
}

/// A JSON scalar as plain text (strings unquoted), so table columns can be padded.
fn txt(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn spec_text(s: &Value) -> String {
    match s["type"].as_str().unwrap_or("?") {
        "hybrid" => format!("hybrid {}/{}", s["mem_weight"], s["ssd_weight"]),
        "none" => "none".into(),
        t => format!("{t} {}", s["weight"]),
    }
}

pub fn vm(c_: &HostConn, c: VmCommand) -> Result<()> {
    let t = host_token(&c_.token, &c_.token_file)?;
    let conn = &c_.url;
    match c {
        VmCommand::Add { id, mem_weight, ssd_weight, format } => {
            let body = json!({ "id": id, "weights": { "mem": mem_weight, "ssd": ssd_weight } });
            let r = match conn.client()?.call("POST", "/v1/vms", &t, Some(&body)) {
                Ok(r) => r,
                // `eval "$(vm add ID --env)"` on a VM that exists would set nothing: say what to run.
                Err(e) if e.code() == Some("vm_exists") => bail!(
                    "{e}; its tokens are not shown again: `doubledecker vm tokens {id} --rotate` replaces them \
                     (and prints the new ones), `doubledecker vm remove {id}` removes the VM"
                ),
                Err(e) => return Err(e.into()),
            };
            print_creds(
                &r,
                format,
                &format!("vm {} registered (weights mem {mem_weight} ssd {ssd_weight})", r["id"]),
            );
        }
        VmCommand::Tokens { id, rotate: _, format } => {
            let r = conn.call("POST", &format!("/v1/vms/{id}/tokens"), &t, Some(json!({})))?;
            print_creds(&r, format, &format!("vm {id}: new tokens (the old ones no longer work)"));
        }
        VmCommand::List { json } => {
            let r = conn.call("GET", "/v1/vms", &t, None)?;
            if json {
                outln!("{r}");
            } else {
                outln!("{:>6} {:>10} {:>10} {:>6}", "vm", "mem_weight", "ssd_weight", "pools");
                for v in r.as_array().into_iter().flatten() {
                    outln!(
                        "{:>6} {:>10} {:>10} {:>6}",
                        txt(&v["id"]),
                        txt(&v["weights"]["mem"]),
                        txt(&v["weights"]["ssd"]),
                        txt(&v["pools"])
                    );
                }
            }
        }
        VmCommand::SetWeights { id, mem, ssd } => {
            conn.call("PUT", &format!("/v1/vms/{id}/weights"), &t, Some(json!({ "mem": mem, "ssd": ssd })))?;
            outln!("vm {id}: weights mem {mem} ssd {ssd}");
        }
        VmCommand::Remove { id } => {
            conn.call("DELETE", &format!("/v1/vms/{id}"), &t, None)?;
            outln!("vm {id} removed");
        }
    }
    Ok(())
}

/// A VM's credentials as the admin API returns them (`VmCredentials`), in the format asked for.
fn print_creds(r: &Value, f: CredsFormat, headline: &str) {
    let data = r["data_token"].as_str().unwrap_or("");
    let admin = r["admin_token"].as_str().unwrap_or("");
    if f.json {
        outln!("{r}");
    } else if f.env {
        // Tokens are URL-safe text; single quotes keep any shell from reading them anyway.
        outln!("export {VM_ADMIN_TOKEN_ENV}='{admin}'");
        outln!("export {VM_DATA_TOKEN_ENV}='{data}'");
    } else {
        outln!("{headline}");
        outln!("data token:  {data}    (guest watch, mount: --token or {VM_DATA_TOKEN_ENV})");
        outln!("admin token: {admin}    (pool, stats --vm: --token or {VM_ADMIN_TOKEN_ENV})");
    }
}

fn print_pools(pools: &[Value]) {
    outln!(
        "{:>6} {:>4} {:>10} {:<14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "pool",
        "vm",
        "kind",
        "spec",
        "mem_used",
        "ssd_used",
        "mem_ent",
        "puts",
        "hits",
        "misses"
    );
    for p in pools {
        let c = &p["counters"];
        let puts = c["mem"]["puts"].as_u64().unwrap_or(0) + c["ssd"]["puts"].as_u64().unwrap_or(0);
        let hits = c["mem"]["gets_hit"].as_u64().unwrap_or(0) + c["ssd"]["gets_hit"].as_u64().unwrap_or(0);
        outln!(
            "{:>6} {:>4} {:>10} {:<14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            txt(&p["pool"]),
            txt(&p["vm"]),
            p["kind"].as_str().unwrap_or(""),
            spec_text(&p["spec"]),
            txt(&c["mem"]["used"]),
            txt(&c["ssd"]["used"]),
            txt(&c["mem"]["entitlement"]),
            puts,
            hits,
            txt(&c["gets_missed"])
        );
    }
    outln!("(mem_used, ssd_used and mem_ent in pages; puts, hits and misses are counts since the pool was created)");
}

pub fn pool(c_: &VmConn, c: PoolCommand) -> Result<()> {
    let t = vm_token(&c_.token)?;
    let conn = &c_.url;
    match c {
        PoolCommand::Create { store, weight, ssd_weight, persistent, json } => {
            let body = json!({
                "kind": if persistent { "persistent" } else { "ephemeral" },
                "spec": spec(&store, weight, ssd_weight)?,
            });
            let r = conn.call("POST", "/v1/vm/pools", &t, Some(body))?;
            if json {
                outln!("{r}");
            } else {
                outln!("pool {} created ({})", r["pool"], spec_text(&r["spec"]));
            }
        }
        PoolCommand::List { json } => {
            let r = conn.call("GET", "/v1/vm/pools", &t, None)?;
            if json {
                outln!("{r}");
            } else {
                print_pools(r.as_array().map(|v| &v[..]).unwrap_or(&[]));
            }
        }
        PoolCommand::SetSpec { pool, store, weight, ssd_weight } => {
            // A weight left out keeps the pool's (issue 31: it became 100 without a word).
            let (weight, ssd_weight) = if weight.is_none() || ssd_weight.is_none() {
                let now = conn.call("GET", &format!("/v1/vm/pools/{pool}"), &t, None)?;
                let s = &now["spec"];
                let w = |k: &str| s[k].as_u64().map(|v| v as u32);
                let (mem_now, ssd_now) = match s["type"].as_str() {
                    Some("hybrid") => (w("mem_weight"), w("ssd_weight")),
                    _ => (w("weight"), w("weight")),
                };
                (weight.or(mem_now).unwrap_or(100), ssd_weight.or(ssd_now).unwrap_or(100))
            } else {
                (weight.unwrap_or(100), ssd_weight.unwrap_or(100))
            };
            let r = conn.call(
                "PUT",
                &format!("/v1/vm/pools/{pool}/spec"),
                &t,
                Some(spec(&store, weight, ssd_weight)?),
            )?;
            outln!("pool {pool}: {}", spec_text(&r["spec"]));
        }
        PoolCommand::Destroy { pool } => {
            conn.call("DELETE", &format!("/v1/vm/pools/{pool}"), &t, None)?;
            outln!("pool {pool} destroyed");
        }
    }
    Ok(())
}

pub fn stats(c_: &StatsConn, a: StatsArgs) -> Result<()> {
    let conn = &c_.url;
    let r = if a.vm {
        conn.call("GET", "/v1/vm/stats", &vm_token(&c_.token)?, None)?
    } else {
        conn.call("GET", "/v1/stats", &host_token(&c_.token, &c_.token_file)?, None)?
    };
    if a.json {
        outln!("{r}");
        return Ok(());
    }
    let vms: Vec<Value> =
        if a.vm { vec![r.clone()] } else { r["vms"].as_array().cloned().unwrap_or_default() };
    if !a.vm {
        outln!(
            "mode {}  page {} B  eviction batch {} pages",
            txt(&r["mode"]),
            txt(&r["page_size"]),
            txt(&r["eviction_batch_pages"])
        );
        outln!("{:<6} {:>12} {:>12}", "store", "capacity", "used");
        for s in r["stores"].as_array().into_iter().flatten().filter(|s| s["configured"] == true) {
            outln!("{:<6} {:>12} {:>12}", txt(&s["kind"]), txt(&s["capacity_pages"]), txt(&s["used_pages"]));
        }
        outln!();
    }
    outln!(
        "{:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "vm",
        "mem_w",
        "ssd_w",
        "mem_used",
        "ssd_used",
        "mem_ent",
        "ssd_ent"
    );
    let mut idle = false;
    for v in &vms {
        let t = &v["totals"];
        idle |= v["pools"].as_array().is_none_or(|p| p.is_empty());
        outln!(
            "{:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            txt(&v["vm"]),
            txt(&v["weights"]["mem"]),
            txt(&v["weights"]["ssd"]),
            txt(&t["mem"]["used"]),
            txt(&t["ssd"]["used"]),
            txt(&t["mem"]["entitlement"]),
            txt(&t["ssd"]["entitlement"])
        );
    }
    outln!("(used and entitlement (_ent) in pages; a VM's entitlement in a store is 0 until one of its pools uses that store)");
    if idle {
        outln!(
            "(a VM without pools holds no entitlement: create a pool with `pool create` or `guest watch`)"
        );
    }
    outln!();
    let pools: Vec<Value> =
        vms.iter().flat_map(|v| v["pools"].as_array().cloned().unwrap_or_default()).collect();
    print_pools(&pools);
    Ok(())
}
