//! The decision: how much memory, memory cache and SSD cache each container gets.
//!
//! [`provision`] is a pure function of its arguments. Each resource is cut into `steps` equal units
//! (the VM's memory, its entitlement in the memory store, its entitlement in the SSD store). A plan is
//! scored lexicographically: first the number of containers whose target the model says it meets, then
//! the number that meet it with `headroom` to spare, then the objective (total throughput, or total file
//! hits per second). Memory and memory cache are decided together by dynamic programming over the
//! containers on the two-dimensional grid (exact on the grid, whatever the curves' shape: a cliff such
//! as a key-value store whose data set fits or not is handled, which greedy marginal allocation is not);
//! the SSD cache, when the VM has one, by a one-dimensional programme with the other two fixed, and the
//! two alternate for `rounds` rounds or until nothing changes. Memory the plan leaves unused (no
//! container gains from it) is shared evenly so the limits add up to the VM's memory; cache shares are
//! weights, and a container planned no memory cache keeps one unit's weight so that it can still use
//! space the others leave free (the cache is resource conserving) and, its allocation being read from
//! what its pool holds, can show what a share would give it.
//!
//! Hysteresis: when every container carries its current allocation and that allocation scores as
//! well on targets and within `hysteresis` of the best objective, it is kept, so that measurement noise
//! does not move settings back and forth. The closed loop ([`crate::feedback`]) calls the same
//! programme through [`Steer`] (every prediction corrected by measurements, each container kept within
//! bounded steps of an anchor) and keeps allocations by its own rule instead.
//!
//! Cost: `O(n * steps^4)` for the joint memory/memory-cache programme (about 5 M steps for 48 units),
//! `O(n * steps^2)` for the SSD one.

use crate::config::ProvisionConfig;
use crate::error::ProvisionError;
use crate::model::{ContainerInput, LatencyModel, Model, Prediction, Target};
use dd_types::Spec;
use serde::{Deserialize, Serialize};

/// What the VM has to give: its memory for containers and its entitlements in the two stores, pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub memory_pages: u64,
    pub mem_cache_pages: u64,
    pub ssd_cache_pages: u64,
}

/// One container's share of a [`Budget`], pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    pub memory_pages: u64,
    pub mem_cache_pages: u64,
    pub ssd_cache_pages: u64,
}

impl Allocation {
    /// Resource `d`: 0 memory, 1 memory cache, 2 SSD cache.
    pub(crate) fn get(&self, d: usize) -> u64 {
        [self.memory_pages, self.mem_cache_pages, self.ssd_cache_pages][d]
    }

    pub(crate) fn set(&mut self, d: usize, v: u64) {
        match d {
            0 => self.memory_pages = v,
            1 => self.mem_cache_pages = v,
            _ => self.ssd_cache_pages = v,
        }
    }

    /// (memory, memory cache, SSD cache) as the model takes them.
    pub(crate) fn pages(&self) -> [f64; 3] {
        [self.memory_pages as f64, self.mem_cache_pages as f64, self.ssd_cache_pages as f64]
    }
}

/// One container's settings and what the model expects of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerPlan {
    pub name: String,
    pub allocation: Allocation,
    /// Weights of the container's pool in the memory and SSD stores (0: the store is not used).
    pub mem_weight: u32,
    pub ssd_weight: u32,
    pub predicted: Prediction,
    pub target: Option<Target>,
    /// Whether the prediction meets the target (`None`: no target).
    pub target_met: Option<bool>,
}

impl ContainerPlan {
    /// The pool spec `<T, W>` that gives the planned shares.
    pub fn spec(&self) -> Spec {
        match (self.mem_weight, self.ssd_weight) {
            (0, 0) => Spec::None,
            (m, 0) => Spec::Mem { weight: m },
            (0, s) => Spec::Ssd { weight: s },
            (m, s) => Spec::Hybrid { mem_weight: m, ssd_weight: s },
        }
    }
}

