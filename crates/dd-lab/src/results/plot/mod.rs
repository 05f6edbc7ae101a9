//! PNG plots of the papers' figure types and the HTML pages that tie a scenario's outputs together.
//!
//! Owns: `cache_<variant>.png` (second-chance cache use over time per container, with the memory-store
//! entitlement dashed, as Figures 3, 4, 9, 10, 12-14), `throughput.png` (per-container throughput bars
//! per variant relative to the first variant, as Figure 11), `report.html` and the `--all` index page;
//! [`provision`] those of provisioning (curves with the allocation, targets, limits, searches).
//! Text is drawn with a bundled DejaVu Sans Mono font (`assets/`, its licence beside it) through
//! plotters' `ab_glyph` backend, so no system font library is needed.

pub mod memory;
pub mod provision;

use crate::error::LabError;
use crate::results::ScenarioResult;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../../assets/DejaVuSansMono.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        // The font is bundled and known good; failure would only mean unlabelled plots.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn perr<E: std::fmt::Display>(e: E) -> LabError {
    LabError::Plot(e.to_string())
}

pub(crate) fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' })
        .collect()
}

/// One line of a [`time_chart`]: solid with a legend entry, and an optional dashed companion in the same
/// colour without one (an entitlement).
pub(crate) struct Line {
    pub label: String,
    pub color: RGBAColor,
    pub pts: Vec<(f64, f64)>,
    pub dashed: Vec<(f64, f64)>,
}

type Chart<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn draw_legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, position: SeriesLabelPosition) -> Result<(), LabError> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(perr)
}

