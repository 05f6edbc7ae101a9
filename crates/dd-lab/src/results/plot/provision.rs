//! Plots and report sections of provisioning (SPEC section 10b).
//!
//! Owns `curves_<variant>.png` (each provisioned container's curves at the last decision, with the
//! allocation marked: memory, memory plus memory cache, plus SSD cache on the page-cache curve, the
//! anonymous part on the anonymous curve), `target_<container>.png` (the container's throughput per
//! sample in every variant against its target), `limits_<variant>.png` (memory limits the provisioner
//! set, over time, with the usage) and `search_<variant>.png` (every candidate of a search: total
//! throughput, targets met), plus the HTML of the decisions and searches for `report.html`.

use super::{esc, file_safe, perr, register_font, time_chart, Line, COLORS};
use crate::error::LabError;
use crate::results::ScenarioResult;
use dd_provision::Target;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// Whether the scenario has anything of provisioning to show.
pub fn wanted(res: &ScenarioResult) -> bool {
    res.scenario.vms.iter().any(|v| v.provision.is_some())
        || res.scenario.containers().any(|(_, _, c)| c.target.is_some())
        || !res.searches.is_empty()
}

/// Writes the plots; returns their file names.
pub fn plots(res: &ScenarioResult, dir: &Path) -> Result<Vec<String>, LabError> {
    let mut out = Vec::new();
    for run in &res.runs {
        if run.curves.is_empty() {
            continue;
        }
        let f = format!("curves_{}.png", file_safe(&run.variant));
        curves_plot(res, run, &dir.join(&f))?;
        out.push(f);
        let f = format!("limits_{}.png", file_safe(&run.variant));
        limits_plot(res, run, &dir.join(&f))?;
        out.push(f);
    }
    for (_, _, c) in res.scenario.containers() {
        let Some(t) = c.target else { continue };
        let f = format!("target_{}.png", file_safe(&c.name));
        target_plot(res, &c.name, &t, &dir.join(&f))?;
        out.push(f);
    }
    for s in &res.searches {
        let f = format!("search_{}.png", file_safe(&s.variant));
        search_plot(res, s, &dir.join(&f))?;
        out.push(f);
    }
    Ok(out)
}

fn mib(pages: f64) -> f64 {
    pages / 256.0
}