/// The decision for every container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub containers: Vec<ContainerPlan>,
    /// Every target is met by the prediction.
    pub feasible: bool,
    /// Containers whose target the plan does not meet.
    pub infeasible: Vec<String>,
    /// The current allocation was kept (hysteresis).
    pub kept_current: bool,
}

/// Score of a plan or of one container's part of it: targets met, met with headroom, objective.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Score {
    met: u32,
    comfy: u32,
    obj: f64,
}

impl Score {
    const NONE: Score = Score { met: 0, comfy: 0, obj: f64::NEG_INFINITY };
    fn add(self, o: Score) -> Score {
        Score { met: self.met + o.met, comfy: self.comfy + o.comfy, obj: self.obj + o.obj }
    }
    fn better(self, o: Score) -> bool {
        (self.met, self.comfy) > (o.met, o.comfy)
            || ((self.met, self.comfy) == (o.met, o.comfy) && self.obj > o.obj)
    }
}

/// A pool's weight per unit of the plan's grid; a pool planned no memory cache keeps one unit's.
const WEIGHT_PER_UNIT: u32 = 16;

/// How the closed loop ([`crate::feedback`]) steers the programme: every prediction passes through
/// `adjust` (container index, its memory, memory-cache and SSD-cache pages, the model's prediction),
/// and with an `anchor` each container's units stay within `max_step_units` of the anchor's in every
/// resource (bounded steps from an allocation that was measured).
pub(crate) struct Steer<'s> {
    pub adjust: &'s dyn Fn(usize, [f64; 3], Prediction) -> Prediction,
    pub anchor: Option<&'s [Allocation]>,
    pub max_step_units: usize,
}

struct Ctx<'a> {
    models: Vec<Model<'a>>,
    cfg: ProvisionConfig,
    /// Pages per unit of memory, memory cache, SSD cache, and the units of each.
    unit: [f64; 3],
    units: [usize; 3],
    /// Per container, the units it may take of each resource (inclusive bounds).
    range: Vec<[(usize, usize); 3]>,
    steer: Option<&'a Steer<'a>>,
}