/// The chart every over-time plot of the lab is: 900x480, time in seconds on x from 0 to `duration_s`,
/// `y_desc` on y from 0 to `ymax`, a black dashed `reference` line (a target) when given, the lines,
/// the legend at the upper right.
pub(crate) fn time_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    duration_s: f64,
    ymax: f64,
    reference: &[(f64, f64)],
    lines: Vec<Line>,
) -> Result<(), LabError> {
    register_font();
    let root = BitMapBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..duration_s, 0f64..ymax)
        .map_err(perr)?;
    chart.configure_mesh().x_desc("time (s)").y_desc(y_desc).draw().map_err(perr)?;
    if !reference.is_empty() {
        chart
            .draw_series(DashedLineSeries::new(reference.to_vec(), 6, 4, BLACK.stroke_width(1)))
            .map_err(perr)?;
    }
    for line in lines {
        let color = line.color;
        chart
            .draw_series(LineSeries::new(line.pts, color.stroke_width(2)))
            .map_err(perr)?
            .label(line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        if !line.dashed.is_empty() {
            chart
                .draw_series(DashedLineSeries::new(line.dashed, 6, 4, color.stroke_width(1)))
                .map_err(perr)?;
        }
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(perr)?;
    Ok(())
}

fn cache_plot(res: &ScenarioResult, vi: usize, path: &Path) -> Result<(), LabError> {
    let run = &res.runs[vi];
    let ymax = run
        .samples
        .iter()
        .map(|s| ((s.mem_used + s.ssd_used).max(s.mem_ent)) as f64 / 256.0)
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut lines = Vec::new();
    for (ci, (name, _, en)) in run.containers.iter().enumerate() {
        if !*en {
            continue;
        }
        let mine = || run.samples.iter().filter(move |s| s.ct == ci);
        let ent: Vec<(f64, f64)> = mine().map(|s| (s.t_s, s.mem_ent as f64 / 256.0)).collect();
        lines.push(Line {
            label: name.clone(),
            color: COLORS[ci % COLORS.len()].to_rgba(),
            pts: mine().map(|s| (s.t_s, (s.mem_used + s.ssd_used) as f64 / 256.0)).collect(),
            dashed: if ent.iter().any(|p| p.1 > 0.0) { ent } else { Vec::new() },
        });
    }
    let title = format!("{}: second-chance cache use ({})", res.scenario.name, run.variant);
    time_chart(path, &title, "MiB", run.duration_s, ymax, &[], lines)
}

/// Throughput of each container in each variant, relative to the first variant.
fn throughput_plot(res: &ScenarioResult, path: &Path) -> Result<(), LabError> {
    let base = &res.runs[0];
    let names: Vec<&str> = base.containers.iter().map(|c| c.0.as_str()).collect();
    let tput = |vi: usize, ci: usize| {
        let t = &res.runs[vi].totals[ci];
        if t.run_s > 0.0 {
            t.ops as f64 / t.run_s
        } else {
            0.0
        }
    };
    let nv = res.runs.len();
    let mut vals = Vec::new();
    let mut ymax = 1.0f64;
    for ci in 0..names.len() {
        for vi in 0..nv {
            let b = (0..nv).map(|v| tput(v, ci)).find(|x| *x > 0.0).unwrap_or(0.0);
            let v = if b > 0.0 { tput(vi, ci) / b } else { 0.0 };
            ymax = ymax.max(v);
            vals.push((ci, vi, v));
        }
    }
    let root = BitMapBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let n = names.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: throughput relative to the first variant that runs it", res.scenario.name),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n, 0f64..ymax * 1.15)
        .map_err(perr)?;
    let names2 = names.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len() * 2 + 1)
        .x_label_formatter(&move |x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 && i < names2.len() {
                names2[i].to_string()
            } else {
                String::new()
            }
        })
        .y_desc("x first variant")
        .draw()
        .map_err(perr)?;
    let w = 0.8 / nv as f64;
    for vi in 0..nv {
        let color = COLORS[vi % COLORS.len()];
        let bars: Vec<_> = vals
            .iter()
            .filter(|(_, v, _)| *v == vi)
            .map(|(ci, _, y)| {
                let x0 = *ci as f64 + 0.1 + vi as f64 * w;
                Rectangle::new([(x0, 0.0), (x0 + w * 0.9, *y)], color.filled())
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(perr)?
            .label(res.runs[vi].variant.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(perr)?;
    Ok(())
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Writes the PNGs and `report.html` of one scenario into `dir`.
pub fn write_plots_and_report(res: &ScenarioResult, dir: &Path) -> Result<(), LabError> {
    register_font();
    std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
    let mut imgs = Vec::new();
    for (vi, run) in res.runs.iter().enumerate() {
        let f = format!("cache_{}.png", file_safe(&run.variant));
        cache_plot(res, vi, &dir.join(&f))?;
        imgs.push(f);
    }
    throughput_plot(res, &dir.join("throughput.png"))?;
    imgs.push("throughput.png".into());
    if memory::wants_memory_plots(&res.scenario) {
        imgs.extend(memory::memory_plots(res, dir)?);
    }
    let provisioning = provision::wanted(res);
    if provisioning {
        imgs.extend(provision::plots(res, dir)?);
    }
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{0}</title><style>body{{font-family:sans-serif;\
         max-width:1000px;margin:auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 6px;\
         text-align:right}}td:first-child{{text-align:left}}.pass{{color:#080}}.fail{{color:#b00;font-weight:bold}}\
         </style></head><body><h1>{0}</h1><p>{1}</p><p>seed {2}, scale {3}, {4} emulated seconds. Data: \
         <a href=\"summary.json\">summary.json</a>, <a href=\"timeseries.csv\">timeseries.csv</a>.</p><h2>Checks</h2><ul>",
        esc(&res.scenario.name),
        esc(&res.scenario.description),
        res.scenario.seed,
        res.scale,
        res.scenario.duration_s
    );
    for c in &res.checks {
        let _ = write!(
            h,
            "<li><span class=\"{}\">{}</span> {}: {}</li>",
            if c.passed { "pass" } else { "fail" },
            if c.passed { "pass" } else { "FAIL" },
            esc(&c.name),
            esc(&c.detail)
        );
    }
    h.push_str(
        "</ul><h2>Per container (Table 2 columns)</h2><table><tr><th>variant</th><th>container</th>\
                <th>ops/s</th><th>MiB/s</th><th>latency ms</th><th>lookup-to-store %</th><th>evictions</th>\
                <th>mean cache MiB</th></tr>",
    );
    for run in &res.runs {
        for (ci, (name, _, en)) in run.containers.iter().enumerate() {
            if !*en {
                continue;
            }
            let t = &run.totals[ci];
            let rs = t.run_s.max(1e-9);
            let puts = t.cache.mem.puts + t.cache.ssd.puts;
            let hits = t.cache.mem.gets_hit + t.cache.ssd.gets_hit;
            let used: Vec<u64> =
                run.samples.iter().filter(|s| s.ct == ci).map(|s| s.mem_used + s.ssd_used).collect();
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.1}</td><td>{:.3}</td><td>{:.1}</td><td>{}</td>\
                 <td>{:.1}</td></tr>",
                esc(&run.variant),
                esc(name),
                t.ops as f64 / rs,
                t.bytes as f64 / 1048576.0 / rs,
                if t.ops > 0 { t.lat_ns as f64 / t.ops as f64 / 1e6 } else { 0.0 },
                if puts > 0 { hits as f64 / puts as f64 * 100.0 } else { 0.0 },
                t.cache.mem.evictions + t.cache.ssd.evictions,
                if used.is_empty() { 0.0 } else { used.iter().sum::<u64>() as f64 / used.len() as f64 / 256.0 }
            );
        }
    }
    h.push_str("</table>");
    if provisioning {
        h.push_str(&provision::html(res));
    }
    h.push_str("<h2>Plots</h2>");
    for i in &imgs {
        let _ = write!(h, "<p><img src=\"{i}\" alt=\"{i}\" width=\"900\"></p>");
    }
    h.push_str("</body></html>\n");
    let p = dir.join("report.html");
    std::fs::write(&p, h).map_err(|e| LabError::io(&p, e))
}

/// Writes `index.html` in `dir` linking each scenario's report (in subfolders named after them).
pub fn write_index(results: &[(&str, &ScenarioResult)], dir: &Path) -> Result<(), LabError> {
    std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>DoubleDecker lab</title></head>\
         <body style=\"font-family:sans-serif;max-width:1000px;margin:auto\"><h1>DoubleDecker lab results</h1><ul>",
    );
    for (name, r) in results {
        let passed = r.checks.iter().filter(|c| c.passed).count();
        let _ = write!(
            h,
            "<li><a href=\"{0}/report.html\">{0}</a>: {1}/{2} checks pass{3}</li>",
            esc(name),
            passed,
            r.checks.len(),
            if r.all_passed() { "" } else { " <b>(FAILURES)</b>" }
        );
    }
    h.push_str("</ul></body></html>\n");
    let p = dir.join("index.html");
    std::fs::write(&p, h).map_err(|e| LabError::io(&p, e))
}
