//! Scenario data of provisioning (SPEC section 10b): a VM's provisioner settings (`[vms.provision]`),
//! searches over static settings (a variant's `search`). The checks on targets (`targets`, `violation`)
//! are kinds of `super::checks`. Containers carry their `target` (the [`dd_provision::Target`] type, in the container
//! table). `docs/scenario-format.md` is the user's reference.
//!
//! Invariants after validation (called from [`super::Scenario::validate`]): every container named exists
//! in the VM or scenario; times and sizes are finite and non-negative; a search has at least one
//! dimension, every candidate list is non-empty, it expands to at most [`MAX_CANDIDATES`] variants, and
//! at most one container per VM takes the rest of its VM's memory (`rest_of_memory`).
//! [`expand`] is deterministic: candidates come in the order of the containers' names, each list in its
//! order, the last container varying fastest.

use super::Variant;
use crate::error::LabError;
use dd_engine::Spec;
use dd_provision::ProvisionConfig;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// Most variants one search may expand to.
pub const MAX_CANDIDATES: usize = 512;

fn d_true() -> bool {
    true
}
fn d_start() -> f64 {
    60.0
}
fn d_interval() -> f64 {
    30.0
}
fn d_samples() -> u32 {
    dd_mrc::DEFAULT_MAX_SAMPLES as u32
}
fn d_decay() -> f64 {
    0.7
}

/// `[vms.provision]`: the VM-level provisioner of the VM's containers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmProvision {
    /// Whether it runs (a variant's `provision = { VM = bool }` overrides). Default true.
    #[serde(default = "d_true")]
    pub enabled: bool,
    /// First decision, emulated s (scaled): the curves need accesses to say anything. Default 60.
    #[serde(default = "d_start")]
    pub start_s: f64,
    /// Between decisions, emulated s (scaled). Default 30.
    #[serde(default = "d_interval")]
    pub interval_s: f64,
    /// Set the containers' memory limits. Default true.
    #[serde(default = "d_true")]
    pub memory: bool,
    /// Set the containers' pool specs (cache weights). Default true.
    #[serde(default = "d_true")]
    pub cache: bool,
    /// Memory a container keeps whatever the plan, MiB (scaled), by container name. Default none.
    #[serde(default)]
    pub floor_mib: BTreeMap<String, f64>,
    /// Sampled keys each container's curves keep (fixed-size SHARDS). Default 32768
    /// (`dd_mrc::DEFAULT_MAX_SAMPLES`: the size whose curves stay within a mean absolute error of 0.01 on
    /// zipf, uniform and zipf-with-scans traces over every seed tested; 8192 did not, issue 27).
    #[serde(default = "d_samples")]
    pub max_samples: u32,
    /// After each decision the curves' counts are multiplied by this, so that they follow working sets
    /// that change (1: the whole run counts alike). Default 0.7.
    #[serde(default = "d_decay")]
    pub history_decay: f64,
    /// From the start of the run, the VM-wide reclaim of the guest spares the containers' anonymous
    /// memory while any page cache is left (on Linux, what a guest agent keeping each container's
    /// `memory.low` at its anonymous usage would get; the real guest's agent sets none): page cache
    /// dropped goes to the second-chance cache and comes back from it in microseconds, a heap swapped
    /// out comes back through the shared disk, one fault at a time, and before the first decision no
    /// limit protects it. With no page cache left, anonymous memory goes from the memcg holding the most
    /// (a heap growing into a full VM swaps itself out, not a smaller one there first). Reclaim under a
    /// container's own limit is unchanged. Default true.
    #[serde(default = "d_true")]
    pub spare_anon: bool,
    /// A VM none of whose running containers uses the host's memory store at its provisioner's first
    /// decision, while another VM's containers do, stays out of that store: its plans give no memory
    /// cache. The host kept it out (the allocation in force when the loop starts, as an operator or a
    /// static search set it); without this, the loop's least weight per pool (one unit,
    /// `dd_provision::plan`) makes the VM a user of the store again, and the host splits the store
    /// between its users by VM weight, so the other VM loses half of it for a unit of cache (issue 27:
    /// on the 100 generated mixes started from their balanced allocation, 22 more targets met and 11
    /// more mixes with every target met). A VM that starts in the store may still leave it and come
    /// back. Default true.
    #[serde(default = "d_true")]
    pub keep_out_of_mem_store: bool,
    /// The decision's own settings (grid steps, headroom, objective, rounds, hysteresis).
    #[serde(default)]
    pub decision: ProvisionConfig,
}

