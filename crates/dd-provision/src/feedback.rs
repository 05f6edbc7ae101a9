//! The closed loop around the model (issue 27): what each interval measured corrects what the next
//! decision predicts, a measured allocation is never given up for a worse prediction, and a target the
//! containers keep missing is reported, never hidden behind a prediction that says it is met.
//!
//! [`Controller`] keeps, per container, what it measured at every allocation it ran with (an average per
//! allocation, newest weighted by `smoothing`) and a correction of the model (the geometric mean of
//! measured over predicted throughput at the allocations it ran). A decision ([`Controller::decide`]):
//!
//! 1. records the last interval's measurement under the allocation applied last, unless that interval
//!    was the transient of a change (after a change, and after a start someone chose, until every
//!    container's throughput moved by at most `min_gain` from one interval to the next, or for at most
//!    `max_settle_intervals`; after a start no one chose, one interval): then the plan stays
//!    (`settling`) and nothing is recorded. Nor is the interval of a container still filling the memory
//!    limits gave it (what it holds grows, its throughput does not fall, it still misses): it measured
//!    the fill, not the allocation, and no plan takes that memory from it (for at most
//!    `max_fill_intervals` decisions in a row; a slow fill from the disk looks like an allocation that
//!    fails, and taking its memory makes it one). Nor is the interval of a container ending its first
//!    pass over its data (its first references more than `first_pass_time_share` of its time, and their
//!    share falling by more than `first_pass_floor_drop` since the last decision): it waits as a filling
//!    one does, its target is not judged infeasible, and no joint allocation is recorded meanwhile;
//! 2. predicts every allocation the programme considers through [`Controller`]'s adjustment: an
//!    allocation measured before predicts what was measured; any other predicts the model's throughput
//!    times the correction, never above what an allocation at least as large in every resource measured
//!    (performance does not fall with more memory), never below what one at most as large measured
//!    (both only from allocations measured in two intervals or more), and never above the container's
//!    ceiling (its threads with every page in memory, its client's rate);
//! 3. anchors the programme at the best joint allocation measured (most targets met, then the highest
//!    objective; the current one while it is within the noise of the best) and lets it move each
//!    container at most `max_step_units` of each resource from there (Cliffhanger's bounded climbing on
//!    measured gradients, with the model choosing the direction);
//! 4. changes the plan only when the programme's plan is predicted to meet more targets than the
//!    anchor measured, or as many and an objective higher by more than `min_gain` (so two plans within
//!    the noise never alternate); the unbounded programme's plan replaces the bounded one when it is
//!    predicted to meet more targets than both it and the anchor, was never measured and shrinks no
//!    container's anonymous memory (a cliff that bounded steps cannot cross: a loop whose near side
//!    gains nothing); otherwise, when a container measures below its throughput target, it
//!    tries a step sized by the shortfall (`crate::shortfall`), else a small exploration step, else it
//!    goes back to, or stays on, the anchor (the shortfall's step, the exploration and the jump take
//!    memory only from containers without anonymous memory: a guess that makes one swap costs tens of
//!    seconds of swap-ins on the shared disk, everyone's reads queued behind them). Plans that measure
//!    worse than the anchor count as failed explorations; after `max_failed_explorations` in a row the
//!    loop rests on the anchor for `rest_intervals`.
//!
//! Reports ([`ContainerStatus`]): a target measured below for `report_after` intervals in a row is
//! `missed`, with what was predicted and measured; `infeasible` means no allocation measured within
//! today's budget met it and none the model predicts does (the report carries the best of each).
//! Allocations not measured again for `max_age_intervals` decisions are forgotten (working sets move). Containers not yet measured are
//! `learning`: while any is, nothing changes (the first decision of a run waits for data instead of
//! planning from empty curves).
//!
//! Invariants: deterministic (no clock, no randomness; the same inputs and measurements give the same
//! decisions); memory bounded by `max_points` measured allocations per container and as many joint ones;
//! a container that leaves forgets nothing the others need (histories are by name).

use crate::config::ProvisionConfig;
use crate::error::ProvisionError;
use crate::model::{ContainerInput, LatencyModel, Model, Prediction, Target};
use crate::plan::{floor_units, grid, solve, Allocation, Budget, Plan, Steer};
use crate::shortfall::{seek as seek_shortfall, Seek};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a container did over the last interval, under the allocation applied last.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    pub ops_s: f64,
    pub latency_ms: f64,
    /// Fraction of file reads served from memory or the cache.
    pub hit_ratio: f64,
}

impl Measured {
    fn meets(&self, t: &Target) -> bool {
        t.met_by_measured(self.ops_s, self.latency_ms, self.hit_ratio)
    }
}

/// Where a decision's plan came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A container has no measurement yet: nothing changes (no plan on the first decision).
    Learning,
    /// The programme's plan, predicted better than every allocation measured.
    Model,
    /// Back to the best allocation measured, which the current one does worse than.
    BestMeasured,
    /// The plan just applied, kept while its transient passes (its measurements are discarded).
    Settling,
    /// The current allocation, as good as anything predicted within the noise.
    Kept,
    /// A step from the best allocation measured to one not measured yet, which the measurements say
    /// could beat it (see [`Controller`]'s module doc).
    Explore,
}

