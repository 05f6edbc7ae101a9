//! `Scenario::validate`: every field checked, the error naming the first bad one with its path (e.g.
//! `vms[0].containers[1].memory_limit_mib`). The invariants it establishes are listed in the parent
//! module's documentation.

use super::workload::validate_workload;
use super::*;

impl Scenario {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), LabError> {
        let bad = |f: &str, m: &str| Err(LabError::invalid(f, m));
        let fin = |v: f64| v.is_finite() && v >= 0.0;
        if self.name.is_empty() {
            return bad("name", "must not be empty");
        }
        if !(self.duration_s.is_finite() && self.duration_s > 0.0) {
            return bad("duration_s", "must be a positive number");
        }
        if !(self.scale.is_finite() && self.scale > 0.0 && self.scale <= 100.0) {
            return bad("scale", "must be in (0, 100]");
        }
        if !(self.sample_interval_s.is_finite() && self.sample_interval_s > 0.0) {
            return bad("sample_interval_s", "must be positive");
        }
        if !fin(self.host.mem_capacity_mib) {
            return bad("host.mem_capacity_mib", "must be a non-negative number");
        }
        if !fin(self.host.ssd_capacity_mib) {
            return bad("host.ssd_capacity_mib", "must be a non-negative number");
        }
        if !(self.host.eviction_batch_mib.is_finite() && self.host.eviction_batch_mib > 0.0) {
            return bad("host.eviction_batch_mib", "must be positive");
        }
        if let Some(a) = self.host.disk.access_us {
            if !fin(a) {
                return bad("host.disk.access_us", "must be non-negative");
            }
        }
        if let Some(b) = self.host.disk.bandwidth_mib_s {
            if !(b.is_finite() && b > 0.0) {
                return bad("host.disk.bandwidth_mib_s", "must be positive");
            }
        }
        if self.guest.reclaim_batch_pages == 0 {
            return bad("guest.reclaim_batch_pages", "must be at least 1");
        }
        if self.vms.is_empty() {
            return bad("vms", "at least one VM is needed");
        }
        let mut vm_names = HashSet::new();
        let mut ct_names = HashSet::new();
        for (vi, vm) in self.vms.iter().enumerate() {
            let p = format!("vms[{vi}]");
            if vm.name.is_empty() || !vm_names.insert(vm.name.clone()) {
                return bad(&format!("{p}.name"), "must be non-empty and unique");
            }
            if vm.vcpus == 0 || vm.vcpus > 1024 {
                return bad(&format!("{p}.vcpus"), "must be in 1..=1024");
            }
            if !(vm.memory_mib.is_finite() && vm.memory_mib > 0.0) {
                return bad(&format!("{p}.memory_mib"), "must be positive");
            }
            for (ci, c) in vm.containers.iter().enumerate() {
                let p = format!("{p}.containers[{ci}]");
                if c.name.is_empty() || !ct_names.insert(c.name.clone()) || vm_names.contains(&c.name) {
                    return bad(
                        &format!("{p}.name"),
                        "must be non-empty and unique among VMs and containers",
                    );
                }
                if let Some(l) = c.memory_limit_mib {
                    if !(l.is_finite() && l > 0.0) {
                        return bad(&format!("{p}.memory_limit_mib"), "must be positive");
                    }
                }
                if let Some(l) = c.soft_limit_mib {
                    if !fin(l) {
                        return bad(&format!("{p}.soft_limit_mib"), "must be non-negative");
                    }
                }
                if !(1..=10_000).contains(&c.io_weight) {
                    return bad(&format!("{p}.io_weight"), "must be in 1..=10000");
                }
                if !fin(c.start_s) {
                    return bad(&format!("{p}.start_s"), "must be non-negative");
                }
                if let Some(s) = c.stop_s {
                    if !(s.is_finite() && s > c.start_s) {
                        return bad(&format!("{p}.stop_s"), "must be after start_s");
                    }
                }
                validate_workload(&c.workload, &format!("{p}.workload"))?;
            }
            let names: Vec<&str> = vm.containers.iter().map(|c| c.name.as_str()).collect();
            if let Some(m) = &vm.memctl {
                m.validate(&format!("{p}.memctl"), &names)?;
            }
            if let Some(pr) = &vm.provision {
                pr.validate(&format!("{p}.provision"), &names)?;
            }
        }
        for (i, e) in self.timeline.iter().enumerate() {
            let p = format!("timeline[{i}]");
            if !fin(e.at_s()) {
                return bad(&format!("{p}.at_s"), "must be non-negative");
            }
            match e {
                Event::Start { container, .. }
                | Event::Stop { container, .. }
                | Event::SetCache { container, .. } => {
                    if !ct_names.contains(container) {
                        return bad(&format!("{p}.container"), "no such container");
                    }
                }
                Event::SetVmWeights { vm, mem, ssd, .. } => {
                    if !vm_names.contains(vm) {
                        return bad(&format!("{p}.vm"), "no such VM");
                    }
                    if mem.is_none() && ssd.is_none() {
                        return bad(&format!("{p}.mem"), "give `mem`, `ssd` or both");
                    }
                }
                Event::Balloon { vm, memory_mib, over_s, .. } => {
                    if !vm_names.contains(vm) {
                        return bad(&format!("{p}.vm"), "no such VM");
                    }
                    if !(memory_mib.is_finite() && *memory_mib > 0.0) {
                        return bad(&format!("{p}.memory_mib"), "must be positive");
                    }
                    if !fin(*over_s) {
                        return bad(&format!("{p}.over_s"), "must be non-negative");
                    }
                }
                Event::SetCapacity { mib, .. } => {
                    if !fin(*mib) {
                        return bad(&format!("{p}.mib"), "must be non-negative");
                    }
                }
                Event::SetMemoryLimit { container, mib, .. } => {
                    if !ct_names.contains(container) {
                        return bad(&format!("{p}.container"), "no such container");
                    }
                    if mib.is_some_and(|m| !(m.is_finite() && m > 0.0)) {
                        return bad(&format!("{p}.mib"), "must be positive");
                    }
                }
                Event::SetMode { .. } => {}
                Event::WorkingSet { container, fraction, offset, .. } => {
                    let Some((_, _, c)) = self.containers().find(|(_, _, c)| &c.name == container) else {
                        return bad(&format!("{p}.container"), "no such container");
                    };
                    let windowed = matches!(
                        c.workload,
                        Workload::Webserver { .. }
                            | Workload::Webproxy { .. }
                            | Workload::Varmail { .. }
                            | Workload::Kv { .. }
                            | Workload::Ycsb { .. }
                    );
                    if !windowed {
                        return bad(&format!("{p}.container"), "its workload has no working set to window");
                    }
                    if !(*fraction > 0.0 && *fraction <= 1.0) {
                        return bad(&format!("{p}.fraction"), "must be in (0, 1]");
                    }
                    if !(*offset >= 0.0 && *offset < 1.0) {
                        return bad(&format!("{p}.offset"), "must be in [0, 1)");
                    }
                }
            }
        }
        let mut var_names = HashSet::new();
        for (i, v) in self.variants.iter().enumerate() {
            let p = format!("variants[{i}]");
            if v.name.is_empty() || !var_names.insert(v.name.clone()) {
                return bad(&format!("{p}.name"), "must be non-empty and unique");
            }
            for k in v.containers.keys() {
                if !ct_names.contains(k) {
                    return bad(&format!("{p}.containers.{k}"), "no such container");
                }
            }
            for k in v.vm_memory_mib.keys() {
                if !vm_names.contains(k) {
                    return bad(&format!("{p}.vm_memory_mib.{k}"), "no such VM");
                }
            }
            for (k, o) in &v.memctl {
                if !self.vms.iter().any(|vm| &vm.name == k && vm.memctl.is_some()) {
                    return bad(&format!("{p}.memctl.{k}"), "no such VM with a [vms.memctl] table");
                }
                if o.chunk_cap_mib.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                    return bad(&format!("{p}.memctl.{k}.chunk_cap_mib"), "must be positive");
                }
            }
            for k in v.provision.keys() {
                if !self.vms.iter().any(|vm| &vm.name == k && vm.provision.is_some()) {
                    return bad(&format!("{p}.provision.{k}"), "no such VM with a [vms.provision] table");
                }
            }
            if let Some(s) = &v.search {
                let vm_of: BTreeMap<String, String> =
                    self.containers().map(|(_, vm, c)| (c.name.clone(), vm.name.clone())).collect();
                s.validate(&format!("{p}.search"), &vm_of)?;
            }
        }
        let targeted: HashSet<String> = self
            .containers()
            .filter(|(_, _, c)| c.target.is_some())
            .map(|(_, _, c)| c.name.clone())
            .collect();
        let names = checks::Names {
            containers: &ct_names,
            vms: &vm_names,
            variants: &var_names,
            targeted: &targeted,
        };
        for (i, c) in self.checks.iter().enumerate() {
            let p = format!("checks[{i}]");
            if c.name.is_empty() {
                return bad(&format!("{p}.name"), "must not be empty");
            }
            c.kind.spec().validate(&p, &names)?;
        }
        Ok(())
    }
}
