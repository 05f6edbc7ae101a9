//! Evaluation of the memory controller's checks (thesis 000, chapter 4: Figures 4.2-4.9) over the
//! runs' samples: usage ratios against a target, soft-limit exceed gaps, directed against LRU reclaim,
//! and the protection of a gold container. The checks' settings are `crate::scenario::memctl`.

use super::threshold;
use crate::scenario::memctl::{ExceedGapCheck, MemRatioCheck, ProtectedCheck, ReclaimModeCheck, Stat};
use crate::scenario::{mib_pages, Scenario};
use crate::sim::{RunResult, Sample};

fn run<'a>(runs: &'a [RunResult], v: Option<&String>) -> Result<&'a RunResult, String> {
    match v {
        None => runs.first().ok_or_else(|| "no run".to_string()),
        Some(v) => runs.iter().find(|r| &r.variant == v).ok_or_else(|| format!("no variant {v}")),
    }
}

pub(crate) fn ct_of(r: &RunResult, name: &str) -> Result<usize, String> {
    r.containers
        .iter()
        .position(|(c, _, en)| c == name && *en)
        .ok_or_else(|| format!("{name} does not run in variant {}", r.variant))
}

/// Samples of container `ct` in `(from, to]`, in time order.
pub(crate) fn series(r: &RunResult, ct: usize, from: f64, to: Option<f64>) -> Vec<&Sample> {
    let to = to.unwrap_or(r.duration_s);
    r.samples.iter().filter(|s| s.ct == ct && s.t_s > from + 1e-9 && s.t_s <= to + 1e-9).collect()
}

pub(crate) fn mib(pages: u64) -> f64 {
    pages as f64 / 256.0
}

/// Per-sample deviations `|lhs/rhs / target - 1|` (samples where `rhs` holds nothing are skipped).
fn ratio_devs(r: &RunResult, c: &MemRatioCheck) -> Result<Vec<f64>, String> {
    let (l, h) = (ct_of(r, &c.lhs)?, ct_of(r, &c.rhs)?);
    let (a, b) = (series(r, l, c.from_s, c.to_s), series(r, h, c.from_s, c.to_s));
    let d: Vec<f64> = a
        .iter()
        .zip(&b)
        .filter(|(_, y)| y.memcg_pages > 0)
        .map(|(x, y)| (x.memcg_pages as f64 / y.memcg_pages as f64 / c.target - 1.0).abs())
        .collect();
    if d.is_empty() {
        return Err(format!("no samples of {} and {} in the window", c.lhs, c.rhs));
    }
    Ok(d)
}

fn in_range(x: f64, min: Option<f64>, max: Option<f64>) -> bool {
    min.is_none_or(|m| x >= m) && max.is_none_or(|m| x <= m)
}

/// A bound as written in a scenario (scaled bounds print without float noise).
fn range_text(min: Option<f64>, max: Option<f64>) -> String {
    let (min, max) = (min.map(threshold), max.map(threshold));
    match (min, max) {
        (Some(a), Some(b)) => format!("want in [{a}, {b}]"),
        (Some(a), None) => format!("want >= {a}"),
        (None, Some(b)) => format!("want <= {b}"),
        (None, None) => "no bound".into(),
    }
}

pub fn eval_mem_ratio(runs: &[RunResult], c: &MemRatioCheck) -> Result<(bool, String), String> {
    let variants: Vec<Option<&String>> =
        if c.variants.is_empty() { vec![None] } else { c.variants.iter().map(Some).collect() };
    let mut ok = true;
    let mut stats = Vec::new();
    let mut parts = Vec::new();
    for v in variants {
        let r = run(runs, v)?;
        let d = ratio_devs(r, c)?;
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        let max = d.iter().copied().fold(0.0, f64::max);
        let s = match c.stat {
            Stat::Max => max,
            Stat::Mean => mean,
        };
        let this = in_range(s, c.min_dev, c.max_dev);
        ok &= this;
        stats.push(s);
        parts.push(format!(
            "{}: mean dev {:.1}%, max dev {:.1}% over {} samples{}",
            r.variant,
            mean * 100.0,
            max * 100.0,
            d.len(),
            if this { "" } else { " FAIL" }
        ));
    }
    let mut text = format!(
        "usage {}/{} vs {} ({} dev {}): {}",
        c.lhs,
        c.rhs,
        c.target,
        if c.stat == Stat::Max { "max" } else { "mean" },
        range_text(c.min_dev, c.max_dev),
        parts.join("; ")
    );
    if c.increasing {
        let grows = stats.windows(2).all(|w| w[1] >= w[0] * 0.99)
            && stats.len() >= 2
            && stats[stats.len() - 1] > stats[0];
        ok &= grows;
        text.push_str(&format!("; increasing along the variants: {}", if grows { "yes" } else { "NO" }));
    }
    Ok((ok, text))
}

/// Soft limit of a container in pages (`u64::MAX` when none), from the scaled scenario.
fn soft_pages(sc: &Scenario, name: &str) -> u64 {
    sc.containers()
        .find(|(_, _, c)| c.name == name)
        .and_then(|(_, _, c)| c.soft_limit_mib)
        .map_or(u64::MAX, mib_pages)
}