/// How a container stands against its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetState {
    /// No target.
    None,
    /// Not measured yet.
    Learning,
    /// Met in the last interval measured.
    Met,
    /// Measured below its target in the last interval, for fewer than `report_after` in a row (not
    /// reported yet: one interval's dip after a change is not a miss).
    Below,
    /// Measured below its target for `missed_intervals` in a row.
    Missed,
    /// No allocation measured met it and no allocation the model predicts does.
    Infeasible,
}

/// One container in a [`Decision`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub name: String,
    pub state: TargetState,
    /// Intervals in a row its measurement missed the target.
    pub missed_intervals: u32,
    /// The last interval.
    pub measured_ops_s: Option<f64>,
    /// What the plan is expected to give.
    pub predicted_ops_s: Option<f64>,
    /// The best it measured at any allocation, and the most any allocation is predicted to give it.
    pub best_measured_ops_s: Option<f64>,
    pub best_predicted_ops_s: Option<f64>,
    /// Measured over predicted throughput at the allocations it ran (1: the model was right).
    pub correction: f64,
}

/// A decision of the closed loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// What to apply; `None` while the first decision waits for measurements.
    pub plan: Option<Plan>,
    pub source: Source,
    pub containers: Vec<ContainerStatus>,
}

impl Decision {
    /// Containers whose target is reported missed.
    pub fn missed(&self) -> Vec<String> {
        self.containers.iter().filter(|c| c.state == TargetState::Missed).map(|c| c.name.clone()).collect()
    }
}

/// A measured allocation of one container.
#[derive(Debug, Clone, Copy)]
struct Point {
    alloc: Allocation,
    m: Measured,
    /// Decision that last measured it (the oldest go first).
    seen: u64,
    /// Intervals it was measured in.
    n: u32,
}

#[derive(Debug, Clone, Default)]
struct History {
    points: Vec<Point>,
    /// ln(measured / model) averaged over the intervals measured.
    log_correction: f64,
    missed_for: u32,
    last: Option<Measured>,
    /// Pages it held (memory and cache) at the last decision.
    last_held: Option<f64>,
    /// Decisions in a row it was filling its allocation.
    filling_for: u32,
    /// Its file curve's miss ratio at its largest size at the last decision (its share of first
    /// references), and whether it was ending its first pass then.
    last_floor: Option<f64>,
    first_pass: bool,
}

impl History {
    /// The most an allocation can do as far as this container's measurements know: what an allocation
    /// at least as large measured (in two intervals or more; one may be a transient), with `gain` of
    /// noise; infinite where none was.
    fn measured_cap(&self, a: &Allocation, tol: [f64; 3], gain: f64) -> f64 {
        self.points
            .iter()
            .filter(|p| p.n >= 2 && covers(&p.alloc, a, tol))
            .map(|p| p.m.ops_s * (1.0 + gain))
            .fold(f64::INFINITY, f64::min)
    }
}

/// Growth of what a container holds (memory and cache) from one decision to the next above which it is
/// still filling its allocation: above the jitter of a full container's page cache (writes, frees) and
/// below what a fill from the disk adds in an interval (a few per cent of its allocation).
const FILL_GROWTH: f64 = 0.01;

/// One container's share of the plan applied last.
#[derive(Debug, Clone)]
struct Applied {
    names: Vec<String>,
    alloc: Vec<Allocation>,
    /// Whether it was an exploration (a plan not measured before).
    explore: bool,
    /// Measured score of the anchor it left (for judging the exploration).
    anchor_score: Option<(u32, f64)>,
    /// Intervals it may still be kept settling (a change's transient: caches filling, pages read back
    /// in); 0: its measurements count.
    settle: u32,
    /// Each container's throughput in the last interval under it, while settling.
    last_ops: Vec<Option<f64>>,
    /// Whether its memory was given by limits (a plan of the loop, a chosen start), not taken without.
    limited: bool,
}

/// The closed-loop provisioner of one VM (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Controller {
    cts: BTreeMap<String, History>,
    /// Joint allocations measured, by container names (in input order), newest last.
    tried: Vec<(Vec<String>, Vec<Allocation>, u64)>,
    applied: Option<Applied>,
    failed: u32,
    rest_until: u64,
    round: u64,
}

/// Two allocations are the same point when every resource is within `tol` pages.
fn near(a: &Allocation, b: &Allocation, tol: [f64; 3]) -> bool {
    let d = |x: u64, y: u64| (x as f64 - y as f64).abs();
    d(a.memory_pages, b.memory_pages) <= tol[0]
        && d(a.mem_cache_pages, b.mem_cache_pages) <= tol[1]
        && d(a.ssd_cache_pages, b.ssd_cache_pages) <= tol[2]
}

/// Every resource of `a` is at least `b`'s, within `tol`.
fn covers(a: &Allocation, b: &Allocation, tol: [f64; 3]) -> bool {
    a.memory_pages as f64 + tol[0] >= b.memory_pages as f64
        && a.mem_cache_pages as f64 + tol[1] >= b.mem_cache_pages as f64
        && a.ssd_cache_pages as f64 + tol[2] >= b.ssd_cache_pages as f64
}

