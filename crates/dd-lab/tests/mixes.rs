//! The generator of VM mixes and its harness (issue 27): deterministic generation, valid scenarios with
//! sizes in their documented ranges, case files that read back to the same scenario, and one mix run
//! end to end at a tiny scale.

use dd_lab::mixes::{self, MixOptions};
use dd_lab::scenario::mixgen::{self, MixConfig, MixKind, STATIC};
use dd_lab::scenario::Workload;
use dd_lab::Scenario;

fn cfg() -> MixConfig {
    MixConfig::default()
}

#[test]
fn the_same_seed_gives_the_same_mix_and_different_seeds_differ() {
    let mixes: Vec<_> = (1..=30).map(|s| mixgen::generate(s, &cfg()).unwrap()).collect();
    for (i, m) in mixes.iter().enumerate() {
        assert_eq!(m, &mixgen::generate(i as u64 + 1, &cfg()).unwrap(), "seed {}", i + 1);
        for other in &mixes[i + 1..] {
            assert_ne!(m.scenario.vms, other.scenario.vms, "seeds {} and {}", m.seed, other.seed);
        }
    }
}

#[test]
fn every_mix_validates_and_reads_back_from_its_case_file() {
    let knobs = [
        cfg(),
        MixConfig { min_vms: 2, max_vms: 2, ..cfg() },
        MixConfig { min_containers: 5, max_containers: 5, min_vms: 1, max_vms: 1, ..cfg() },
        MixConfig { min_containers: 2, max_containers: 2, min_vms: 1, max_vms: 2, scale: 0.1, ..cfg() },
    ];
    for k in &knobs {
        for seed in 1..=25 {
            let m = mixgen::generate(seed, k).unwrap();
            m.scenario.validate().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let text = mixgen::case_toml(&m.scenario).unwrap();
            let back = Scenario::from_toml(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
            assert_eq!(back, m.scenario, "seed {seed}");
            assert!(!text.contains("decision"), "the provisioner's defaults are not pinned:\n{text}");
        }
    }
}

#[test]
fn sizes_threads_and_the_grid_are_in_their_documented_ranges() {
    let c = cfg();
    let (mut two_vms, mut kinds) = (0, std::collections::BTreeSet::new());
    for seed in 1..=60 {
        let m = mixgen::generate(seed, &c).unwrap();
        let sc = &m.scenario;
        assert!((c.min_vms..=c.max_vms).contains(&sc.vms.len()), "seed {seed}");
        assert!((c.min_containers..=c.max_containers).contains(&m.containers.len()), "seed {seed}");
        two_vms += usize::from(sc.vms.len() == 2);
        let cache = sc.host.mem_capacity_mib;
        assert!(mixgen::CACHE_MIB.contains(&cache) && cache % 32.0 == 0.0, "seed {seed}: cache {cache}");
        let share = cache / sc.vms.len() as f64;
        for vm in &sc.vms {
            assert!(!vm.containers.is_empty(), "seed {seed}: {} has no container", vm.name);
            let mem = vm.memory_mib;
            assert!(mixgen::VM_MEMORY_MIB.contains(&mem) && mem % 64.0 == 0.0, "seed {seed}: memory {mem}");
            let sets: Vec<f64> =
                m.containers.iter().filter(|x| x.vm == vm.name).map(|x| x.working_set_mib).collect();
            let sum: f64 = sets.iter().sum();
            // Rounding to whole MiB loses at most half a MiB per container.
            let low = (mem + share) * mixgen::OVERCOMMIT.start() - 0.5 * sets.len() as f64;
            assert!(sum >= low, "seed {seed}: {} working sets {sum} MiB under {low}", vm.name);
            assert!(
                sum <= (mem + share) * mixgen::OVERCOMMIT.end()
                    + mixgen::MIN_WORKING_SET_MIB * sets.len() as f64
            );
            assert!(vm.provision.as_ref().is_some_and(|p| !p.enabled), "off but for the provisioner variant");
        }
        for (x, (_, _, ct)) in m.containers.iter().zip(sc.containers()) {
            assert_eq!(x.name, ct.name);
            kinds.insert(x.kind);
            assert!(x.working_set_mib >= mixgen::MIN_WORKING_SET_MIB, "seed {seed}: {x:?}");
            assert!(mixgen::THREADS.contains(&x.nthreads), "seed {seed}: {x:?}");
            let threads = match &ct.workload {
                Workload::Kv { nthreads, .. }
                | Workload::Ycsb { nthreads, .. }
                | Workload::Webserver { nthreads, .. }
                | Workload::Webproxy { nthreads, .. }
                | Workload::Varmail { nthreads, .. } => *nthreads,
                w => panic!("seed {seed}: a kind the generator does not draw: {w:?}"),
            };
            assert_eq!(threads, x.nthreads);
            assert!(ct.target.is_none(), "targets come from the sweep");
        }
        // Every container is in the search; at most the bound of candidates, at least two.
        let search = sc.variants.iter().find(|v| v.name == STATIC).and_then(|v| v.search.as_ref()).unwrap();
        for x in &m.containers {
            assert!(
                search.cache_weights.contains_key(&x.name),
                "seed {seed}: {} has no cache weight",
                x.name
            );
            let rest = search.rest_of_memory.contains(&x.name);
            assert!(rest != search.memory_limit_mib.contains_key(&x.name), "seed {seed}: {} limit", x.name);
            if !x.kind.reads_files() {
                assert_eq!(
                    search.cache_weights[&x.name],
                    [0],
                    "seed {seed}: anonymous memory needs no cache"
                );
            }
        }
        assert_eq!(search.rest_of_memory.len(), sc.vms.len(), "one container per VM takes the rest");
        let n = mixgen::candidates(sc);
        assert!((2..=c.max_candidates).contains(&n), "seed {seed}: {n} candidates");
    }
    assert!((10..=50).contains(&two_vms), "about half the mixes have two VMs: {two_vms} of 60");
    assert_eq!(kinds.len(), MixKind::ALL.len(), "every kind is drawn: {kinds:?}");
}

#[test]
fn one_mix_end_to_end_at_a_tiny_scale() {
    let opts = MixOptions {
        generator: MixConfig { scale: 0.01, max_candidates: 6, ..cfg() },
        jobs: Some(2),
        ..Default::default()
    };
    let mut last = 0.0;
    let run = mixes::run_mix(3, &opts, &mut |f| {
        assert!(f >= last - 1e-9 && f <= 1.0 + 1e-9, "progress goes forward: {f} after {last}");
        last = f;
    })
    .unwrap();
    let o = &run.outcome;
    assert_eq!(last, 1.0);
    assert_eq!(o.containers.len(), run.scenario.containers().count());
    assert!(o.candidates >= 2 && o.candidates <= 6, "{o:#?}");
    assert!(o.targets > 0, "{o:#?}");
    // A static allocation meets every target by construction, so the best static one does.
    assert!(o.feasible(), "{o:#?}");
    assert_eq!(o.static_met, o.targets);
    for c in &o.containers {
        let t = c.target_ops_s.unwrap_or(0.0);
        assert!(c.static_ops_s >= t, "{c:?}");
        assert!(c.static_met && (c.provisioner_met == (c.provisioner_ops_s >= t)), "{c:?}");
    }
    let sum: f64 = o.containers.iter().map(|c| c.provisioner_ops_s).sum();
    assert!((sum - o.provisioner_total_ops_s).abs() < 0.01 && o.total_ratio > 0.0, "{o:#?}");
    // The case file carries the targets and runs the same two variants.
    let targeted: Vec<_> = run.scenario.containers().filter(|(_, _, c)| c.target.is_some()).collect();
    assert_eq!(targeted.len(), o.targets);
    let v = mixes::verdicts(std::slice::from_ref(o));
    assert_eq!((v.mixes, v.feasible), (1, 1));
    assert_eq!(v.missed, o.missed().count());
    let md = mixes::markdown(std::slice::from_ref(o), &v);
    assert!(md.contains("| 3 |") && md.contains("feasible mixes"), "{md}");
    let csv = mixes::csv(std::slice::from_ref(o)).unwrap();
    assert_eq!(csv.lines().count(), 1 + o.containers.len());
    // The same outcome one variant at a time.
    let one = MixOptions { jobs: Some(1), ..opts };
    assert_eq!(&mixes::run_mix(3, &one, &mut |_| {}).unwrap().outcome, o);
}

#[test]
fn a_miss_is_reported_by_a_decisions_missed_or_infeasible_list() {
    use dd_lab::sim::Decision;
    use dd_provision::Source;
    let d = |t_s: f64, infeasible: &[&str], missed: &[&str]| Decision {
        t_s,
        vm: "vm1".into(),
        feasible: infeasible.is_empty() && missed.is_empty(),
        infeasible: infeasible.iter().map(|s| s.to_string()).collect(),
        missed: missed.iter().map(|s| s.to_string()).collect(),
        kept_current: false,
        source: Source::Model,
        containers: Vec::new(),
    };
    let ds = [d(1.0, &["early"], &["early2"]), d(5.0, &["a"], &["b"]), d(6.0, &[], &[])];
    let got = mixes::reported_misses(&ds, 5.0);
    assert_eq!(got.into_iter().collect::<Vec<_>>(), ["a", "b"], "only decisions in the window count");
}
