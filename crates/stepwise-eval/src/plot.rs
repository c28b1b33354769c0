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

/// Matplotlib's tab10, then ten darker or purer hues; series past the tenth are also drawn
/// dashed, so even the quick lab's fifteen best-of-N curves differ in colour and in stroke.
const COLORS: [RGBColor; 20] = [
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
    RGBColor(0, 0, 140),
    RGBColor(150, 0, 90),
    RGBColor(120, 120, 0),
    RGBColor(0, 130, 130),
    RGBColor(200, 150, 0),
    RGBColor(90, 50, 0),
    RGBColor(230, 0, 230),
    RGBColor(100, 100, 255),
];

/// How a curve's 95% intervals are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intervals {
    /// A translucent band from each point's `lo` to its `hi` (curves measured on one shared grid,
    /// as best-of-N's N).
    Bands,
    /// An error bar with caps at each point, nudged sideways per curve so that bars at the same x
    /// do not hide each other (curves measured at their own budgets, as search's tokens).
    Caps,
}

/// Whether series `index` (its palette index) is drawn dashed: those past the palette's first ten.
fn dashed(index: usize) -> bool {
    index % COLORS.len() >= 10
}

fn plot_err(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow::anyhow!("{e:?}")
}

/// A curve's line: solid in its palette colour for the first ten, dashed after.
fn draw_line<DB: DrawingBackend, CT: plotters::coord::CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'_, DB, CT>,
    pts: Vec<(f64, f64)>,
    index: usize,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let style = COLORS[index % COLORS.len()].stroke_width(2);
    if !dashed(index) {
        chart.draw_series(LineSeries::new(pts, style)).map_err(plot_err)?;
    } else {
        chart
            .draw_series(DashedLineSeries::new(pts, 8, 4, style))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// The measured Ns as ticks, leaving out one that would print on top of its neighbour (96 and 97
/// tokens): ticks closer than 4% of the log-scale axis are thinned, the largest always kept.
fn log_ticks(mut xs: Vec<f64>) -> Vec<f64> {
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let (Some(&first), Some(&last)) = (xs.first(), xs.last()) else {
        return xs;
    };
    let span = (last / first).ln().max(1e-9);
    let near = |a: f64, b: f64| (b / a).ln() / span < 0.04;
    let mut kept: Vec<f64> = Vec::new();
    for x in xs {
        match kept.last() {
            Some(&prev) if near(prev, x) => {
                if x == last {
                    kept.pop();
                    kept.push(x);
                }
            }
            _ => kept.push(x),
        }
    }
    kept
}

/// The y range the curves and their intervals need, padded, within [0, 1].
fn y_range(curves: &[Curve]) -> (f64, f64) {
    let ys = curves
        .iter()
        .flat_map(|c| c.points.iter())
        .flat_map(|p| [p.lo, p.hi, p.accuracy]);
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(0.02);
    ((lo - pad).max(0.0), (hi + pad).min(1.0))
}

/// Curves with 95% intervals on a log-scale x axis (each point's `n`), into `area`, with their
/// legend in a column to the right of the plot (where it covers no curve), as wide as the
/// longest name. `colors[i]` is curve `i`'s palette index (the same method keeps its colour in
/// every panel).
fn draw_curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    (title, x_desc): (&str, &str),
    curves: &[Curve],
    colors: &[usize],
    intervals: Intervals,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let names: Vec<&str> = curves.iter().map(|c| c.method.as_str()).collect();
    // The title over the plot and its legend together: over the plot alone, a long title next
    // to a wide legend ran off the image's left edge.
    let area = area
        .margin(8, 0, 0, 0)
        .titled(title, ("sans-serif", 22))
        .map_err(plot_err)?;
    let (area, legend) = with_legend_column(&area, &names)?;
    let xs = || curves.iter().flat_map(|c| c.points.iter().map(|p| p.n as f64));
    let max_n = xs().fold(2f64, f64::max);
    let min_n = xs().fold(f64::INFINITY, f64::min).clamp(1.0, max_n / 2.0);
    // Room either side for the nudged error bars at the first and last N.
    let span = (max_n / min_n).ln();
    let edge = if intervals == Intervals::Caps {
        (span * 0.05).exp()
    } else {
        1.0
    };
    let (y0, y1) = y_range(curves);
    let mut chart = ChartBuilder::on(&area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(
            (min_n / edge..max_n * edge)
                .log_scale()
                .with_key_points(log_ticks(xs().collect())),
            y0..y1,
        )
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc(x_desc)
        .y_desc("accuracy")
        .x_label_formatter(&|x| format!("{}", x.round() as usize))
        .draw()
        .map_err(plot_err)?;
    let k = curves.len() as f64;
    for (j, (c, &ci)) in curves.iter().zip(colors).enumerate() {
        let color = COLORS[ci % COLORS.len()];
        let pts: Vec<(f64, f64)> = c.points.iter().map(|p| (p.n as f64, p.accuracy)).collect();
        match intervals {
            Intervals::Bands => {
                let band = c.points.iter().map(|p| (p.n as f64, p.hi));
                let band = band.chain(c.points.iter().rev().map(|p| (p.n as f64, p.lo)));
                chart
                    .draw_series(std::iter::once(Polygon::new(band.collect::<Vec<_>>(), color.mix(0.12))))
                    .map_err(plot_err)?;
            }
            Intervals::Caps => {
                let nudge = (span * 0.008 * (j as f64 - (k - 1.0) / 2.0)).exp();
                let style = color.mix(0.6).stroke_width(1);
                let cap = (span * 0.006).exp();
                for p in &c.points {
                    let x = p.n as f64 * nudge;
                    let bar = [
                        vec![(x, p.lo), (x, p.hi)],
                        vec![(x / cap, p.lo), (x * cap, p.lo)],
                        vec![(x / cap, p.hi), (x * cap, p.hi)],
                    ];
                    chart
                        .draw_series(bar.into_iter().map(|line| PathElement::new(line, style)))
                        .map_err(plot_err)?;
                }
            }
        }
        draw_line(&mut chart, pts.clone(), ci)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(plot_err)?;
    }
    draw_legend(&legend, &names, colors, 24)
}

/// `area` split into the plot and a legend column at its right, as wide as the longest of
/// `names` needs (so no name is cut, and the legend covers no curve).
type Split<DB> = (
    DrawingArea<DB, plotters::coord::Shift>,
    DrawingArea<DB, plotters::coord::Shift>,
);
fn with_legend_column<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    names: &[&str],
) -> Result<Split<DB>>
where
    DB::ErrorType: 'static,
{
    let width = area.dim_in_pixel().0 as i32;
    let font: TextStyle = ("sans-serif", 14).into();
    let widest = names
        .iter()
        .map(|n| area.estimate_text_size(n, &font).map(|(w, _)| w as i32))
        .try_fold(0, |m, w| w.map(|w| m.max(w)))
        .map_err(plot_err)?;
    Ok(area.split_horizontally(width - (widest + 50).clamp(120, width / 2)))
}

