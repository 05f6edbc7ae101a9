//! Searches collapsed to their best candidate, scored by the `targets` and `violation` checks' own
//! measures (`crate::scenario::checks::{targets, violation}`).
//!
//! A searching variant's candidates run as variants of their own; [`collapse`] then puts the best one in
//! the searching variant's place, under its name, so that every check, plot and summary treats it as the
//! variant, and keeps each candidate's score for `summary.json`. Scores use only emulated results, so
//! the pick is as deterministic as the runs.

use crate::record::RunResult;
use crate::scenario::checks::targets::{standing, targeted, window_measure};
use crate::scenario::checks::violation::violation_s;
use crate::scenario::checks::{measure, Metric};
use crate::scenario::provision::Pick;
use crate::scenario::{Scenario, Variant};
use serde::Serialize;

/// One candidate of a search and how it did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub name: String,
    pub targets_met: usize,
    /// Rounded to 0.001 ops/s as `summary.json` shows it.
    pub throughput_ops_s: f64,
    pub violation_s: f64,
    /// The throughput the pick compares (before rounding): a sweep's points carry it so that the best
    /// of a search run as points is the one the search itself picks ([`best`]).
    #[serde(skip)]
    pub unrounded_throughput_ops_s: f64,
}

/// A searching variant: every candidate tried, and the one that stands for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchResult {
    pub variant: String,
    pub best: String,
    pub candidates: Vec<Candidate>,
}

/// Puts each searching variant's best candidate in its place (see the module doc). `ran` are the
/// variants in the order `runs` came back.
pub fn collapse(sc: &Scenario, ran: &[Variant], runs: Vec<RunResult>) -> (Vec<RunResult>, Vec<SearchResult>) {
    if ran.iter().all(|v| v.search_of.is_none()) {
        return (runs, Vec::new());
    }
    let targets = targeted(sc);
    let mut out = Vec::new();
    let mut searches = Vec::new();
    let mut slots: Vec<Option<RunResult>> = runs.into_iter().map(Some).collect();
    for v in sc.variant_list() {
        let Some(search) = &v.search else {
            if let Some(i) = ran.iter().position(|r| r.name == v.name && r.search_of.is_none()) {
                out.extend(slots[i].take());
            }
            continue;
        };
        let members: Vec<usize> = ran
            .iter()
            .enumerate()
            .filter(|(_, r)| r.search_of.as_deref() == Some(&v.name))
            .map(|(i, _)| i)
            .collect();
        let all: Vec<RunResult> = members.iter().filter_map(|&i| slots[i].clone()).collect();
        let mut cands = Vec::new();
        for r in &all {
            let mut met = 0;
            let mut viol = 0.0;
            let (from, to) = (search.from_s.unwrap_or(0.0), search.to_s.unwrap_or(r.duration_s));
            for (n, t) in &targets {
                if standing(&all, &r.variant, n, t, search.from_s, search.to_s).is_ok_and(|s| s.0) {
                    met += 1;
                }
                viol += violation_s(sc, r, n, t, from, to);
            }
            let x: f64 = r
                .containers
                .iter()
                .filter(|c| c.2)
                .filter_map(|c| {
                    measure(
                        &all,
                        &window_measure(&r.variant, &c.0, Metric::Throughput, search.from_s, search.to_s),
                    )
                    .ok()
                })
                .sum();
            cands.push(Candidate {
                name: r.variant.clone(),
                targets_met: met,
                throughput_ops_s: x,
                violation_s: viol,
                unrounded_throughput_ops_s: x,
            });
        }
        let Some(best) = best(search.pick, &cands) else {
            continue;
        };
        if let Some(mut r) = slots[members[best]].take() {
            r.variant = v.name.clone();
            out.push(r);
        }
        for c in &mut cands {
            c.throughput_ops_s = (c.throughput_ops_s * 1000.0).round() / 1000.0;
        }
        searches.push(SearchResult {
            variant: v.name.clone(),
            best: cands[best].name.clone(),
            candidates: cands,
        });
    }
    (out, searches)
}

/// The index of the candidate a search picks (the first of the best, in candidate order), `None` when
/// there are none. Compares the unrounded throughputs.
pub fn best(pick: Pick, cands: &[Candidate]) -> Option<usize> {
    let better = |a: &Candidate, b: &Candidate| match pick {
        Pick::Throughput => {
            (a.targets_met, a.unrounded_throughput_ops_s) > (b.targets_met, b.unrounded_throughput_ops_s)
        }
        Pick::Violation => {
            a.violation_s < b.violation_s
                || (a.violation_s == b.violation_s
                    && a.unrounded_throughput_ops_s > b.unrounded_throughput_ops_s)
        }
    };
    (0..cands.len()).reduce(|b, i| if better(&cands[i], &cands[b]) { i } else { b })
}