/// One panel per container: its curves at the last decision and what the plan gave it.
fn curves_plot(res: &ScenarioResult, run: &crate::sim::RunResult, path: &Path) -> Result<(), LabError> {
    register_font();
    let n = run.curves.len();
    let cols = n.clamp(1, 2);
    let rows = n.div_ceil(cols);
    let root = BitMapBackend::new(path, (900, 300 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let title =
        format!("{}: curves at the last decision and the allocation ({})", res.scenario.name, run.variant);
    let (top, body) = root.split_vertically(40);
    top.draw_text(&title, &("sans-serif", 18).into_text_style(&top), (10, 10)).map_err(perr)?;
    let panels = body.split_evenly((rows, cols));
    for (snap, area) in run.curves.iter().zip(panels.iter()) {
        let a = &snap.allocation;
        let xmax = snap.file.iter().chain(&snap.anon).map(|c| mib(c.max_size() as f64)).fold(1.0, f64::max);
        let caption = format!(
            "{} at {:.0} s: limit {:.0} MiB, cache {:.0} + {:.0} MiB",
            snap.container,
            snap.t_s,
            mib(a.memory_pages as f64),
            mib(a.mem_cache_pages as f64),
            mib(a.ssd_cache_pages as f64)
        );
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 13))
            .margin(6)
            .x_label_area_size(28)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..xmax, 0f64..1.02f64)
            .map_err(perr)?;
        chart.configure_mesh().x_desc("cache size (MiB)").y_desc("miss ratio").draw().map_err(perr)?;
        let pts = |c: &dd_provision::Curve| c.points().map(|(s, m)| (mib(s as f64), m)).collect::<Vec<_>>();
        let file_c = COLORS[0];
        if let Some(f) = &snap.file {
            chart
                .draw_series(LineSeries::new(pts(f), file_c.stroke_width(2)))
                .map_err(perr)?
                .label("page-cache reads")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], file_c.stroke_width(2)));
        }
        let anon_c = COLORS[1];
        if let Some(an) = &snap.anon {
            chart
                .draw_series(LineSeries::new(pts(an), anon_c.stroke_width(2)))
                .map_err(perr)?
                .label("anonymous accesses")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], anon_c.stroke_width(2)));
        }
        // The allocation: where each level ends on the curve that level serves.
        let mut marks = Vec::new();
        if snap.file.is_some() {
            marks.push((snap.file_pages, file_c, "memory (file pages)"));
        }
        if snap.file.is_some() && a.mem_cache_pages > 0 {
            marks.push((snap.file_pages + a.mem_cache_pages as f64, COLORS[2], "+ memory cache"));
        }
        if snap.file.is_some() && a.ssd_cache_pages > 0 {
            let x = snap.file_pages + (a.mem_cache_pages + a.ssd_cache_pages) as f64;
            marks.push((x, COLORS[4], "+ SSD cache"));
        }
        if snap.anon.is_some() {
            marks.push((snap.anon_pages, anon_c, "memory (anonymous)"));
        }
        for (x, color, label) in marks {
            let x = mib(x).min(xmax);
            chart
                .draw_series(DashedLineSeries::new(vec![(x, 0.0), (x, 1.02)], 5, 4, color.stroke_width(1)))
                .map_err(perr)?
                .label(label)
                .legend(move |(lx, ly)| {
                    PathElement::new(vec![(lx, ly), (lx + 16, ly)], color.stroke_width(1))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 11))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(perr)?;
    }
    root.present().map_err(perr)?;
    Ok(())
}

/// The memory limit of every container over time (dashed) and its usage (solid).
fn limits_plot(res: &ScenarioResult, run: &crate::sim::RunResult, path: &Path) -> Result<(), LabError> {
    let mut lines = Vec::new();
    let mut ymax = 1.0f64;
    for (ci, (name, _, en)) in run.containers.iter().enumerate() {
        if !*en {
            continue;
        }
        let mine = || run.samples.iter().filter(move |s| s.ct == ci && s.running);
        let pts: Vec<(f64, f64)> = mine().map(|s| (s.t_s, mib(s.memcg_pages as f64))).collect();
        let dashed: Vec<(f64, f64)> = mine().map(|s| (s.t_s, mib(s.limit_pages as f64))).collect();
        ymax = pts.iter().chain(&dashed).map(|p| p.1).fold(ymax, f64::max);
        lines.push(Line { label: name.clone(), color: COLORS[ci % COLORS.len()].to_rgba(), pts, dashed });
    }
    let title = format!("{}: memory use and limit ({})", res.scenario.name, run.variant);
    time_chart(path, &title, "MiB", run.duration_s, ymax * 1.1, &[], lines)
}

/// What a target plot draws per sample.
type SampleValue = Box<dyn Fn(&crate::sim::Sample) -> f64>;

/// A container's throughput (or latency) per sample in every variant, and its target.
fn target_plot(res: &ScenarioResult, name: &str, t: &Target, path: &Path) -> Result<(), LabError> {
    let dt = res.scenario.sample_interval_s;
    let (value, goal, unit): (SampleValue, f64, &str) = match *t {
        Target::Throughput { ops_s } => (Box::new(move |s| s.ops as f64 / dt), ops_s, "ops/s"),
        Target::MeanLatency { ms } => (
            Box::new(|s| if s.ops > 0 { s.lat_ns as f64 / s.ops as f64 / 1e6 } else { 0.0 }),
            ms,
            "ms per operation",
        ),
        Target::HitRatio { ratio } => (
            Box::new(|s| {
                let acc = s.pc_hits + s.pc_misses;
                if acc == 0 {
                    0.0
                } else {
                    1.0 - s.disk_reads.min(acc) as f64 / acc as f64
                }
            }),
            ratio,
            "hit ratio",
        ),
    };
    let mut lines = Vec::new();
    let mut ymax = goal * 1.5;
    let mut dur = 1.0f64;
    for (vi, run) in res.runs.iter().enumerate() {
        let Some(ci) = run.containers.iter().position(|c| c.0 == name && c.2) else { continue };
        dur = dur.max(run.duration_s);
        let pts: Vec<(f64, f64)> =
            run.samples.iter().filter(|s| s.ct == ci && s.running).map(|s| (s.t_s, value(s))).collect();
        ymax = pts.iter().map(|p| p.1).fold(ymax, f64::max);
        lines.push(Line {
            label: run.variant.clone(),
            color: COLORS[vi % COLORS.len()].to_rgba(),
            pts,
            dashed: Vec::new(),
        });
    }
    let title = format!("{}: {name} against its target (dashed)", res.scenario.name);
    time_chart(path, &title, unit, dur, ymax * 1.05, &[(0.0, goal), (dur, goal)], lines)
}

