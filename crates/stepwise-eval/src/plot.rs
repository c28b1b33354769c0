//! Plots as PNG and SVG (plotters). Text needs a TrueType font: the first of a few common
//! system fonts is registered; without one, plots are skipped with a message.

use crate::bon::Curve;
use crate::labels::CalibrationSeries;
use anyhow::{bail, Result};
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

fn ensure_font() -> Result<()> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| {
        FONTS.iter().filter_map(|p| std::fs::read(p).ok()).any(|bytes| {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        })
    });
    if !ok {
        bail!("no TrueType font found (install fonts-dejavu-core) — plots skipped");
    }
    Ok(())
}

/// Matplotlib's tab10, then black and dark green, so the lab's eleven best-of-N curves all
/// differ.
const COLORS: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(0, 100, 60),
];

/// Curves with 95% interval bars on a log-scale x axis (each point's `n`), into `area`, with
/// their legend in a column to the right of the plot (where it covers no curve).
fn draw_curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    curves: &[Curve],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let width = area.dim_in_pixel().0 as i32;
    // The legend column fits the longest method name, "verifiers' base confidence (min)".
    let (area, legend) = area.split_horizontally(width - 250);
    let area = &area;
    let xs = || curves.iter().flat_map(|c| c.points.iter().map(|p| p.n));
    let max_n = xs().max().unwrap_or(1).max(2);
    let min_n = xs().min().unwrap_or(1).clamp(1, max_n - 1);
    // A tick at every N measured (on a log axis plotters would pick a few of its own, one on a
    // short range, none at the last point).
    let mut ticks: Vec<f64> = xs().map(|n| n as f64).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(
            (min_n as f64..max_n as f64).log_scale().with_key_points(ticks),
            0f64..1f64,
        )
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc(x_desc)
        .y_desc("accuracy")
        .x_label_formatter(&|x| format!("{}", x.round() as usize))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for (i, c) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = c.points.iter().map(|p| (p.n as f64, p.accuracy)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(c.method.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        chart
            .draw_series(c.points.iter().map(|p| {
                PathElement::new(
                    vec![(p.n as f64, p.lo), (p.n as f64, p.hi)],
                    color.mix(0.5).stroke_width(1),
                )
            }))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    for (i, c) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let y = 60 + 22 * i as i32;
        legend
            .draw(&PathElement::new(vec![(6, y), (30, y)], color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        legend
            .draw(&Text::new(c.method.clone(), (36, y - 7), ("sans-serif", 14)))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    Ok(())
}

/// Side-by-side panels of curves, each `(title, curves)`, sharing the x axis label.
fn draw_panels<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    x_desc: &str,
    panels: &[(String, Vec<Curve>)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    // Panels stacked (one 900×600 chart each): side by side they were 2,700 pixels wide and
    // squeezed unreadable into a report's column.
    for (area, (title, curves)) in root.split_evenly((panels.len().max(1), 1)).iter().zip(panels) {
        draw_curves(area, title, x_desc, curves)?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// Best-of-N curves (with 95% interval bars) to `stem.png` and `stem.svg`.
pub fn bon_plot(stem: &Path, title: &str, curves: &[Curve]) -> Result<()> {
    scaling_plot(stem, "N (samples per problem)", &[(title.to_string(), curves.to_vec())])
}

/// Accuracy against a budget on a log scale (each point's `n`: samples, tokens), one panel per
/// `(title, curves)`, stacked, to `stem.png` and `stem.svg`.
pub fn scaling_plot(stem: &Path, x_desc: &str, panels: &[(String, Vec<Curve>)]) -> Result<()> {
    ensure_font()?;
    let h = 600 * panels.len().max(1) as u32;
    let png = stem.with_extension("png");
    draw_panels(BitMapBackend::new(&png, (900, h)).into_drawing_area(), x_desc, panels)?;
    let svg = stem.with_extension("svg");
    draw_panels(SVGBackend::new(&svg, (900, h)).into_drawing_area(), x_desc, panels)?;
    Ok(())
}

/// Reliability diagrams, one series per scorer: `(label, bins of (mean p, frequency, count))`,
/// each bin's count written beside its point.
pub fn calibration_plot(stem: &Path, series: &[CalibrationSeries]) -> Result<()> {
    ensure_font()?;
    fn draw<DB: DrawingBackend>(
        root: DrawingArea<DB, plotters::coord::Shift>,
        series: &[CalibrationSeries],
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let e = |x: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{x:?}");
        root.fill(&WHITE).map_err(e)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Step-score calibration against oracle labels", ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..1f64, 0f64..1f64)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("predicted P(step correct)")
            .y_desc("fraction correct")
            .draw()
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(vec![(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.3)))
            .map_err(e)?;
        for (i, (label, bins)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = bins.iter().map(|b| (b.0, b.1)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(e)?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
            // Each bin's count beside its point: a bin of 3 steps says little.
            chart
                .draw_series(bins.iter().map(|b| {
                    EmptyElement::at((b.0, b.1))
                        + Text::new(
                            format!("n={}", b.2),
                            (6, -16),
                            ("sans-serif", 12).into_font().color(&color),
                        )
                }))
                .map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
        root.present().map_err(e)?;
        Ok(())
    }
    draw(
        BitMapBackend::new(&stem.with_extension("png"), (700, 600)).into_drawing_area(),
        series,
    )?;
    draw(
        SVGBackend::new(&stem.with_extension("svg"), (700, 600)).into_drawing_area(),
        series,
    )?;
    Ok(())
}

/// A panel of [`panels_plot`]: its y-axis label and its named series of `(x, y)` points.
pub type Panel = (String, Vec<(String, Vec<(f64, f64)>)>);

/// Line charts stacked vertically, one per panel, sharing the x axis label, to `stem.png` and
/// `stem.svg` (training curves: reward, accuracy, KL against update).
pub fn panels_plot(stem: &Path, title: &str, x_desc: &str, panels: &[Panel]) -> Result<()> {
    ensure_font()?;
    fn draw<DB: DrawingBackend>(
        root: DrawingArea<DB, plotters::coord::Shift>,
        title: &str,
        x_desc: &str,
        panels: &[Panel],
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: &dyn std::fmt::Debug| anyhow::anyhow!("{e:?}");
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))?;
        for (area, (y_desc, series)) in root.split_evenly((panels.len().max(1), 1)).into_iter().zip(panels) {
            let pts = series.iter().flat_map(|(_, p)| p.iter());
            let (mut x1, mut y0, mut y1) = (1f64, f64::INFINITY, f64::NEG_INFINITY);
            let mut whole_x = true;
            for &(x, y) in pts {
                x1 = x1.max(x);
                y0 = y0.min(y);
                y1 = y1.max(y);
                whole_x &= x.fract() == 0.0;
            }
            // Counts on the x axis (updates) get whole-number ticks only: at most one per unit.
            let x_ticks = if whole_x { (x1 as usize + 1).min(10) } else { 10 };
            if !y0.is_finite() {
                (y0, y1) = (0.0, 1.0);
            }
            let pad = ((y1 - y0) * 0.05).max(1e-6);
            let mut chart = ChartBuilder::on(&area)
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(55)
                .build_cartesian_2d(0f64..x1, (y0 - pad)..(y1 + pad))
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .x_labels(x_ticks)
                .x_label_formatter(&|x| {
                    if whole_x {
                        format!("{}", x.round())
                    } else {
                        format!("{x}")
                    }
                })
                .x_desc(x_desc)
                .y_desc(y_desc.as_str())
                .draw()
                .map_err(|e| err(&e))?;
            for (i, (name, p)) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(p.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
    let h = 300 * panels.len().max(1) as u32 + 40;
    draw(
        BitMapBackend::new(&stem.with_extension("png"), (900, h)).into_drawing_area(),
        title,
        x_desc,
        panels,
    )?;
    draw(
        SVGBackend::new(&stem.with_extension("svg"), (900, h)).into_drawing_area(),
        title,
        x_desc,
        panels,
    )?;
    Ok(())
}
