//! The closed loop's step towards a missed target (issue 27): when a container measures below its
//! throughput target at the best allocation measured, move memory to it from the containers with the
//! most to spare, in one step sized by how far below it is, instead of the fixed small steps of
//! [`crate::feedback`]'s exploration.
//!
//! Why a step of its own: the model under-predicts what memory gives a container whose curve is still
//! made of first references (a preloaded database read back, anonymous pages faulted in), so its plan
//! never gives it enough, and fixed steps of two units each need several intervals to settle (the pages
//! come back from the disk). A container at half its target needs its memory roughly doubled; RobinHood
//! (OSDI'18) moves a tenant's share in proportion to how far its measured tail is from its goal for the
//! same reason.
//!
//! Invariants: a donor gives only what its corrected prediction says leaves it at or above its own
//! target with the decision's headroom (a container without a target only above its floor), and no
//! memory at all if it holds anonymous memory (as [`crate::feedback`]'s exploration); a receiver
//! gets nothing an allocation at least as large already measured below its target; nothing is
//! proposed that was measured already (the caller's `tried`); the step is whole units of the plan's
//! grid; deterministic (ties in input order).

use crate::model::{ContainerInput, Target};
use crate::plan::Allocation;

/// What [`seek`] needs from the closed loop.
pub(crate) struct Seek<'a> {
    pub inputs: &'a [ContainerInput],
    /// The best joint allocation measured (the step starts from it).
    pub anchor: &'a [Allocation],
    /// The corrected prediction of a container's throughput at an allocation (what it measured, for an
    /// allocation it ran).
    pub predict_ops: &'a dyn Fn(usize, &Allocation) -> f64,
    /// The most a container can reach at an allocation as far as measurements go (what a larger
    /// allocation measured): a receiver already measured below its target with more is not given more.
    pub measured_cap: &'a dyn Fn(usize, &Allocation) -> f64,
    /// Whether a joint allocation was measured already.
    pub tried: &'a dyn Fn(&[Allocation]) -> bool,
    /// Pages in one unit of memory, memory cache and SSD cache.
    pub unit_pages: [u64; 3],
    pub headroom: f64,
    /// A receiver's memory is at most multiplied by this in one step.
    pub max_factor: f64,
}

fn throughput_target(c: &ContainerInput) -> Option<f64> {
    match c.target {
        Some(Target::Throughput { ops_s }) => Some(ops_s),
        _ => None,
    }
}

/// A joint allocation that moves memory (else memory cache, else SSD cache) from the containers with
/// the most slack to the one furthest below its throughput target, or `None` when no container is
/// below or nobody can give without falling below its own target.
pub(crate) fn seek(s: &Seek<'_>) -> Option<Vec<Allocation>> {
    let n = s.inputs.len();
    let now: Vec<f64> = (0..n).map(|i| (s.predict_ops)(i, &s.anchor[i])).collect();
    // Receivers: below target, furthest first.
    let mut receivers: Vec<(usize, f64)> = (0..n)
        .filter_map(|i| throughput_target(&s.inputs[i]).map(|t| (i, now[i] / t)))
        .filter(|&(_, r)| r < 1.0)
        .collect();
    receivers.sort_by(|a, b| a.1.total_cmp(&b.1));
    // Donors: most slack first (a container without a target has all of it).
    let slack = |j: usize| throughput_target(&s.inputs[j]).map_or(f64::INFINITY, |t| now[j] / t);
    let mut donors: Vec<usize> = (0..n).collect();
    donors.sort_by(|&a, &b| slack(b).total_cmp(&slack(a)));
    for &(r, ratio) in &receivers {
        let factor = ((1.0 + s.headroom) / ratio.max(1e-9)).min(s.max_factor);
        for d in 0..3 {
            let unit = s.unit_pages[d];
            if unit == 0 {
                continue;
            }
            let have = s.anchor[r].get(d).max(unit);
            let want_units = ((have as f64 * (factor - 1.0)) / unit as f64).ceil().max(1.0) as u64;
            let mut cand = s.anchor.to_vec();
            let mut moved = 0u64;
            for &j in donors.iter().filter(|&&j| j != r && slack(j) >= 1.0 + s.headroom) {
                if moved >= want_units {
                    break;
                }
                // Memory never comes from a heap: the donor's prediction rests on its anonymous curve,
                // and one built while the heap was still being touched puts it below its real size; a
                // heap shrunk on that word swaps, and its swap-ins queue everyone's reads on the shared
                // disk for tens of seconds.
                if d == 0 && s.inputs[j].has_anon() {
                    continue;
                }
                let floor = if d == 0 { s.inputs[j].min_memory_pages } else { 0 };
                let spare_units = cand[j].get(d).saturating_sub(floor) / unit;
                let need = throughput_target(&s.inputs[j]).map(|t| t * (1.0 + s.headroom));
                // The most this donor gives and still meets its own target, as predicted.
                let give = (1..=spare_units.min(want_units - moved)).rev().find(|&g| {
                    let mut a = cand[j];
                    let v = a.get(d) - g * unit;
                    a.set(d, v);
                    need.is_none_or(|t| (s.predict_ops)(j, &a) >= t)
                });
                if let Some(g) = give {
                    let v = cand[j].get(d) - g * unit;
                    cand[j].set(d, v);
                    moved += g;
                }
            }
            if moved == 0 {
                continue;
            }
            let v = cand[r].get(d) + moved * unit;
            cand[r].set(d, v);
            let could = throughput_target(&s.inputs[r]).is_some_and(|t| (s.measured_cap)(r, &cand[r]) >= t);
            if could && !(s.tried)(&cand) {
                return Some(cand);
            }
        }
    }
    None
}