/// Every candidate of a search: total throughput, darker the more targets it met; the best marked.
fn search_plot(
    res: &ScenarioResult,
    s: &crate::results::search::SearchResult,
    path: &Path,
) -> Result<(), LabError> {
    register_font();
    let root = BitMapBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let n = s.candidates.len().max(1);
    let ymax = s.candidates.iter().map(|c| c.throughput_ops_s).fold(1.0, f64::max) * 1.15;
    let most = s.candidates.iter().map(|c| c.targets_met).max().unwrap_or(0).max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: search {} ({} candidates; shade = targets met, red = best)",
                res.scenario.name, s.variant, n
            ),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)
        .map_err(perr)?;
    chart.configure_mesh().disable_x_mesh().x_desc("candidate").y_desc("total ops/s").draw().map_err(perr)?;
    let bars: Vec<_> = s
        .candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let color = if c.name == s.best {
                RGBColor(214, 39, 40).filled()
            } else {
                let k = 0.25 + 0.75 * c.targets_met as f64 / most as f64;
                COLORS[0].mix(k).filled()
            };
            Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, c.throughput_ops_s)], color)
        })
        .collect();
    chart.draw_series(bars).map_err(perr)?;
    root.present().map_err(perr)?;
    Ok(())
}

/// The decisions and searches as HTML, for `report.html`.
pub fn html(res: &ScenarioResult) -> String {
    let mut h = String::new();
    for s in &res.searches {
        let _ = write!(
            h,
            "<h2>Search {}</h2><p>{} candidates; best: {}</p><table><tr><th>candidate</th><th>targets met</th>\
             <th>total ops/s</th><th>time below target (s)</th></tr>",
            esc(&s.variant),
            s.candidates.len(),
            esc(&s.best)
        );
        for c in &s.candidates {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.0}</td></tr>",
                esc(&c.name),
                c.targets_met,
                c.throughput_ops_s,
                c.violation_s
            );
        }
        h.push_str("</table>");
    }
    for run in res.runs.iter().filter(|r| !r.decisions.is_empty()) {
        let _ = write!(
            h,
            "<h2>Provisioner decisions ({})</h2><table><tr><th>time s</th><th>container</th><th>limit MiB</th>\
             <th>mem cache MiB</th><th>SSD cache MiB</th><th>measured ops/s</th><th>predicted ops/s</th>\
             <th>target met</th></tr>",
            esc(&run.variant)
        );
        for d in &run.decisions {
            for c in &d.containers {
                let _ = write!(
                    h,
                    "<tr><td>{:.0}</td><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td>\
                     <td>{:.0}</td><td>{}</td></tr>",
                    d.t_s,
                    esc(&c.name),
                    c.memory_limit_mib,
                    c.mem_cache_mib,
                    c.ssd_cache_mib,
                    c.measured_ops_s,
                    c.predicted_ops_s,
                    match c.target_met {
                        Some(true) => "yes",
                        Some(false) => "no",
                        None => "-",
                    }
                );
            }
        }
        h.push_str("</table>");
    }
    h
}
