//! Building one container of the emulator from its scenario entry: its random stream, its objects
//! (files, anonymous memory, a store's heap and data file) in the emulator's object table, and the
//! workload's parameters (`Kind`).

use super::{ns, Anon, Ct, CtTotals, Kind, Sim, NS};
use crate::error::LabError;
use crate::model::kvstore::{Store, StoreKind as Db};
use crate::model::workload::{
    gamma_pages, objects_needed, thread_roles, Fileset, OpenTrace, Trace, TraceLoad,
};
use crate::scenario::{mib_pages, Container, Workload};
use crate::sim::backend::SecondChance;
use dd_engine::Counters;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

impl<B: SecondChance> Sim<B> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn build_ct(
        c: &Container,
        vm: usize,
        cg: usize,
        enabled: bool,
        seed: u64,
        idx: usize,
        next_obj: &mut u64,
        size: &mut Vec<u32>,
        gen: &mut Vec<u32>,
        load_trace: OpenTrace<'_>,
    ) -> Result<Ct, LabError> {
        // Each container has its own random stream: adding a container does not perturb the others.
        let mut rng =
            ChaCha8Rng::seed_from_u64(seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(idx as u64 + 1)));
        let trace = match &c.workload {
            Workload::Trace { path, format, ignore_obj_size, max_requests, .. } => {
                let how = TraceLoad {
                    format: *format,
                    ignore_obj_size: *ignore_obj_size,
                    max_requests: *max_requests,
                };
                Some(Arc::new(Trace::load(load_trace(path)?, path, how)?))
            }
            _ => None,
        };
        let nobj = objects_needed(&c.workload, trace.as_deref());
        let first = *next_obj as u32;
        *next_obj += nobj;
        let mut fs = Vec::new();
        let mut log_obj = 0;
        let mut anon = None;
        let mut store = None;
        let kind = match &c.workload {
            Workload::Webserver { nfiles, filesize_kib, appendsize_kib, selection, .. }
            | Workload::Webproxy { nfiles, filesize_kib, appendsize_kib, selection, .. }
            | Workload::Varmail { nfiles, filesize_kib, appendsize_kib, selection, .. } => {
                for _ in 0..*nfiles {
                    size.push(gamma_pages(&mut rng, *filesize_kib));
                    gen.push(1);
                }
                fs.push(Fileset::new(first, *nfiles as u32, *selection));
                match &c.workload {
                    Workload::Webserver { .. } => {
                        log_obj = first + *nfiles as u32;
                        size.push(0);
                        gen.push(1);
                        Kind::Web { append_kib: *appendsize_kib }
                    }
                    Workload::Webproxy { .. } => Kind::Proxy { append_kib: *appendsize_kib },
                    _ => Kind::Mail { append_kib: *appendsize_kib },
                }
            }
            Workload::Videoserver {
                numactivevids,
                numpassivevids,
                filesize_mib,
                readiosize_kib,
                writeiosize_kib,
                repint_s,
                read_limit_mib_s,
                selection,
                ..
            } => {
                let fp = mib_pages(*filesize_mib).clamp(1, u32::MAX as u64 / 2) as u32;
                for _ in 0..(numactivevids + numpassivevids) {
                    size.push(fp);
                    gen.push(1);
                }
                fs.push(Fileset::new(first, *numactivevids as u32, *selection));
                fs.push(Fileset::new(
                    first + *numactivevids as u32,
                    *numpassivevids as u32,
                    crate::scenario::Selection::InOrder,
                ));
                Kind::Video {
                    read_pages: ((readiosize_kib * 1024.0 / 4096.0).ceil() as u32).max(1),
                    write_pages: ((writeiosize_kib * 1024.0 / 4096.0).ceil() as u32).max(1),
                    repint_ns: ns(*repint_s),
                    file_pages: fp,
                    read_page_ns: if *read_limit_mib_s > 0.0 {
                        (NS / (read_limit_mib_s * 256.0)) as u64
                    } else {
                        0
                    },
                }
            }
            Workload::Kv { dataset_mib, write_fraction, .. } => {
                let pages = mib_pages(*dataset_mib).clamp(1, u32::MAX as u64 / 2) as usize;
                size.push(pages as u32);
                gen.push(0);
                anon = Some(Anon { object: first, ver: vec![0; pages], swapped: vec![false; pages] });
                Kind::Kv { pages: pages as u32, write_fraction: *write_fraction }
            }
            Workload::Ycsb { store: sk, preload, .. } => {
                let st = Store::of_workload(&c.workload).expect("a ycsb workload runs a store");
                // The heap (object `first`) and then the data file, as the store has them.
                if matches!(sk, Db::Redis | Db::Mysql) {
                    let n = st.heap_pages();
                    size.push(n);
                    gen.push(0);
                    let n = n as usize;
                    anon = Some(Anon { object: first, ver: vec![0; n], swapped: vec![false; n] });
                }
                if matches!(sk, Db::Mongo | Db::Mysql) {
                    // The data file grows as records are loaded and inserted (or holds them already).
                    size.push(st.initial_file_pages(*preload));
                    gen.push(1);
                }
                store = Some(Box::new(st));
                Kind::Ycsb
            }
            Workload::Trace { repeat, .. } => {
                let t = trace.as_ref().map_or(0, |t| t.objects);
                for _ in 0..t {
                    size.push(0);
                    gen.push(0);
                }
                Kind::Trace { repeat: *repeat }
            }
        };
        let roles = thread_roles(&c.workload);
        Ok(Ct {
            name: c.name.clone(),
            vm,
            cg,
            enabled,
            spec: c.cache,
            order: c.cache_order,
            swap_spec: c.swap_cache,
            pool: None,
            swap_pool: None,
            running: false,
            epoch: 0,
            kind,
            initial_roles: roles.clone(),
            roles,
            fs,
            log_obj,
            first_obj: first,
            anon,
            store,
            trace,
            rng,
            tot: CtTotals::default(),
            retired: Counters::default(),
            last: Counters::default(),
            last_tot: CtTotals::default(),
            started_at: None,
            bw_next: 0,
            kv_window: None,
        })
    }
}
