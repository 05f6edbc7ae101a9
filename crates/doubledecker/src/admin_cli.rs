//! `doubledecker vm ...`, `pool ...`, `stats ...`: a thin client of the daemon's admin API
//! (`docs/admin-api.yaml`). The URL comes from `--admin-url` or `DD_ADMIN_URL`; the host token from
//! `--token`, `DD_ADMIN_TOKEN` or the daemon's token file (`dd-data/admin.token`); the VM-scope token
//! of `pool` commands from `--token` or `DD_VM_TOKEN`.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use dd_client::admin::AdminClient;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// Admin API base URL.
    #[arg(long, env = "DD_ADMIN_URL", default_value = "http://127.0.0.1:7412", global = true)]
    admin_url: String,
    /// Bearer token (host scope for `vm` and `stats`, VM scope for `pool` and `stats --vm`).
    #[arg(long, global = true)]
    token: Option<String>,
    /// Token file read when no token is given (host scope).
    #[arg(long, default_value = "dd-data/admin.token", global = true)]
    token_file: PathBuf,
}

impl Conn {
    fn host_token(&self) -> Result<String> {
        if let Some(t) = &self.token {
            return Ok(t.clone());
        }
        if let Ok(t) = std::env::var("DD_ADMIN_TOKEN") {
            return Ok(t);
        }
        let t = std::fs::read_to_string(&self.token_file).with_context(|| {
            format!("no --token, no DD_ADMIN_TOKEN, and cannot read {}", self.token_file.display())
        })?;
        Ok(t.trim().to_string())
    }

    fn vm_token(&self) -> Result<String> {
        self.token
            .clone()
            .or_else(|| std::env::var("DD_VM_TOKEN").ok())
            .ok_or_else(|| anyhow!("VM-scope commands need --token or DD_VM_TOKEN (the VM's admin token)"))
    }

    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> Result<Value> {
        Ok(AdminClient::new(&self.admin_url).call(method, path, token, body.as_ref())?)
    }
}

#[derive(Subcommand, Debug)]
pub enum VmCommand {
    /// Register a VM; prints its data-plane and admin tokens (shown only once).
    Add {
        id: u32,
        #[arg(long, default_value_t = 100)]
        mem_weight: u32,
        #[arg(long, default_value_t = 100)]
        ssd_weight: u32,
        #[arg(long)]
        json: bool,
    },
    /// List VMs.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Change a VM's weights.
    SetWeights {
        id: u32,
        #[arg(long)]
        mem: u32,
        #[arg(long)]
        ssd: u32,
    },
    /// Remove a VM and every pool it has.
    Remove { id: u32 },
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
        #[arg(long)]
        persistent: bool,
        #[arg(long)]
        json: bool,
    },
    /// List the VM's pools.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Change a pool's <T, W>.
    SetSpec {
        pool: u32,
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 100)]
        weight: u32,
        #[arg(long, default_value_t = 100)]
        ssd_weight: u32,
    },
    /// Destroy a pool and its pages.
    Destroy { pool: u32 },
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

