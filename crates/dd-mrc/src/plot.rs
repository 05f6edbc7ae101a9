//! PNG plots of miss-ratio curves (feature `plot`): one line per curve, optional vertical marks (a
//! chosen allocation), drawn with plotters' bitmap backend and the DejaVu font the lab bundles, so no
//! system font library is needed.

use crate::{Curve, Unit};
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../dd-lab/assets/DejaVuSansMono.ttf");
static REGISTER: Once = Once::new();

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
];

/// A vertical line at `size` with a label (for example the allocation a provisioner chose).
#[derive(Debug, Clone)]
pub struct Mark {
    pub size: f64,
    pub label: String,
}

/// Drawing failed (a file that cannot be written, or a backend error).
#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {message}")]
pub struct PlotError {
    pub path: String,
    pub message: String,
}

/// Writes `series` (label, curve) as a PNG line chart of miss ratio against cache size.
pub fn write_png(
    path: &Path,
    title: &str,
    series: &[(&str, &Curve)],
    marks: &[Mark],
) -> Result<(), PlotError> {
    REGISTER.call_once(|| {
        // The font is bundled and known good; failure would only mean unlabelled plots.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
    let err =
        |e: &dyn std::fmt::Display| PlotError { path: path.display().to_string(), message: e.to_string() };
    let x_max = series
        .iter()
        .map(|(_, c)| c.max_size() as f64)
        .chain(marks.iter().map(|m| m.size))
        .fold(1.0f64, f64::max);
    let unit = series.first().map_or(Unit::Pages, |(_, c)| c.unit());
    let x_label = match unit {
        Unit::Pages => "cache size (pages)",
        Unit::Bytes => "cache size (bytes)",
    };
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max * 1.02, 0f64..1.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("miss ratio")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, curve)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(curve.points().map(|(s, m)| (s as f64, m)), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    for m in marks {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(m.size, 0.0), (m.size, 1.0)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(std::iter::once(Text::new(m.label.clone(), (m.size, 0.97), ("sans-serif", 14))))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