impl Ctx<'_> {
    fn score(&self, i: usize, p: &Prediction) -> Score {
        let input = self.models[i].input;
        let (met, comfy) = match &input.target {
            Some(t) => (t.met_by(p, 0.0) as u32, t.met_by(p, self.cfg.headroom) as u32),
            None => (0, 0),
        };
        Score { met, comfy, obj: self.cfg.objective.of(input, p) }
    }

    fn predict_pages(&self, i: usize, memory: f64, mem: f64, ssd: f64) -> Prediction {
        let p = self.models[i].predict(memory, mem, ssd, self.unit[0].max(1.0), self.cfg.min_file_share);
        match self.steer {
            Some(s) => (s.adjust)(i, [memory, mem, ssd], p),
            None => p,
        }
    }

    fn predict_units(&self, i: usize, u: [usize; 3]) -> Prediction {
        self.predict_pages(
            i,
            u[0] as f64 * self.unit[0],
            u[1] as f64 * self.unit[1],
            u[2] as f64 * self.unit[2],
        )
    }

    /// Joint memory and memory-cache programme with each container's SSD units fixed; returns the
    /// (memory, memory cache) units of each container, or `None` if the memory floors do not fit.
    fn plan_mem(&self, ssd: &[usize]) -> Option<Vec<(usize, usize)>> {
        let (km, kc) = (self.units[0], self.units[1]);
        let n = self.models.len();
        let w = kc + 1;
        // dp[m * w + c]: best score of the containers so far using exactly m and c units.
        let mut dp = vec![Score::NONE; (km + 1) * w];
        dp[0] = Score { met: 0, comfy: 0, obj: 0.0 };
        let mut choice: Vec<Vec<(u16, u16)>> = Vec::with_capacity(n);
        for (i, &s) in ssd.iter().enumerate() {
            let [(lo, hi), (blo, bhi), _] = self.range[i];
            let mut table = vec![Score::NONE; (km + 1) * w];
            for a in lo..=hi {
                for b in blo..=bhi {
                    table[a * w + b] = self.score(i, &self.predict_units(i, [a, b, s]));
                }
            }
            let mut next = vec![Score::NONE; (km + 1) * w];
            let mut pick = vec![(u16::MAX, u16::MAX); (km + 1) * w];
            for m in 0..=km {
                for c in 0..=kc {
                    let mut best = Score::NONE;
                    let mut arg = (u16::MAX, u16::MAX);
                    for a in lo..=m.min(hi) {
                        for b in blo..=c.min(bhi) {
                            let prev = dp[(m - a) * w + (c - b)];
                            if prev.obj == f64::NEG_INFINITY {
                                continue;
                            }
                            let v = prev.add(table[a * w + b]);
                            if arg.0 == u16::MAX || v.better(best) {
                                best = v;
                                arg = (a as u16, b as u16);
                            }
                        }
                    }
                    next[m * w + c] = best;
                    pick[m * w + c] = arg;
                }
            }
            dp = next;
            choice.push(pick);
        }
        // The best end state, then back through the choices.
        let mut end: Option<(usize, usize)> = None;
        for m in 0..=km {
            for c in 0..=kc {
                let v = dp[m * w + c];
                if v.obj == f64::NEG_INFINITY {
                    continue;
                }
                if end.is_none_or(|(em, ec)| v.better(dp[em * w + ec])) {
                    end = Some((m, c));
                }
            }
        }
        let (mut m, mut c) = end?;
        let mut out = vec![(0, 0); n];
        for i in (0..n).rev() {
            let (a, b) = choice[i][m * w + c];
            out[i] = (a as usize, b as usize);
            m -= a as usize;
            c -= b as usize;
        }
        Some(out)
    }

    /// SSD programme with memory and memory cache fixed.
    fn plan_ssd(&self, mc: &[(usize, usize)]) -> Vec<usize> {
        let ks = self.units[2];
        let n = self.models.len();
        let mut dp = vec![Score::NONE; ks + 1];
        dp[0] = Score { met: 0, comfy: 0, obj: 0.0 };
        let mut choice = Vec::with_capacity(n);
        for (i, &(m, c)) in mc.iter().enumerate() {
            let (slo, shi) = self.range[i][2];
            let table: Vec<Score> = (0..=ks)
                .map(|s| {
                    if (slo..=shi).contains(&s) {
                        self.score(i, &self.predict_units(i, [m, c, s]))
                    } else {
                        Score::NONE
                    }
                })
                .collect();
            let mut next = vec![Score::NONE; ks + 1];
            let mut pick = vec![0usize; ks + 1];
            for t in 0..=ks {
                for s in slo..=t.min(shi) {
                    let prev = dp[t - s];
                    if prev.obj == f64::NEG_INFINITY {
                        continue;
                    }
                    let v = prev.add(table[s]);
                    if next[t].obj == f64::NEG_INFINITY || v.better(next[t]) {
                        next[t] = v;
                        pick[t] = s;
                    }
                }
            }
            dp = next;
            choice.push(pick);
        }
        let mut t = (0..=ks).fold(0, |b, x| if dp[x].better(dp[b]) { x } else { b });
        let mut out = vec![0; n];
        for i in (0..n).rev() {
            out[i] = choice[i][t];
            t -= out[i];
        }
        out
    }
}

/// Decides every container's memory, memory-cache share and SSD-cache share (see the module doc).
/// Containers come back in input order. Fails only on invalid input; a target no allocation meets is
/// reported in [`Plan::infeasible`].
pub fn provision(
    containers: &[ContainerInput],
    current: Option<&[Allocation]>,
    lat: &LatencyModel,
    budget: &Budget,
    cfg: &ProvisionConfig,
) -> Result<Plan, ProvisionError> {
    solve(containers, current, lat, budget, cfg, None, None)
}