pub fn eval_exceed_gap(
    sc: &Scenario,
    runs: &[RunResult],
    c: &ExceedGapCheck,
) -> Result<(bool, String), String> {
    let r = run(runs, c.variant.as_ref())?;
    let (l, h) = (ct_of(r, &c.lhs)?, ct_of(r, &c.rhs)?);
    let (sl, sh) = (soft_pages(sc, &c.lhs), soft_pages(sc, &c.rhs));
    if sl == u64::MAX || sh == u64::MAX {
        return Err("both containers need a soft limit".into());
    }
    let (a, b) = (series(r, l, c.from_s, c.to_s), series(r, h, c.from_s, c.to_s));
    let gaps: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x.memcg_pages as f64 - sl as f64) - (y.memcg_pages as f64 - sh as f64)).abs() / 256.0)
        .collect();
    if gaps.is_empty() {
        return Err("no samples in the window".into());
    }
    let max = gaps.iter().copied().fold(0.0, f64::max);
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let ok = in_range(max, c.min_gap_mib, c.max_gap_mib);
    Ok((
        ok,
        format!(
            "exceed gap {}-{} over {} samples: max {max:.1} MiB, mean {mean:.1} MiB ({})",
            c.lhs,
            c.rhs,
            gaps.len(),
            range_text(c.min_gap_mib, c.max_gap_mib)
        ),
    ))
}

/// Directed and LRU pages reclaimed from `ct` between the window's first and last sample.
fn reclaimed(r: &RunResult, ct: usize, from: f64, to: Option<f64>) -> (u64, u64) {
    let before = r.samples.iter().rfind(|s| s.ct == ct && s.t_s <= from + 1e-9);
    let w = series(r, ct, from, to);
    let (d0, l0) = before.map_or((0, 0), |s| (s.reclaimed_directed, s.reclaimed_lru));
    w.last().map_or((0, 0), |s| (s.reclaimed_directed - d0, s.reclaimed_lru - l0))
}

pub fn eval_reclaim_mode(runs: &[RunResult], c: &ReclaimModeCheck) -> Result<(bool, String), String> {
    let r = run(runs, c.variant.as_ref())?;
    let (mut d, mut l) = (0, 0);
    for e in &c.entities {
        let (a, b) = reclaimed(r, ct_of(r, e)?, c.from_s, c.to_s);
        d += a;
        l += b;
    }
    if d + l == 0 {
        return Ok((false, "no VM-wide reclaim in the window".into()));
    }
    let f = d as f64 / (d + l) as f64;
    Ok((
        (c.min..=c.max).contains(&f),
        format!(
            "directed {:.1} MiB, LRU {:.1} MiB: directed fraction {f:.3} (want in [{}, {}])",
            mib(d),
            mib(l),
            threshold(c.min),
            threshold(c.max)
        ),
    ))
}

/// A container's floor: the controller's `floor_mib` where the VM's controller configures the container,
/// else its soft limit (what Linux's own reclaim takes a container down to before it falls back to the
/// global LRU), else nothing.
fn floor_pages(sc: &Scenario, name: &str) -> u64 {
    let configured = sc.vms.iter().filter_map(|v| v.memctl.as_ref()).find_map(|m| m.containers.get(name));
    match configured {
        Some(c) => mib_pages(c.floor_mib),
        None => sc
            .vms
            .iter()
            .flat_map(|v| &v.containers)
            .find(|c| c.name == name)
            .and_then(|c| c.soft_limit_mib)
            .map_or(0, mib_pages),
    }
}

pub fn eval_protected(
    sc: &Scenario,
    runs: &[RunResult],
    c: &ProtectedCheck,
) -> Result<(bool, String), String> {
    let r = run(runs, c.variant.as_ref())?;
    let slack = mib_pages(c.slack_mib);
    let g = series(r, ct_of(r, &c.protected)?, c.from_s, c.to_s);
    let others: Vec<(Vec<&Sample>, u64)> = c
        .others
        .iter()
        .map(|o| Ok((series(r, ct_of(r, o)?, c.from_s, c.to_s), floor_pages(sc, o))))
        .collect::<Result<_, String>>()?;
    let mut peak = 0u64;
    let mut worst_loss = 0u64;
    let mut reached_at = None;
    let mut guarded = 0;
    for (k, s) in g.iter().enumerate() {
        peak = peak.max(s.memcg_pages);
        let others_can_give = others.iter().any(|(o, f)| o.get(k).is_some_and(|x| x.memcg_pages > f + slack));
        if others_can_give {
            guarded += 1;
            worst_loss = worst_loss.max(peak - s.memcg_pages);
        } else if reached_at.is_none() {
            reached_at = Some(s.t_s);
        }
    }
    let min_after = reached_at
        .map(|t| g.iter().filter(|s| s.t_s >= t).map(|s| s.memcg_pages).min().unwrap_or(0))
        .unwrap_or(peak);
    let ok = worst_loss <= slack && reached_at.is_some() && guarded > 0;
    Ok((
        ok,
        format!(
            "{}: peak {:.1} MiB, largest loss while others could give {:.1} MiB over {guarded} samples (want \
             <= {:.1}); others at their floors from {}; {} then went down to {:.1} MiB",
            c.protected,
            mib(peak),
            mib(worst_loss),
            mib(slack),
            reached_at.map_or("never (FAIL)".into(), |t| format!("{t:.1} s")),
            c.protected,
            mib(min_after)
        ),
    ))
}