impl VmProvision {
    pub(crate) fn validate(&self, p: &str, names: &[&str]) -> Result<(), LabError> {
        let fin = |v: f64| v.is_finite() && v >= 0.0;
        if !fin(self.start_s) {
            return Err(LabError::invalid(&format!("{p}.start_s"), "must be non-negative"));
        }
        if !(self.interval_s.is_finite() && self.interval_s > 0.0) {
            return Err(LabError::invalid(&format!("{p}.interval_s"), "must be positive"));
        }
        for (k, v) in &self.floor_mib {
            if !names.contains(&k.as_str()) {
                return Err(LabError::invalid(&format!("{p}.floor_mib.{k}"), "no such container in this VM"));
            }
            if !fin(*v) {
                return Err(LabError::invalid(&format!("{p}.floor_mib.{k}"), "must be non-negative"));
            }
        }
        if !(64..=1 << 20).contains(&self.max_samples) {
            return Err(LabError::invalid(&format!("{p}.max_samples"), "must be in 64..=1048576"));
        }
        if !(self.history_decay > 0.0 && self.history_decay <= 1.0) {
            return Err(LabError::invalid(&format!("{p}.history_decay"), "must be in (0, 1]"));
        }
        self.decision.validate().map_err(|e| LabError::invalid(&format!("{p}.decision"), e.to_string()))
    }

    pub(crate) fn scale(&mut self, k: f64) {
        self.start_s *= k;
        self.interval_s *= k;
        for v in self.floor_mib.values_mut() {
            *v *= k;
        }
    }
}

/// How a search picks its best candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pick {
    /// Most containers meeting their targets over the window, then the highest total throughput (paper
    /// 002 section 5.2.1: "the one which met the individual application SLAs and yielded the maximum
    /// aggregate throughput").
    #[default]
    Throughput,
    /// The least total time any container spends below its target, then the highest throughput.
    Violation,
}

/// A variant's `search`: the variant stands for the best of a grid of static settings, each run as its
/// own variant (named `NAME[container=value,...]`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Search {
    /// Candidate memory-store weights per container (`0`: no cache, spec `none`); combinations that
    /// give the same partition (weights proportional within each VM) run once.
    #[serde(default)]
    pub cache_weights: BTreeMap<String, Vec<u32>>,
    /// Candidate memory limits per container, MiB (scaled); combinations whose limits in one VM add up
    /// to more than its memory are left out.
    #[serde(default)]
    pub memory_limit_mib: BTreeMap<String, Vec<f64>>,
    /// These containers' memory limits are what their VMs' memory leaves after the limits of
    /// `memory_limit_mib` (a split of each VM's memory), at most one container per VM; candidates that
    /// leave one nothing are left out. The file says `"NAME"` or `["NAME", ...]`.
    #[serde(default, deserialize_with = "one_or_many")]
    pub rest_of_memory: Vec<String>,
    #[serde(default)]
    pub pick: Pick,
    /// Window in which candidates are compared (emulated s, scaled); default the whole run.
    #[serde(default)]
    pub from_s: Option<f64>,
    #[serde(default)]
    pub to_s: Option<f64>,
}