fn alloc_of(pages: [f64; 3]) -> Allocation {
    Allocation {
        memory_pages: pages[0].max(0.0) as u64,
        mem_cache_pages: pages[1].max(0.0) as u64,
        ssd_cache_pages: pages[2].max(0.0) as u64,
    }
}

impl Controller {
    pub fn new() -> Controller {
        Controller::default()
    }

    /// Whether the joint allocation `cand` of the containers `names` was measured already.
    fn was_tried(&self, names: &[String], cand: &[Allocation], tol: [f64; 3]) -> bool {
        self.tried.iter().any(|t| t.0 == names && t.1.iter().zip(cand).all(|(x, y)| near(x, y, tol)))
    }

    /// The plan returned last was not applied (a dry run): the next measurement is not of it.
    pub fn not_applied(&mut self) {
        self.applied = None;
    }

    /// What the containers run with now when no plan of this controller is in force (before its first
    /// decision, or after [`Controller::not_applied`]): the next measurement is recorded as this
    /// allocation's, so the allocation a run started with is one the loop can come back to.
    ///
    /// `chosen`: whether someone chose it (memory limits set). A chosen allocation is measured as a change
    /// of the loop's own is, after its transient (until every container's throughput stops moving, at
    /// most `max_settle_intervals`): a container whose heap the start swapped out climbs back for
    /// several intervals, and judged on its first it looks like an allocation that fails. What
    /// containers took without limits is no one's choice: it is measured after one interval.
    pub fn in_force(&mut self, names: &[String], alloc: &[Allocation], chosen: bool) {
        if self.applied.is_none() && names.len() == alloc.len() {
            self.applied = Some(Applied {
                names: names.to_vec(),
                alloc: alloc.to_vec(),
                explore: false,
                anchor_score: None,
                // (`decide` bounds it by `max_settle_intervals`.)
                settle: if chosen { u32::MAX } else { 1 },
                last_ops: Vec::new(),
                limited: chosen,
            });
        }
    }