/// The programme's grid of one resource: pages per unit and units, for a budget of `pages` in at most
/// `steps` units (a unit is at least a page).
pub(crate) fn grid(pages: u64, steps: u32) -> (f64, usize) {
    let units = pages.min(steps as u64) as usize;
    if units == 0 {
        (0.0, 0)
    } else {
        (pages as f64 / units as f64, units)
    }
}

/// A memory floor of `min_pages` in whole units of the grid `(pages per unit, units)`, rounded up as the
/// programme keeps it.
pub(crate) fn floor_units(min_pages: u64, (mu, km): (f64, usize)) -> usize {
    if mu <= 0.0 {
        0
    } else {
        ((min_pages as f64 / mu).ceil() as usize).min(km)
    }
}

/// [`provision`], steered by the closed loop when `steer` is given; with `fixed`, the plan is that
/// allocation (its predictions and pool weights) instead of the programme's.
pub(crate) fn solve(
    containers: &[ContainerInput],
    current: Option<&[Allocation]>,
    lat: &LatencyModel,
    budget: &Budget,
    cfg: &ProvisionConfig,
    steer: Option<&Steer<'_>>,
    fixed: Option<&[Allocation]>,
) -> Result<Plan, ProvisionError> {
    cfg.validate()?;
    for (i, c) in containers.iter().enumerate() {
        c.validate(&format!("containers[{i}]"))?;
    }
    if current.is_some_and(|a| a.len() != containers.len()) {
        return Err(ProvisionError::invalid("current", "one allocation per container"));
    }
    let lat_ok =
        [lat.memory_hit_ns, lat.mem_cache_hit_ns, lat.ssd_cache_hit_ns, lat.file_miss_ns, lat.anon_miss_ns]
            .into_iter()
            .all(|v| v.is_finite() && v >= 0.0);
    if !lat_ok {
        return Err(ProvisionError::invalid("latency", "every latency must be finite and non-negative"));
    }
    let floors: u64 = containers.iter().map(|c| c.min_memory_pages).sum();
    if floors > budget.memory_pages {
        return Err(ProvisionError::invalid(
            "containers.min_memory_pages",
            "the floors exceed the VM's memory",
        ));
    }
    if containers.is_empty() {
        return Ok(Plan {
            containers: Vec::new(),
            feasible: true,
            infeasible: Vec::new(),
            kept_current: false,
        });
    }
    let (mu, km) = grid(budget.memory_pages, cfg.steps);
    let (cu, kc) = grid(budget.mem_cache_pages, cfg.steps);
    let (su, ks) = grid(budget.ssd_cache_pages, cfg.steps);
    if steer.and_then(|s| s.anchor).or(fixed).is_some_and(|a| a.len() != containers.len()) {
        return Err(ProvisionError::invalid("anchor", "one allocation per container"));
    }
    let (unit, units) = ([mu, cu, su], [km, kc, ks]);
    let range = (0..containers.len())
        .map(|i| {
            let floor = floor_units(containers[i].min_memory_pages, (mu, km));
            let mut r = [(floor, km), (0, kc), (0, ks)];
            if let Some(s) = steer {
                if let Some(a) = s.anchor {
                    let pages = [a[i].memory_pages, a[i].mem_cache_pages, a[i].ssd_cache_pages];
                    for d in 0..3 {
                        // The anchor's units, rounded down so that the anchors still fit the budget.
                        let at = if unit[d] <= 0.0 {
                            0
                        } else {
                            ((pages[d] as f64 / unit[d]) as usize).min(units[d])
                        };
                        let lo = at.saturating_sub(s.max_step_units).max(r[d].0);
                        let hi = (at + s.max_step_units).min(units[d]).max(lo);
                        r[d] = (lo, hi);
                    }
                }
            }
            r
        })
        .collect();
    let ctx = Ctx {
        models: containers.iter().map(|c| Model::new(c, lat)).collect(),
        cfg: *cfg,
        unit,
        units,
        range,
        steer,
    };
    let n = containers.len();
    let mut alloc = match fixed {
        // The closed loop's choice of a measured allocation: only its predictions and weights.
        Some(f) => f.to_vec(),
        None => {
            let mut ssd = vec![0usize; n];
            let mut mc = ctx.plan_mem(&ssd).ok_or_else(|| {
                ProvisionError::invalid("containers.min_memory_pages", "the floors exceed the grid")
            })?;
            if ks > 0 {
                for _ in 0..cfg.rounds {
                    let s = ctx.plan_ssd(&mc);
                    let m = ctx.plan_mem(&s).expect("the floors fitted in the first round");
                    let same = s == ssd && m == mc;
                    ssd = s;
                    mc = m;
                    if same {
                        break;
                    }
                }
            }
            // Pages of the plan; unused memory is shared evenly.
            let mut alloc: Vec<Allocation> = (0..n)
                .map(|i| Allocation {
                    memory_pages: (mc[i].0 as f64 * mu).floor() as u64,
                    mem_cache_pages: (mc[i].1 as f64 * cu).floor() as u64,
                    ssd_cache_pages: (ssd[i] as f64 * su).floor() as u64,
                })
                .collect();
            let spare = budget.memory_pages
                - alloc.iter().map(|a| a.memory_pages).sum::<u64>().min(budget.memory_pages);
            for (i, a) in alloc.iter_mut().enumerate() {
                a.memory_pages += spare / n as u64 + (i < (spare % n as u64) as usize) as u64;
            }
            alloc
        }
    };
    let eval = |alloc: &[Allocation]| -> (Score, Vec<Prediction>) {
        let preds: Vec<Prediction> = (0..n)
            .map(|i| {
                let a = &alloc[i];
                ctx.predict_pages(
                    i,
                    a.memory_pages as f64,
                    a.mem_cache_pages as f64,
                    a.ssd_cache_pages as f64,
                )
            })
            .collect();
        let total = (0..n).fold(Score { met: 0, comfy: 0, obj: 0.0 }, |s, i| s.add(ctx.score(i, &preds[i])));
        (total, preds)
    };
    let (best, mut preds) = eval(&alloc);
    let mut kept = false;
    if let Some(cur) = current {
        let (now, now_preds) = eval(cur);
        let as_good = (now.met, now.comfy) >= (best.met, best.comfy);
        if as_good && now.obj >= best.obj * (1.0 - cfg.hysteresis) {
            alloc = cur.to_vec();
            preds = now_preds;
            kept = true;
        }
    }
    // Weights: cache pages in units, `WEIGHT_PER_UNIT` per unit. A pool planned no memory cache keeps
    // one unit, as every container keeps a unit of memory: a pool's allocation is read from what it
    // holds, so "no cache" is often "not measured yet", and a pool with less loses first every page it
    // is given.
    let weight = |pages: u64, unit: f64| -> u32 {
        if unit <= 0.0 {
            0
        } else {
            ((pages as f64 / unit * WEIGHT_PER_UNIT as f64).round() as u32).max(WEIGHT_PER_UNIT)
        }
    };
    let mut plans = Vec::with_capacity(n);
    let mut infeasible = Vec::new();
    for i in 0..n {
        let input = &containers[i];
        let a = alloc[i];
        let met = input.target.map(|t| t.met_by(&preds[i], 0.0));
        if met == Some(false) {
            infeasible.push(input.name.clone());
        }
        let mem_weight = weight(a.mem_cache_pages, cu);
        // A container planned no SSD space stays out of the SSD store (its pages would only be demoted
        // there to be evicted first).
        let ssd_weight = if a.ssd_cache_pages == 0 { 0 } else { weight(a.ssd_cache_pages, su) };
        plans.push(ContainerPlan {
            name: input.name.clone(),
            allocation: a,
            mem_weight,
            ssd_weight,
            predicted: preds[i],
            target: input.target,
            target_met: met,
        });
    }
    Ok(Plan { feasible: infeasible.is_empty(), infeasible, containers: plans, kept_current: kept })
}