impl Search {
    /// `containers`: every container's name with its VM's.
    pub(crate) fn validate(&self, p: &str, containers: &BTreeMap<String, String>) -> Result<(), LabError> {
        if self.cache_weights.is_empty() && self.memory_limit_mib.is_empty() {
            return Err(LabError::invalid(p, "a search needs cache_weights or memory_limit_mib"));
        }
        for (k, v) in &self.cache_weights {
            if !containers.contains_key(k) {
                return Err(LabError::invalid(&format!("{p}.cache_weights.{k}"), "no such container"));
            }
            if v.is_empty() {
                return Err(LabError::invalid(&format!("{p}.cache_weights.{k}"), "needs at least one value"));
            }
        }
        for (k, v) in &self.memory_limit_mib {
            if !containers.contains_key(k) {
                return Err(LabError::invalid(&format!("{p}.memory_limit_mib.{k}"), "no such container"));
            }
            if v.is_empty() || v.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                return Err(LabError::invalid(
                    &format!("{p}.memory_limit_mib.{k}"),
                    "needs at least one value, each positive",
                ));
            }
        }
        let mut vms_with_rest = HashSet::new();
        for r in &self.rest_of_memory {
            let Some(vm) = containers.get(r).filter(|_| !self.memory_limit_mib.contains_key(r)) else {
                return Err(LabError::invalid(
                    &format!("{p}.rest_of_memory"),
                    format!("{r}: must name a container without memory_limit_mib candidates"),
                ));
            };
            if !vms_with_rest.insert(vm) {
                return Err(LabError::invalid(
                    &format!("{p}.rest_of_memory"),
                    format!("{r}: at most one container per VM takes the rest of its memory"),
                ));
            }
        }
        let fin = |v: &Option<f64>| v.is_none_or(|x| x.is_finite() && x >= 0.0);
        if !fin(&self.from_s) || !fin(&self.to_s) {
            return Err(LabError::invalid(&format!("{p}.from_s"), "window bounds must be non-negative"));
        }
        let n: usize = self.cache_weights.values().map(Vec::len).product::<usize>()
            * self.memory_limit_mib.values().map(Vec::len).product::<usize>();
        if n > MAX_CANDIDATES {
            return Err(LabError::invalid(
                p,
                format!("expands to {n} candidates (at most {MAX_CANDIDATES})"),
            ));
        }
        Ok(())
    }

    pub(crate) fn scale(&mut self, k: f64) {
        for v in self.memory_limit_mib.values_mut() {
            for x in v {
                *x *= k;
            }
        }
        self.from_s = self.from_s.map(|x| x * k);
        self.to_s = self.to_s.map(|x| x * k);
    }
}

/// A name or a list of names.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The variants a searching variant stands for (see [`Search`]); `vm_memory` gives each container's
/// VM and that VM's memory (MiB), for leaving out over-committed limits. Each candidate is the variant
/// with the candidate's overrides on top and `search` cleared; its `search_of` names the variant.
pub fn expand(v: &Variant, vm_memory: &dyn Fn(&str) -> Option<(String, f64)>) -> Vec<Variant> {
    if v.search.is_none() {
        return vec![v.clone()];
    }
    candidates(v, vm_memory).into_iter().map(|(c, _)| c).collect()
}