    /// Decides the next plan from the containers' inputs and what each measured over the last interval
    /// (`None`: not measured yet). The returned plan is taken as applied (see [`Controller::not_applied`]).
    pub fn decide(
        &mut self,
        inputs: &[ContainerInput],
        measured: &[Option<Measured>],
        lat: &LatencyModel,
        budget: &Budget,
        cfg: &ProvisionConfig,
    ) -> Result<Decision, ProvisionError> {
        cfg.validate()?;
        if measured.len() != inputs.len() {
            return Err(ProvisionError::invalid("measured", "one measurement (or none) per container"));
        }
        let fb = cfg.feedback;
        self.round += 1;
        let names: Vec<String> = inputs.iter().map(|c| c.name.clone()).collect();
        // Half a unit of each resource: allocations closer than that are one point.
        let k = cfg.steps as f64;
        let tol = [
            (budget.memory_pages as f64 / k / 2.0).max(1.0),
            (budget.mem_cache_pages as f64 / k / 2.0).max(1.0),
            (budget.ssd_cache_pages as f64 / k / 2.0).max(1.0),
        ];
        // Every container keeps a unit of memory (and its own floor).
        let unit_pages = (budget.memory_pages / cfg.steps.max(1) as u64) * fb.min_memory_units as u64;
        let floors_fit = unit_pages * inputs.len() as u64 <= budget.memory_pages;
        // A container filling the memory limits gave it (what it holds in memory and cache grew by more
        // than `FILL_GROWTH` since the last decision, its throughput did not fall and it still misses)
        // measures the fill, not its allocation: its measurement is not recorded, and no plan takes
        // memory from it, for at most `max_fill_intervals` decisions in a row. Memory a container took
        // without a limit (a start no one chose) is no one's gift: it gets no such floor.
        let held = |c: &ContainerInput| {
            c.observed.map(|o| o.file_pages + o.anon_pages + o.mem_cache_pages + o.ssd_cache_pages)
        };
        let given: Vec<Option<u64>> = inputs
            .iter()
            .map(|c| {
                let ap = self.applied.as_ref().filter(|a| a.limited)?;
                let j = ap.names.iter().position(|x| *x == c.name)?;
                Some(ap.alloc[j].memory_pages)
            })
            .collect();
        // Per container: whether it is filling, and whether the loop still waits for it (the count stays
        // at its bound while the fill goes on: a fill that outlasts it is then measured).
        let (filling, waited): (Vec<bool>, Vec<bool>) = inputs
            .iter()
            .zip(measured)
            .zip(&given)
            .map(|((c, m), g)| {
                let Some(h) = self.cts.get(&c.name) else { return (false, false) };
                let filling = match (h.last, h.last_held, m, held(c), g) {
                    (Some(p), Some(ph), Some(m), Some(now), Some(_)) => {
                        m.ops_s >= p.ops_s * (1.0 - fb.min_gain)
                            && m.hit_ratio < 1.0
                            && now > ph * (1.0 + FILL_GROWTH) + 1.0
                    }
                    _ => false,
                };
                (filling, filling && h.filling_for < fb.max_fill_intervals)
            })
            .unzip();
        // Per container: whether it is ending its first pass over its data (first references a large
        // part of its time, and a share of its references that falls fast: its data is coming in for
        // the first time, and it will soon be reused; in its first interval measured, every reference
        // may be a first one). Such a container waits as a filling one does.
        let first_pass: Vec<bool> = inputs
            .iter()
            .map(|c| {
                let floor = c.file_curve.miss_ratio_at(c.file_curve.max_size() as f64);
                let h = self.cts.entry(c.name.clone()).or_default();
                let Some(o) = c.observed else { return false };
                let before = h.last_floor.replace(floor);
                let miss_ns = c.demand.file_miss_ns.unwrap_or(lat.file_miss_ns);
                let first_refs_ns = floor * c.demand.file_reads_per_op * miss_ns;
                fb.first_pass_time_share < 1.0
                    && before.is_none_or(|b| floor < b * (1.0 - fb.first_pass_floor_drop))
                    && first_refs_ns > fb.first_pass_time_share * o.ns_per_op
            })
            .collect();
        let waited: Vec<bool> = waited.iter().zip(&first_pass).map(|(w, f)| *w || *f).collect();
        let mut inputs: Vec<ContainerInput> = inputs
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if floors_fit {
                    c.min_memory_pages = c.min_memory_pages.max(unit_pages);
                }
                c
            })
            .collect();
        // The fill floors only where the programme, which rounds each floor up to a whole unit, can
        // still keep them all.
        let with_fill: Vec<u64> = inputs
            .iter()
            .zip(waited.iter().zip(&given))
            .map(|(c, w)| match w {
                (true, Some(g)) => c.min_memory_pages.max(*g),
                _ => c.min_memory_pages,
            })
            .collect();
        let memory_grid = grid(budget.memory_pages, cfg.steps);
        if with_fill.iter().map(|&f| floor_units(f, memory_grid)).sum::<usize>() <= memory_grid.1 {
            for (c, f) in inputs.iter_mut().zip(with_fill) {
                c.min_memory_pages = f;
            }
        }
        let inputs = inputs;
        let models: Vec<Model<'_>> = inputs.iter().map(|c| Model::new(c, lat)).collect();
        let step = (budget.memory_pages as f64 / k).max(1.0);
        let model_at = |i: usize, a: &Allocation| {
            models[i].predict(
                a.memory_pages as f64,
                a.mem_cache_pages as f64,
                a.ssd_cache_pages as f64,
                step,
                cfg.min_file_share,
            )
        };

        // 1. What the last interval measured, under the allocation applied last.
        let applied = self.applied.take();
        let mut last_alloc: Vec<Option<Allocation>> = vec![None; inputs.len()];
        if let Some(ap) = &applied {
            for (i, n) in names.iter().enumerate() {
                if let Some(j) = ap.names.iter().position(|x| x == n) {
                    last_alloc[i] = Some(ap.alloc[j]);
                }
            }
        }
        // An interval of a change's transient measured the change, not the allocation: it is not
        // recorded. The transient is over when every container's throughput stopped moving.
        let settled = |ap: &Applied| {
            ap.names == names
                && ap.last_ops.len() == names.len()
                && ap.last_ops.iter().zip(measured).all(|(p, m)| match (p, m) {
                    (Some(p), Some(m)) => (m.ops_s - p).abs() <= fb.min_gain * p.max(m.ops_s),
                    _ => false,
                })
        };
        let settling = applied.as_ref().is_some_and(|a| a.settle > 0 && !settled(a));
        for (i, c) in inputs.iter().enumerate() {
            let h = self.cts.entry(c.name.clone()).or_default();
            h.last = measured[i];
            h.last_held = held(c);
            h.filling_for = if filling[i] { h.filling_for.saturating_add(1) } else { 0 };
            h.first_pass = first_pass[i];
            let Some(m) = measured[i] else { continue };
            h.missed_for = match &c.target {
                Some(t) if !m.meets(t) => h.missed_for + 1,
                _ => 0,
            };
            let Some(a) = last_alloc[i].filter(|_| !settling && !waited[i]) else { continue };
            match h.points.iter_mut().find(|p| near(&p.alloc, &a, tol)) {
                Some(p) => {
                    let s = fb.smoothing;
                    p.m.ops_s = s * m.ops_s + (1.0 - s) * p.m.ops_s;
                    p.m.latency_ms = s * m.latency_ms + (1.0 - s) * p.m.latency_ms;
                    p.m.hit_ratio = s * m.hit_ratio + (1.0 - s) * p.m.hit_ratio;
                    p.alloc = a;
                    p.seen = self.round;
                    p.n += 1;
                }
                None => {
                    h.points.push(Point { alloc: a, m, seen: self.round, n: 1 });
                    if h.points.len() > fb.max_points as usize {
                        let oldest = (0..h.points.len()).min_by_key(|&j| h.points[j].seen).unwrap_or(0);
                        h.points.swap_remove(oldest);
                    }
                }
            }
            let model = model_at(i, &a).ops_s;
            if model > 0.0 && m.ops_s > 0.0 {
                let lim = fb.max_correction.ln();
                let r = (m.ops_s / model).ln().clamp(-lim, lim);
                h.log_correction = fb.smoothing * r + (1.0 - fb.smoothing) * h.log_correction;
            }
        }
        // The joint allocation measured: refreshed if known, remembered if not.
        // Nor is the joint allocation while a container is in its first pass (it would be an anchor that
        // measured a first pass: a start that meets every target once the data is in looked worse than
        // the plans that left it).
        let any_first_pass = first_pass.iter().any(|f| *f);
        if let Some(ap) = applied.as_ref().filter(|ap| ap.names == names && !settling && !any_first_pass) {
            let same = |t: &(Vec<String>, Vec<Allocation>, u64)| {
                t.0 == names && t.1.iter().zip(&ap.alloc).all(|(x, y)| near(x, y, tol))
            };
            match self.tried.iter().position(same) {
                Some(j) => self.tried[j].2 = self.round,
                None => {
                    self.tried.push((names.clone(), ap.alloc.clone(), self.round));
                    if self.tried.len() > fb.max_points as usize {
                        self.tried.remove(0);
                    }
                }
            }
        }

        // Forget what was not measured again for `max_age_intervals` decisions.
        let oldest = self.round.saturating_sub(fb.max_age_intervals as u64);
        for h in self.cts.values_mut() {
            h.points.retain(|p| p.seen >= oldest);
        }
        self.tried.retain(|t| t.2 >= oldest);

        // 2. Predictions corrected by what was measured.
        let ceilings: Vec<f64> = (0..inputs.len())
            .map(|i| {
                let h = &self.cts[&names[i]];
                let best = h.points.iter().map(|p| p.m.ops_s).fold(0.0, f64::max);
                models[i].ceiling_ops_s().max(best)
            })
            .collect();
        let hist: Vec<&History> = names.iter().map(|n| &self.cts[n]).collect();
        let gain = fb.min_gain;
        let adjust = |i: usize, pages: [f64; 3], p: Prediction| -> Prediction {
            let h = hist[i];
            let a = alloc_of(pages);
            let conc = inputs[i].demand.concurrency;
            let with_ops = |ops: f64, hit: f64| Prediction {
                ops_s: ops,
                ns_per_op: if ops > 0.0 { conc * 1e9 / ops } else { f64::INFINITY },
                hit_ratio: hit,
                ..p
            };
            if let Some(pt) = h.points.iter().find(|pt| near(&pt.alloc, &a, tol)) {
                return with_ops(pt.m.ops_s, pt.m.hit_ratio);
            }
            let mut ops = p.ops_s * h.log_correction.exp();
            let mut hit = p.hit_ratio;
            // Bounds only from allocations measured in two intervals or more: one interval may be a
            // transient (a run's first, caches still cold), and a bound from it would keep the loop
            // from ever trying an allocation it covers.
            for pt in h.points.iter().filter(|p| p.n >= 2) {
                if covers(&pt.alloc, &a, tol) {
                    ops = ops.min(pt.m.ops_s * (1.0 + gain));
                    hit = hit.min(pt.m.hit_ratio);
                }
            }
            for pt in h.points.iter().filter(|p| p.n >= 2) {
                if covers(&a, &pt.alloc, tol) {
                    ops = ops.max(pt.m.ops_s * (1.0 - gain));
                    hit = hit.max(pt.m.hit_ratio);
                }
            }
            with_ops(ops.min(ceilings[i]), hit)
        };

        // Scores as the closed loop compares them: targets met, then the objective.
        let score_of = |preds: &[Prediction]| -> (u32, f64) {
            preds.iter().enumerate().fold((0, 0.0), |(met, obj), (i, p)| {
                let ok = inputs[i].target.is_some_and(|t| t.met_by(p, 0.0));
                (met + ok as u32, obj + cfg.objective.of(&inputs[i], p))
            })
        };
        let better = |a: (u32, f64), b: (u32, f64), margin: f64| {
            a.0 > b.0 || (a.0 == b.0 && a.1 > b.1 * (1.0 + margin))
        };
        let fixed_steer = Steer { adjust: &adjust, anchor: None, max_step_units: 0 };
        // The most each container is predicted to reach with the VM's whole budget its own, corrected as
        // every other prediction: what "none predicted meets it" compares with.
        let corrected = |i: usize, x: &Allocation| adjust(i, x.pages(), model_at(i, x));
        let best_predicted = || -> Vec<Prediction> {
            let all = Allocation {
                memory_pages: budget.memory_pages,
                mem_cache_pages: budget.mem_cache_pages,
                ssd_cache_pages: budget.ssd_cache_pages,
            };
            (0..inputs.len()).map(|i| corrected(i, &all)).collect()
        };
        // The plan of a given allocation: its corrected predictions and pool weights.
        let plan_at =
            |alloc: &[Allocation]| solve(&inputs, None, lat, budget, cfg, Some(&fixed_steer), Some(alloc));

        // Judge the last exploration against the anchor it left.
        let current: Option<Vec<Allocation>> = last_alloc.iter().copied().collect();
        let current_score = current.as_ref().map(|c| plan_at(c)).transpose()?.map(|p| score_of(&preds(&p)));
        if let (Some(ap), Some(now)) = (&applied, current_score) {
            if ap.explore && !settling {
                match ap.anchor_score {
                    Some(anchor) if better(anchor, now, 0.0) => {
                        self.failed += 1;
                        if self.failed >= fb.max_failed_explorations {
                            self.rest_until = self.round + fb.rest_intervals as u64;
                            self.failed = 0;
                        }
                    }
                    _ => self.failed = 0,
                }
            }
        }

        // Learning: nothing changes until every container has been measured.
        if measured.iter().any(Option::is_none) {
            let plan = current.as_ref().map(|c| plan_at(c)).transpose()?;
            let statuses = self.statuses(&inputs, measured, plan.as_ref(), None, fb.report_after);
            if let (Some(c), Some(ap)) = (current, applied) {
                self.applied = Some(Applied {
                    alloc: c,
                    explore: false,
                    anchor_score: None,
                    settle: 0,
                    last_ops: Vec::new(),
                    ..ap
                });
            }
            return Ok(Decision { plan, source: Source::Learning, containers: statuses });
        }

        // Settling: the plan stays until its measurements count.
        if let (true, Some(c), Some(ap)) = (settling, &current, &applied) {
            let plan = plan_at(c)?;
            let best_pred = best_predicted();
            let statuses = self.statuses(
                &inputs,
                measured,
                Some(&plan),
                Some((&best_pred, budget, tol)),
                fb.report_after,
            );
            self.applied = Some(Applied {
                alloc: c.clone(),
                settle: ap.settle.min(fb.max_settle_intervals.max(1)) - 1,
                last_ops: measured.iter().map(|m| m.map(|m| m.ops_s)).collect(),
                ..ap.clone()
            });
            return Ok(Decision { plan: Some(plan), source: Source::Settling, containers: statuses });
        }

        // 3. The anchor: the best joint allocation measured (the current one if within the noise).
        let mut anchor: Option<(Vec<Allocation>, (u32, f64))> = current.clone().zip(current_score);
        for (tn, ta, _) in &self.tried {
            if *tn != names {
                continue;
            }
            let s = score_of(&preds(&plan_at(ta)?));
            if anchor.as_ref().is_none_or(|(_, best)| better(s, *best, gain)) {
                anchor = Some((ta.clone(), s));
            }
        }

        // 4. The programme from the anchor, and the choice.
        let resting = self.round < self.rest_until;
        let steer = Steer {
            adjust: &adjust,
            anchor: anchor.as_ref().map(|a| a.0.as_slice()),
            max_step_units: fb.max_step_units as usize,
        };
        let proposed = if resting && anchor.is_some() {
            None
        } else {
            let p = match solve(&inputs, None, lat, budget, cfg, Some(&steer), None) {
                Ok(p) => p,
                // The anchor's floors may not fit a changed budget: plan from scratch.
                Err(_) => solve(&inputs, None, lat, budget, cfg, Some(&fixed_steer), None)?,
            };
            Some(p)
        };
        // A step towards the target furthest missed (crate::shortfall), from allocation `a`.
        let predict_ops = |i: usize, x: &Allocation| corrected(i, x).ops_s;
        // What measurements allow, not the model's ceiling: the model is what a step towards a missed
        // target doubts.
        let measured_cap = |i: usize, x: &Allocation| hist[i].measured_cap(x, tol, gain);
        let tried = |cand: &[Allocation]| self.was_tried(&names, cand, tol);
        let unit = |total: u64| total / cfg.steps.max(1) as u64;
        let seek_from = |a: &Vec<Allocation>| -> Option<Vec<Allocation>> {
            if resting || fb.seek_max_factor <= 1.0 {
                return None;
            }
            seek_shortfall(&Seek {
                inputs: &inputs,
                anchor: a,
                predict_ops: &predict_ops,
                measured_cap: &measured_cap,
                tried: &tried,
                unit_pages: [
                    unit(budget.memory_pages),
                    unit(budget.mem_cache_pages),
                    unit(budget.ssd_cache_pages),
                ],
                headroom: cfg.headroom,
                max_factor: fb.seek_max_factor,
            })
        };
        let settle = |a: &Vec<Allocation>| -> Result<(Plan, Source, bool), ProvisionError> {
            if let Some(n) = seek_from(a) {
                return Ok((plan_at(&n)?, Source::Explore, true));
            }
            if !resting {
                if let Some(n) = self.neighbour(
                    &inputs,
                    a,
                    &anchor_score(&anchor),
                    budget,
                    cfg,
                    tol,
                    &ceilings,
                    &hist,
                    &corrected,
                ) {
                    return Ok((plan_at(&fill(&n, budget))?, Source::Explore, true));
                }
            }
            let is_current = current.as_ref().is_some_and(|c| c == a);
            Ok((
                plan_at(&fill(a, budget))?,
                if is_current { Source::Kept } else { Source::BestMeasured },
                false,
            ))
        };
        // Across a cliff: bounded steps cannot reach an allocation past a cliff whose near side measures
        // no gain (a loop that fits or not), while the corrected model sees the far side. Its unbounded
        // plan is taken when it is predicted to meet more targets than the bounded one and the anchor,
        // was never measured, and takes memory only from containers without anonymous memory (what they
        // give up goes to the second-chance cache and comes back from it, where a jump that shrinks
        // anonymous memory costs swap-ins through the shared disk for tens of seconds). If it measures
        // worse, it is a failed exploration like any other and the loop returns to the anchor.
        let with_targets = inputs.iter().filter(|c| c.target.is_some()).count() as u32;
        let proposed = match (proposed, &anchor) {
            (Some(p), Some((a, s))) => {
                let bounded = score_of(&preds(&p)).0;
                let unbounded = if bounded < with_targets {
                    Some(solve(&inputs, None, lat, budget, cfg, Some(&fixed_steer), None)?)
                } else {
                    None
                };
                let across = unbounded.filter(|u| {
                    let ua: Vec<Allocation> = u.containers.iter().map(|c| c.allocation).collect();
                    let cheap = (0..inputs.len())
                        .all(|i| ua[i].memory_pages >= a[i].memory_pages || !inputs[i].has_anon());
                    let more = score_of(&preds(u)).0;
                    cheap && more > bounded && more > s.0 && !self.was_tried(&names, &ua, tol)
                });
                Some(across.unwrap_or(p))
            }
            (p, _) => p,
        };
        let (plan, source, explore) = match (proposed, &anchor) {
            (Some(p), None) => (p, Source::Model, true),
            (Some(p), Some((a, s))) => {
                let ps = score_of(&preds(&p));
                let same = p.containers.iter().zip(a).all(|(c, x)| near(&c.allocation, x, tol));
                if !same && better(ps, *s, gain) {
                    (p, Source::Model, true)
                } else {
                    settle(a)?
                }
            }
            (None, Some((a, _))) => settle(a)?,
            (None, None) => unreachable!("resting needs an anchor"),
        };
        let alloc: Vec<Allocation> = plan.containers.iter().map(|c| c.allocation).collect();
        let explore = explore && !self.was_tried(&names, &alloc, tol);
        let best_pred = best_predicted();
        let statuses =
            self.statuses(&inputs, measured, Some(&plan), Some((&best_pred, budget, tol)), fb.report_after);
        let mut plan = plan;
        plan.kept_current = source == Source::Kept;
        plan.infeasible =
            statuses.iter().filter(|s| s.state == TargetState::Infeasible).map(|s| s.name.clone()).collect();
        plan.feasible = statuses.iter().all(|s| matches!(s.state, TargetState::None | TargetState::Met));
        let changed = current.as_ref().is_none_or(|c| c.iter().zip(&alloc).any(|(x, y)| !near(x, y, tol)));
        self.applied = Some(Applied {
            names,
            alloc,
            explore,
            anchor_score: anchor.map(|a| a.1),
            settle: if changed { fb.max_settle_intervals } else { 0 },
            last_ops: Vec::new(),
            limited: true,
        });
        Ok(Decision { plan: Some(plan), source, containers: statuses })
    }

    /// An allocation next to the anchor that has not been measured and could still beat it: `explore_units`
    /// of one resource moved from one container to another (Cliffhanger's step on a measured gradient,
    /// for when the model's own plan is no better: its curves may be wrong where it has not measured).
    /// Receivers come in order of need (a missed target first, then the least of its ceiling reached),
    /// donors the other way; a move is skipped when even the most the measurements allow (each
    /// container's ceiling, and at most what a larger allocation of it measured) cannot beat the anchor.
    /// Memory is never taken from a container with anonymous memory: the bound assumes the donor loses
    /// nothing, and one that swaps loses for tens of seconds (and slows everyone's disk reads).
    #[allow(clippy::too_many_arguments)]
    fn neighbour(
        &self,
        inputs: &[ContainerInput],
        anchor: &[Allocation],
        anchor_score: &Option<(u32, f64)>,
        budget: &Budget,
        cfg: &ProvisionConfig,
        tol: [f64; 3],
        ceilings: &[f64],
        hist: &[&History],
        corrected: &dyn Fn(usize, &Allocation) -> Prediction,
    ) -> Option<Vec<Allocation>> {
        let n = inputs.len();
        let fb = cfg.feedback;
        let (anchor_met, anchor_obj) = (*anchor_score)?;
        let names: Vec<String> = inputs.iter().map(|c| c.name.clone()).collect();
        let need = |i: usize| {
            let m = hist[i].last.map_or(0.0, |m| m.ops_s);
            let missing = inputs[i].target.is_some_and(|t| hist[i].last.is_some_and(|m| !m.meets(&t)));
            (!missing, m / ceilings[i].max(1e-9))
        };
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| need(a).partial_cmp(&need(b)).unwrap_or(std::cmp::Ordering::Equal));
        let totals = [budget.memory_pages, budget.mem_cache_pages, budget.ssd_cache_pages];
        let optimistic = |i: usize, a: &Allocation| {
            let cap = hist[i].measured_cap(a, tol, fb.min_gain).min(ceilings[i]);
            let met = inputs[i].target.is_none_or(|t| match t {
                Target::Throughput { ops_s } => cap >= ops_s,
                _ => true,
            });
            (inputs[i].target.is_some() && met, cap)
        };
        for (d, &total) in totals.iter().enumerate() {
            let step = (total as f64 / cfg.steps as f64 * fb.explore_units as f64).round() as u64;
            if step == 0 {
                continue;
            }
            for &to in &order {
                for &from in order.iter().rev() {
                    let floor = if d == 0 { inputs[from].min_memory_pages } else { 0 };
                    if from == to || anchor[from].get(d) < floor + step || (d == 0 && inputs[from].has_anon())
                    {
                        continue;
                    }
                    let mut cand = anchor.to_vec();
                    let (f, t) = (cand[from].get(d), cand[to].get(d));
                    cand[from].set(d, f - step);
                    cand[to].set(d, t + step);
                    // What the donor gives is judged by its own corrected prediction, not the optimistic
                    // bound: one with a target keeps it with the decision's headroom (a scanner taken below
                    // its loop misses to the shared disk and slows every VM's reads).
                    let keeps = || {
                        let p = corrected(from, &cand[from]);
                        inputs[from].target.is_none_or(|t| t.met_by(&p, cfg.headroom))
                    };
                    if self.was_tried(&names, &cand, tol) || !keeps() {
                        continue;
                    }
                    let (met, obj) = (0..n).fold((0u32, 0.0), |(m, o), i| {
                        let (ok, ops) = optimistic(i, &cand[i]);
                        (m + ok as u32, o + ops)
                    });
                    if met > anchor_met || (met == anchor_met && obj > anchor_obj * (1.0 + fb.min_gain)) {
                        return Some(cand);
                    }
                }
            }
        }
        None
    }

    fn statuses(
        &self,
        inputs: &[ContainerInput],
        measured: &[Option<Measured>],
        plan: Option<&Plan>,
        best: Option<(&[Prediction], &Budget, [f64; 3])>,
        report_after: u32,
    ) -> Vec<ContainerStatus> {
        inputs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let h = &self.cts[&c.name];
                let predicted = plan.map(|p| p.containers[i].predicted);
                let best_measured = h.points.iter().map(|p| p.m.ops_s).reduce(f64::max);
                let best_pred = best.map(|b| b.0[i]);
                let state = match (&c.target, measured[i]) {
                    (None, _) => TargetState::None,
                    (Some(_), None) => TargetState::Learning,
                    (Some(t), Some(_)) => {
                        // Feasible: an allocation within today's budget measured it met, or the most
                        // the budget can give it (corrected as every prediction) is predicted to.
                        let fits = |a: &Allocation| {
                            best.is_none_or(|(_, b, tol)| {
                                covers(
                                    &Allocation {
                                        memory_pages: b.memory_pages,
                                        mem_cache_pages: b.mem_cache_pages,
                                        ssd_cache_pages: b.ssd_cache_pages,
                                    },
                                    a,
                                    tol,
                                )
                            })
                        };
                        let met_here = h.points.iter().any(|p| fits(&p.alloc) && p.m.meets(t));
                        let could = best_pred.is_none_or(|p| t.met_by(&p, 0.0));
                        // Not while it is in its first pass: the first references its measurement
                        // paid for are in every prediction's calibration.
                        if !met_here && !could && !h.first_pass {
                            TargetState::Infeasible
                        } else if h.missed_for == 0 {
                            TargetState::Met
                        } else if h.missed_for >= report_after {
                            TargetState::Missed
                        } else {
                            TargetState::Below
                        }
                    }
                };
                ContainerStatus {
                    name: c.name.clone(),
                    state,
                    missed_intervals: h.missed_for,
                    measured_ops_s: h.last.map(|m| m.ops_s),
                    predicted_ops_s: predicted.map(|p| p.ops_s),
                    best_measured_ops_s: best_measured,
                    best_predicted_ops_s: best_pred.map(|p| p.ops_s),
                    correction: h.log_correction.exp(),
                }
            })
            .collect()
    }
}

/// `alloc` with the memory it leaves unallocated shared evenly (an allocation measured while the
/// containers had no limits of their own, their usage, does not add up to the VM's memory).
fn fill(alloc: &[Allocation], budget: &Budget) -> Vec<Allocation> {
    let mut out = alloc.to_vec();
    let n = out.len() as u64;
    let used: u64 = out.iter().map(|a| a.memory_pages).sum();
    if n > 0 && used < budget.memory_pages {
        let spare = budget.memory_pages - used;
        for (i, a) in out.iter_mut().enumerate() {
            a.memory_pages += spare / n + ((i as u64) < spare % n) as u64;
        }
    }
    out
}

fn anchor_score(anchor: &Option<(Vec<Allocation>, (u32, f64))>) -> Option<(u32, f64)> {
    anchor.as_ref().map(|a| a.1)
}

fn preds(p: &Plan) -> Vec<Prediction> {
    p.containers.iter().map(|c| c.predicted).collect()
}