/// The legend, one line a name from `top` down: a stroke in the series' colour (dashed past the
/// palette's first ten, as [`draw_line`] draws them) and the name.
fn draw_legend<DB: DrawingBackend>(
    legend: &DrawingArea<DB, plotters::coord::Shift>,
    names: &[&str],
    colors: &[usize],
    top: i32,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let font: TextStyle = ("sans-serif", 14).into();
    for (i, (name, &ci)) in names.iter().zip(colors).enumerate() {
        let y = top + 22 * i as i32;
        let style = COLORS[ci % COLORS.len()].stroke_width(2);
        let dashes: &[(i32, i32)] = if !dashed(ci) { &[(6, 30)] } else { &[(6, 14), (18, 26)] };
        for &(x0, x1) in dashes {
            legend
                .draw(&PathElement::new(vec![(x0, y), (x1, y)], style))
                .map_err(plot_err)?;
        }
        legend
            .draw(&Text::new(name.to_string(), (36, y - 7), font.clone()))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// Panels of curves stacked, each `(title, curves)`, sharing the x axis label; a method keeps
/// one colour across the panels.
fn draw_panels<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    x_desc: &str,
    panels: &[(String, Vec<Curve>)],
    intervals: Intervals,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let mut names: Vec<&str> = Vec::new();
    for c in panels.iter().flat_map(|(_, cs)| cs) {
        if !names.contains(&c.method.as_str()) {
            names.push(&c.method);
        }
    }
    // Panels stacked (one 900×600 chart each): side by side they were 2,700 pixels wide and
    // squeezed unreadable into a report's column.
    for (area, (title, curves)) in root.split_evenly((panels.len().max(1), 1)).iter().zip(panels) {
        let colors: Vec<usize> = curves
            .iter()
            .map(|c| names.iter().position(|n| *n == c.method).unwrap_or(0))
            .collect();
        draw_curves(area, (title, x_desc), curves, &colors, intervals)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Best-of-N curves with their 95% intervals to `stem.png` and `stem.svg`: bands for up to five
/// curves, error bars past that (a dozen translucent bands pile up into one grey area).
pub fn bon_plot(stem: &Path, title: &str, curves: &[Curve]) -> Result<()> {
    let intervals = if curves.len() <= 5 {
        Intervals::Bands
    } else {
        Intervals::Caps
    };
    scaling_plot(
        stem,
        "N (samples per problem)",
        &[(title.to_string(), curves.to_vec())],
        intervals,
    )
}

/// Accuracy against a budget on a log scale (each point's `n`: samples, tokens), one panel per
/// `(title, curves)`, stacked, to `stem.png` and `stem.svg`.
pub fn scaling_plot(stem: &Path, x_desc: &str, panels: &[(String, Vec<Curve>)], intervals: Intervals) -> Result<()> {
    ensure_font()?;
    let h = 600 * panels.len().max(1) as u32;
    let png = stem.with_extension("png");
    draw_panels(
        BitMapBackend::new(&png, (900, h)).into_drawing_area(),
        x_desc,
        panels,
        intervals,
    )?;
    let svg = stem.with_extension("svg");
    draw_panels(
        SVGBackend::new(&svg, (900, h)).into_drawing_area(),
        x_desc,
        panels,
        intervals,
    )?;
    Ok(())
}

/// Reliability diagrams, one series per scorer: `(label, bins of (mean p, frequency, count))`,
/// above a histogram of how many steps fell in each bin (a bin of 3 steps says little).
pub fn calibration_plot(stem: &Path, series: &[CalibrationSeries]) -> Result<()> {
    ensure_font()?;
    fn draw<DB: DrawingBackend>(
        root: DrawingArea<DB, plotters::coord::Shift>,
        series: &[CalibrationSeries],
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE).map_err(plot_err)?;
        let root = root
            .titled("Step-score calibration against oracle labels", ("sans-serif", 22))
            .map_err(plot_err)?;
        let h = root.dim_in_pixel().1 as i32;
        let (top, bottom) = root.split_vertically(h * 7 / 10);
        let mut chart = ChartBuilder::on(&top)
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..1f64, 0f64..1f64)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .y_desc("fraction correct")
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(vec![(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.3)))
            .map_err(plot_err)?
            .label("perfectly calibrated")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.3)));
        for (i, (label, bins)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = bins.iter().map(|b| (b.0, b.1)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        // Counts: one thin bar per series at each bin's mean score, side by side.
        let most = series
            .iter()
            .flat_map(|(_, b)| b.iter().map(|b| b.2))
            .max()
            .unwrap_or(1)
            .max(1);
        let mut hist = ChartBuilder::on(&bottom)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..1f64, 0f64..(most as f64 * 1.1))
            .map_err(plot_err)?;
        hist.configure_mesh()
            .light_line_style(WHITE)
            .x_desc("predicted P(step correct)")
            .y_desc("steps")
            .y_labels(4)
            .y_label_formatter(&|y| format!("{}", y.round() as usize))
            .draw()
            .map_err(plot_err)?;
        let k = series.len().max(1) as f64;
        for (i, (_, bins)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let left = |x: f64| x - 0.012 * k / 2.0 + 0.012 * i as f64;
            hist.draw_series(
                bins.iter()
                    .map(|b| Rectangle::new([(left(b.0), 0.0), (left(b.0) + 0.012, b.2 as f64)], color.filled())),
            )
            .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
        Ok(())
    }
    draw(
        BitMapBackend::new(&stem.with_extension("png"), (700, 700)).into_drawing_area(),
        series,
    )?;
    draw(
        SVGBackend::new(&stem.with_extension("svg"), (700, 700)).into_drawing_area(),
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
        root.fill(&WHITE).map_err(plot_err)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(plot_err)?;
        for (area, (y_desc, series)) in root.split_evenly((panels.len().max(1), 1)).into_iter().zip(panels) {
            let pts = series.iter().flat_map(|(_, p)| p.iter());
            let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, 1f64, f64::INFINITY, f64::NEG_INFINITY);
            let mut whole_x = true;
            for &(x, y) in pts {
                x0 = x0.min(x);
                x1 = x1.max(x);
                y0 = y0.min(y);
                y1 = y1.max(y);
                whole_x &= x.fract() == 0.0;
            }
            // Counts on the x axis (updates) get whole-number ticks only: at most one per unit.
            let x0 = x0.min(x1 - 1.0);
            let x_ticks = if whole_x { ((x1 - x0) as usize + 1).min(10) } else { 10 };
            if !y0.is_finite() {
                (y0, y1) = (0.0, 1.0);
            }
            let pad = ((y1 - y0) * 0.05).max(1e-6);
            let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
            let (area, legend) = with_legend_column(&area, &names)?;
            draw_legend(&legend, &names, &(0..names.len()).collect::<Vec<_>>(), 30)?;
            let mut chart = ChartBuilder::on(&area)
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(55)
                .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
                .map_err(plot_err)?;
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
                .map_err(plot_err)?;
            for (i, (_, p)) in series.iter().enumerate() {
                draw_line(&mut chart, p.clone(), i)?;
            }
        }
        root.present().map_err(plot_err)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bon::Point;

    #[test]
    fn ticks_that_would_overlap_are_thinned_keeping_the_largest() {
        assert_eq!(log_ticks(vec![8.0, 1.0, 2.0, 4.0, 2.0]), vec![1.0, 2.0, 4.0, 8.0]);
        // search's token budgets: 96 and 97 would print on top of each other.
        assert_eq!(
            log_ticks(vec![24.0, 27.0, 48.0, 84.0, 96.0, 97.0, 169.0]),
            vec![24.0, 27.0, 48.0, 84.0, 96.0, 169.0]
        );
        assert_eq!(log_ticks(vec![24.0, 160.0, 169.0]), vec![24.0, 169.0]);
        assert!(log_ticks(vec![]).is_empty());
    }

    fn curve(name: &str, at: &[(usize, f64)]) -> Curve {
        let points = at
            .iter()
            .map(|&(n, a)| Point {
                n,
                accuracy: a,
                lo: a - 0.05,
                hi: a + 0.05,
            })
            .collect();
        Curve {
            method: name.into(),
            points,
        }
    }

    #[test]
    fn the_y_axis_fits_the_curves_and_their_intervals() {
        let (lo, hi) = y_range(&[curve("a", &[(1, 0.6), (8, 0.9)])]);
        assert!((0.5..0.55).contains(&lo) && (0.95..=1.0).contains(&hi), "{lo} {hi}");
        assert_eq!(y_range(&[curve("a", &[(1, 0.02), (8, 0.99)])]), (0.0, 1.0));
        assert_eq!(y_range(&[]), (0.0, 1.0));
    }

    #[test]
    fn many_curves_and_long_names_render() {
        if ensure_font().is_err() {
            eprintln!("no font here: the plot is skipped, as the lab does");
            return;
        }
        let dir_tmp = tempfile::tempdir().unwrap();
        let dir = dir_tmp.path().join("stepwise-plot");
        std::fs::create_dir_all(&dir).unwrap();
        let curves: Vec<Curve> = (0..15)
            .map(|i| {
                curve(
                    &format!("judge + calculator, generative (min) #{i}"),
                    &[(1, 0.5), (4, 0.6 + 0.01 * i as f64)],
                )
            })
            .collect();
        let panels = [
            ("a".to_string(), curves[..9].to_vec()),
            ("b".to_string(), curves[6..].to_vec()),
        ];
        scaling_plot(&dir.join("p"), "N", &panels, Intervals::Caps).unwrap();
        bon_plot(&dir.join("b"), "t", &curves).unwrap();
        for f in ["p.png", "p.svg", "b.png", "b.svg"] {
            assert!(std::fs::metadata(dir.join(f)).unwrap().len() > 1000, "{f}");
        }
        let svg = std::fs::read_to_string(dir.join("b.svg")).unwrap();
        // Every name whole in the legend (the column is as wide as the longest).
        assert!(svg.contains("judge + calculator, generative (min) #14"));
        calibration_plot(&dir.join("c"), &[("x".into(), vec![(0.1, 0.2, 30), (0.8, 0.7, 3)])]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