/// A searching variant's candidates as [`expand`] gives them, each with the search narrowed to it: the
/// same `search` table with one value in each list, which expands to exactly that candidate (same name,
/// same overrides) and is scored as the full search scores it. `lab sweep` runs a search's candidates
/// as independent points this way (`crate::sweep`). Empty for a variant without a search.
pub fn candidates(v: &Variant, vm_memory: &dyn Fn(&str) -> Option<(String, f64)>) -> Vec<(Variant, Search)> {
    let Some(s) = &v.search else { return Vec::new() };
    // One dimension per (container, kind), in name order.
    let mut dims: Vec<(String, bool, usize)> = Vec::new();
    for (k, vals) in &s.cache_weights {
        dims.push((k.clone(), true, vals.len()));
    }
    for (k, vals) in &s.memory_limit_mib {
        dims.push((k.clone(), false, vals.len()));
    }
    let total: usize = dims.iter().map(|d| d.2).product();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for mut idx in 0..total {
        let mut pick = vec![0usize; dims.len()];
        for (d, slot) in dims.iter().zip(pick.iter_mut()).rev() {
            *slot = idx % d.2;
            idx /= d.2;
        }
        let weights: Vec<(&String, u32)> = dims
            .iter()
            .zip(&pick)
            .filter(|(d, _)| d.1)
            .map(|(d, &i)| (&d.0, s.cache_weights[&d.0][i]))
            .collect();
        let limits: Vec<(&String, f64)> = dims
            .iter()
            .zip(&pick)
            .filter(|(d, _)| !d.1)
            .map(|(d, &i)| (&d.0, s.memory_limit_mib[&d.0][i]))
            .collect();
        // Weights proportional within each VM are the same partition of its share: run it once.
        let vm_of = |c: &str| vm_memory(c).map(|(vm, _)| vm);
        let mut gcds: BTreeMap<Option<String>, u32> = BTreeMap::new();
        for (c, w) in &weights {
            let g = gcds.entry(vm_of(c)).or_insert(0);
            *g = gcd(*g, *w);
        }
        let key: (Vec<u32>, Vec<u64>) = (
            weights.iter().map(|(c, w)| w / gcds[&vm_of(c)].max(1)).collect(),
            limits.iter().map(|l| l.1.to_bits()).collect(),
        );
        if !seen.insert(key) {
            continue;
        }
        let mut per_vm: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for (c, mib) in &limits {
            if let Some((vm, mem)) = vm_memory(c) {
                let e = per_vm.entry(vm).or_insert((0.0, mem));
                e.0 += mib;
            }
        }
        if per_vm.values().any(|(sum, mem)| *sum > mem * (1.0 + 1e-9)) {
            continue;
        }
        // The rest of its VM's memory, for each container that takes it.
        let rest: Vec<(&String, f64)> = s
            .rest_of_memory
            .iter()
            .filter_map(|r| vm_memory(r).map(|(vm, mem)| (r, mem - per_vm.get(&vm).map_or(0.0, |e| e.0))))
            .collect();
        if rest.iter().any(|(_, left)| *left <= 0.0) {
            continue;
        }
        let mut c = v.clone();
        c.search = None;
        c.search_of = Some(v.name.clone());
        let mut parts = Vec::new();
        for (name, w) in &weights {
            let o = c.containers.entry((*name).clone()).or_default();
            o.cache = Some(if *w == 0 { Spec::None } else { Spec::Mem { weight: *w } });
            parts.push(format!("{name}={w}"));
        }
        for (name, mib) in limits.iter().copied().chain(rest) {
            let o = c.containers.entry(name.clone()).or_default();
            o.memory_limit_mib = Some(mib);
            parts.push(format!("{name}={mib}M"));
        }
        c.name = format!("{}[{}]", v.name, parts.join(","));
        let narrowed = Search {
            cache_weights: weights.iter().map(|(n, w)| ((*n).clone(), vec![*w])).collect(),
            memory_limit_mib: limits.iter().map(|(n, m)| ((*n).clone(), vec![*m])).collect(),
            ..s.clone()
        };
        out.push((c, narrowed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Containers `a`, `b` in `vm1` (100 MiB) and `c`, `d` in `vm2` (60 MiB).
    fn vm_memory(c: &str) -> Option<(String, f64)> {
        match c {
            "a" | "b" => Some(("vm1".into(), 100.0)),
            "c" | "d" => Some(("vm2".into(), 60.0)),
            _ => None,
        }
    }

    fn names(v: &Variant) -> Vec<String> {
        expand(v, &vm_memory).into_iter().map(|c| c.name).collect()
    }

    #[test]
    fn each_vm_gives_the_rest_of_its_memory_to_its_own_container() {
        let search: Search = toml::from_str(
            "memory_limit_mib = { a = [40, 100], c = [20, 50] }\nrest_of_memory = [\"b\", \"d\"]",
        )
        .unwrap();
        let v = Variant { name: "s".into(), search: Some(search), ..Default::default() };
        // a = 100 leaves b nothing: left out.
        assert_eq!(names(&v), ["s[a=40M,c=20M,b=60M,d=40M]", "s[a=40M,c=50M,b=60M,d=10M]"]);
        let one: Search = toml::from_str("memory_limit_mib = { a = [40] }\nrest_of_memory = \"b\"").unwrap();
        assert_eq!(one.rest_of_memory, ["b"], "one name reads as a list of one");
    }

    #[test]
    fn weights_proportional_within_each_vm_run_once() {
        let search: Search =
            toml::from_str("cache_weights = { a = [1, 2], b = [1, 2], c = [0, 1], d = [1, 3] }").unwrap();
        let v = Variant { name: "s".into(), search: Some(search), ..Default::default() };
        // vm1: 1:1 = 2:2, 1:2, 2:1; vm2: 0:1 = 0:3, 1:1, 1:3.
        assert_eq!(names(&v).len(), 3 * 3);
    }

    #[test]
    fn two_containers_of_one_vm_cannot_both_take_the_rest() {
        let vms: BTreeMap<String, String> =
            [("a", "vm1"), ("b", "vm1"), ("c", "vm2")].map(|(c, v)| (c.into(), v.into())).into();
        let bad: Search =
            toml::from_str("memory_limit_mib = { c = [8] }\nrest_of_memory = [\"a\", \"b\"]").unwrap();
        let e = bad.validate("variants[0].search", &vms).unwrap_err().to_string();
        assert!(e.contains("variants[0].search.rest_of_memory") && e.contains("one container per VM"), "{e}");
        let bad: Search = toml::from_str("memory_limit_mib = { c = [8] }\nrest_of_memory = \"c\"").unwrap();
        assert!(bad.validate("s", &vms).unwrap_err().to_string().contains("without memory_limit_mib"));
        let good: Search =
            toml::from_str("memory_limit_mib = { c = [8] }\nrest_of_memory = [\"a\"]").unwrap();
        good.validate("s", &vms).unwrap();
    }
}