pub fn vm(conn: &Conn, c: VmCommand) -> Result<()> {
    let t = conn.host_token()?;
    match c {
        VmCommand::Add { id, mem_weight, ssd_weight, json } => {
            let r = conn.call(
                "POST",
                "/v1/vms",
                &t,
                Some(json!({ "id": id, "weights": { "mem": mem_weight, "ssd": ssd_weight } })),
            )?;
            if json {
                println!("{r}");
            } else {
                println!("vm {} registered (weights mem {} ssd {})", r["id"], mem_weight, ssd_weight);
                println!("data token:  {}", r["data_token"].as_str().unwrap_or(""));
                println!("admin token: {}", r["admin_token"].as_str().unwrap_or(""));
            }
        }
        VmCommand::List { json } => {
            let r = conn.call("GET", "/v1/vms", &t, None)?;
            if json {
                println!("{r}");
            } else {
                println!("{:>6} {:>10} {:>10} {:>6}", "vm", "mem_weight", "ssd_weight", "pools");
                for v in r.as_array().into_iter().flatten() {
                    println!(
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
            println!("vm {id}: weights mem {mem} ssd {ssd}");
        }
        VmCommand::Remove { id } => {
            conn.call("DELETE", &format!("/v1/vms/{id}"), &t, None)?;
            println!("vm {id} removed");
        }
    }
    Ok(())
}

fn print_pools(pools: &[Value]) {
    println!(
        "{:>6} {:>4} {:>10} {:<14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "pool", "vm", "kind", "spec", "mem_used", "ssd_used", "mem_ent", "puts", "hits", "misses"
    );
    for p in pools {
        let c = &p["counters"];
        let puts = c["mem"]["puts"].as_u64().unwrap_or(0) + c["ssd"]["puts"].as_u64().unwrap_or(0);
        let hits = c["mem"]["gets_hit"].as_u64().unwrap_or(0) + c["ssd"]["gets_hit"].as_u64().unwrap_or(0);
        println!(
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
}

pub fn pool(conn: &Conn, c: PoolCommand) -> Result<()> {
    let t = conn.vm_token()?;
    match c {
        PoolCommand::Create { store, weight, ssd_weight, persistent, json } => {
            let body = json!({
                "kind": if persistent { "persistent" } else { "ephemeral" },
                "spec": spec(&store, weight, ssd_weight)?,
            });
            let r = conn.call("POST", "/v1/vm/pools", &t, Some(body))?;
            if json {
                println!("{r}");
            } else {
                println!("pool {} created ({})", r["pool"], spec_text(&r["spec"]));
            }
        }
        PoolCommand::List { json } => {
            let r = conn.call("GET", "/v1/vm/pools", &t, None)?;
            if json {
                println!("{r}");
            } else {
                print_pools(r.as_array().map(|v| &v[..]).unwrap_or(&[]));
            }
        }
        PoolCommand::SetSpec { pool, store, weight, ssd_weight } => {
            let r = conn.call(
                "PUT",
                &format!("/v1/vm/pools/{pool}/spec"),
                &t,
                Some(spec(&store, weight, ssd_weight)?),
            )?;
            println!("pool {pool}: {}", spec_text(&r["spec"]));
        }
        PoolCommand::Destroy { pool } => {
            conn.call("DELETE", &format!("/v1/vm/pools/{pool}"), &t, None)?;
            println!("pool {pool} destroyed");
        }
    }
    Ok(())
}

pub fn stats(conn: &Conn, a: StatsArgs) -> Result<()> {
    let r = if a.vm {
        conn.call("GET", "/v1/vm/stats", &conn.vm_token()?, None)?
    } else {
        conn.call("GET", "/v1/stats", &conn.host_token()?, None)?
    };
    if a.json {
        println!("{r}");
        return Ok(());
    }
    let vms: Vec<Value> =
        if a.vm { vec![r.clone()] } else { r["vms"].as_array().cloned().unwrap_or_default() };
    if !a.vm {
        println!(
            "mode {}  page {} B  eviction batch {} pages",
            txt(&r["mode"]),
            txt(&r["page_size"]),
            txt(&r["eviction_batch_pages"])
        );
        println!("{:<6} {:>12} {:>12}", "store", "capacity", "used");
        for s in r["stores"].as_array().into_iter().flatten().filter(|s| s["configured"] == true) {
            println!(
                "{:<6} {:>12} {:>12}",
                txt(&s["kind"]),
                txt(&s["capacity_pages"]),
                txt(&s["used_pages"])
            );
        }
        println!();
    }
    println!(
        "{:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "vm", "mem_w", "ssd_w", "mem_used", "ssd_used", "mem_ent", "ssd_ent"
    );
    for v in &vms {
        let t = &v["totals"];
        println!(
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
    println!();
    let pools: Vec<Value> =
        vms.iter().flat_map(|v| v["pools"].as_array().cloned().unwrap_or_default()).collect();
    print_pools(&pools);
    Ok(())
}
