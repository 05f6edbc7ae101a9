//! Memory plots of the VM memory controller (thesis 000, chapter 4): each container's memcg usage over
//! time per variant, and the usage ratio of every pair a `mem_ratio` check names against its target.

use super::{file_safe, time_chart, Line};
use crate::error::LabError;
use crate::results::ScenarioResult;
use crate::scenario::checks::measure::{ct_of, mib, series};
use crate::scenario::Scenario;

/// Whether a scenario uses the controller's outputs (a VM with `memctl`, or one of its checks).
pub fn wants_memory_plots(sc: &Scenario) -> bool {
    sc.vms.iter().any(|v| v.memctl.is_some())
}

/// Memory usage of every container over time (`memory_<variant>.png`), and for each pair of containers
/// a `mem_ratio` check names, their usage ratio over time in every variant against the target
/// (`ratio_<lhs>_<rhs>.png`, as Figures 4.6d, 4.7c and 4.9). Returns the file names.
pub fn memory_plots(res: &ScenarioResult, dir: &std::path::Path) -> Result<Vec<String>, LabError> {
    use plotters::style::{Color, Palette, Palette99};
    let color = |i: usize| Palette99::pick(i).to_rgba();
    let mut out = Vec::new();
    let mut pairs: Vec<(&str, &str, f64)> = Vec::new();
    for c in &res.scenario.checks {
        if let crate::scenario::CheckKind::MemRatio(m) = &c.kind {
            if !pairs.iter().any(|p| p.0 == m.lhs && p.1 == m.rhs) {
                pairs.push((&m.lhs, &m.rhs, m.target));
            }
        }
    }
    for (lhs, rhs, target) in pairs {
        let mut lines = Vec::new();
        for r in &res.runs {
            let (Ok(l), Ok(h)) = (ct_of(r, lhs), ct_of(r, rhs)) else { continue };
            let (a, b) = (series(r, l, 0.0, None), series(r, h, 0.0, None));
            let pts: Vec<(f64, f64)> = a
                .iter()
                .zip(&b)
                .filter(|(_, y)| y.memcg_pages > 0)
                .map(|(x, y)| (x.t_s, x.memcg_pages as f64 / y.memcg_pages as f64))
                .collect();
            lines.push(Line { label: r.variant.clone(), color: color(lines.len()), pts, dashed: Vec::new() });
        }
        let dur = res.runs.first().map_or(1.0, |r| r.duration_s);
        let ymax = lines
            .iter()
            .flat_map(|l| l.pts.iter().map(|p| p.1))
            .fold(target * 1.5, f64::max)
            .min(target * 4.0);
        let f = format!("ratio_{lhs}_{rhs}.png");
        let title = format!("{}: usage {lhs} / {rhs}", res.scenario.name);
        time_chart(&dir.join(&f), &title, "ratio", dur, ymax, &[(0.0, target), (dur, target)], lines)?;
        out.push(f);
    }
    for run in &res.runs {
        let lines = run
            .containers
            .iter()
            .enumerate()
            .filter(|(_, (_, _, enabled))| *enabled)
            .map(|(ci, (name, _, _))| Line {
                label: name.clone(),
                color: color(ci),
                pts: run.samples.iter().filter(|s| s.ct == ci).map(|s| (s.t_s, mib(s.memcg_pages))).collect(),
                dashed: Vec::new(),
            })
            .collect();
        let ymax = run.samples.iter().map(|s| mib(s.memcg_pages)).fold(1.0f64, f64::max) * 1.1;
        let f = format!("memory_{}.png", file_safe(&run.variant));
        let title = format!("{}: memcg usage ({})", res.scenario.name, run.variant);
        time_chart(&dir.join(&f), &title, "MiB", run.duration_s, ymax, &[], lines)?;
        out.push(f);
    }
    Ok(out)
}
