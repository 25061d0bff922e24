//! The report's charts, drawn with plotters' SVG backend: stock and orders over time,
//! latency distributions with the lock wait, answers over time, and all rounds' latencies
//! side by side.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::model::{Kind, RoundView};
use super::ReportError;

/// One chart's size in pixels.
const SIZE: (u32, u32) = (372, 270);
const MS: f64 = 1e6;

const BLUE: RGBColor = RGBColor(28, 100, 216);
const ORANGE: RGBColor = RGBColor(232, 89, 12);
const GREY: RGBColor = RGBColor(134, 142, 150);
const AMBER: RGBColor = RGBColor(245, 159, 0);
const RED: RGBColor = RGBColor(201, 42, 42);
const PALETTE: [RGBColor; 8] = [
    RGBColor(201, 42, 42),
    RGBColor(28, 100, 216),
    RGBColor(47, 158, 68),
    RGBColor(245, 159, 0),
    RGBColor(112, 72, 232),
    RGBColor(12, 166, 120),
    RGBColor(232, 89, 12),
    RGBColor(73, 80, 87),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Draws into a fresh SVG document of `size`.
fn render(
    chart: &'static str,
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> DrawResult,
) -> Result<String, ReportError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        let drawn = root
            .fill(&WHITE)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present());
        drawn.map_err(|e| ReportError::Chart {
            chart,
            message: e.to_string(),
        })?;
    }
    Ok(svg)
}

fn caption_font() -> TextStyle<'static> {
    ("sans-serif", 15).into_font().into()
}

fn label_font() -> TextStyle<'static> {
    ("sans-serif", 12).into_font().into()
}

/// The legend of a chart at `position`, in the report's style.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(label_font())
        .draw()
}

/// The legend's sample of a line drawn in `style`.
fn line_sample(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style)
}

/// A tick label with no more decimals than the axis needs.
fn tick(v: &f64) -> String {
    if v.abs() >= 10.0 || v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The stored stock and the orders against time, over `end_ns`: the locked rounds walk down
/// a staircase from the stock to 0 while the orders climb to it; the unlocked round's orders
/// climb past it while the stock barely moves.
pub(crate) fn stock_and_orders(round: &RoundView, end_ns: u64) -> Result<String, ReportError> {
    render("stock and orders", SIZE, |root| {
        let x_max = end_ns as f64 / MS;
        let orders = round.stock.last().map_or(0, |s| s.2);
        let y_max = (round.stock_start.max(orders) as f64 * 1.08).max(1.0);
        let mut chart = ChartBuilder::on(root)
            .caption("Stock and orders over time", caption_font())
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("ms since the round started")
            .y_desc("units")
            .light_line_style(WHITE.mix(0.0))
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;

        let mut stock = vec![(0.0, round.stock_start as f64)];
        let mut taken = vec![(0.0, 0.0)];
        for &(t, s, n) in &round.stock {
            let t = t as f64 / MS;
            stock.push((t, stock.last().map_or(0.0, |p| p.1)));
            stock.push((t, s as f64));
            taken.push((t, (n - 1) as f64));
            taken.push((t, n as f64));
        }
        stock.push((x_max, stock.last().map_or(0.0, |p| p.1)));
        taken.push((x_max, taken.last().map_or(0.0, |p| p.1)));

        chart
            .draw_series(DashedLineSeries::new(
                [
                    (0.0, round.stock_start as f64),
                    (x_max, round.stock_start as f64),
                ],
                6,
                4,
                GREY.stroke_width(1),
            ))?
            .label("stock at the start")
            .legend(line_sample(GREY.stroke_width(1)));
        chart
            .draw_series(LineSeries::new(taken, ORANGE.stroke_width(2)))?
            .label("orders stored")
            .legend(line_sample(ORANGE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(stock, BLUE.stroke_width(2)))?
            .label("stock stored")
            .legend(line_sample(BLUE.stroke_width(2)));
        draw_legend(&mut chart, SeriesLabelPosition::MiddleRight)
    })
}

/// The fraction of values at or below each value: the points of a CDF drawn as steps.
fn cdf(sorted_ns: &[u64]) -> Vec<(f64, f64)> {
    let n = sorted_ns.len().max(1) as f64;
    let mut points = vec![(0.0, 0.0)];
    for (i, v) in sorted_ns.iter().enumerate() {
        let x = *v as f64 / MS;
        points.push((x, i as f64 / n));
        points.push((x, (i + 1) as f64 / n));
    }
    points
}

/// The client latency CDF of the round's purchases, and the CDF of the part of it spent
/// waiting for the lock (in the instances, and for `Retry-After`).
pub(crate) fn latency(round: &RoundView) -> Result<String, ReportError> {
    render("latency", SIZE, |root| {
        let x_max = (round.latency.last().copied().unwrap_or(1) as f64 / MS * 1.03).max(0.1);
        let share = round.lock_wait_share() * 100.0;
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("Latency: {share:.0}% of it lock wait"),
                caption_font(),
            )
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..x_max, 0f64..1.0)?;
        chart
            .configure_mesh()
            .x_desc("ms")
            .y_desc("share of purchases at or below")
            .light_line_style(WHITE.mix(0.0))
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;
        chart
            .draw_series(LineSeries::new(cdf(&round.latency), BLUE.stroke_width(2)))?
            .label("client latency")
            .legend(line_sample(BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                cdf(&round.lock_wait),
                ORANGE.stroke_width(2),
            ))?
            .label("of it waiting for the lock")
            .legend(line_sample(ORANGE.stroke_width(2)));
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

fn kind_color(kind: Kind) -> RGBColor {
    match kind {
        Kind::Sold => BLUE,
        Kind::SoldOut => GREY,
        Kind::Busy => AMBER,
        Kind::Stale => RED,
        Kind::Other => BLACK,
    }
}

/// What the instances answered, stacked per stretch of time: sales, sold out, `409 busy`
/// (the layer that does not wait), stale writes refused.
pub(crate) fn answers(round: &RoundView) -> Result<String, ReportError> {
    const BUCKETS: usize = 40;
    let end = round
        .answers
        .last()
        .map_or(1, |a| a.0)
        .max(round.duration)
        .max(1);
    let width = end.div_ceil(BUCKETS as u64).max(1);
    let mut counts = vec![[0u32; Kind::ALL.len()]; BUCKETS];
    for &(t, _, kind) in &round.answers {
        let bucket = ((t / width) as usize).min(BUCKETS - 1);
        if let Some(k) = Kind::ALL.iter().position(|k| *k == kind) {
            counts[bucket][k] += 1;
        }
    }
    let y_max = counts
        .iter()
        .map(|c| c.iter().sum::<u32>())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let bucket_ms = width as f64 / MS;
    render("answers", SIZE, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("Answers per {}", duration_label(bucket_ms)),
                caption_font(),
            )
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..bucket_ms * BUCKETS as f64, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("ms since the round started")
            .y_desc("answers")
            .light_line_style(WHITE.mix(0.0))
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;
        for (k, kind) in Kind::ALL.into_iter().enumerate() {
            if counts.iter().all(|c| c[k] == 0) {
                continue;
            }
            let color = kind_color(kind);
            let bars = counts
                .iter()
                .enumerate()
                .filter(|(_, c)| c[k] > 0)
                .map(|(b, c)| {
                    let below: u32 = c[..k].iter().sum();
                    let x0 = b as f64 * bucket_ms;
                    Rectangle::new(
                        [
                            (x0, f64::from(below)),
                            (x0 + bucket_ms * 0.9, f64::from(below + c[k])),
                        ],
                        color.filled(),
                    )
                });
            chart
                .draw_series(bars)?
                .label(kind.label())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

fn duration_label(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// Every round's client latency CDF on one logarithmic axis.
pub(crate) fn all_latencies(rounds: &[(String, &RoundView)]) -> Result<String, ReportError> {
    render("all latencies", (860, 320), |root| {
        let max = rounds
            .iter()
            .filter_map(|(_, r)| r.latency.last())
            .max()
            .copied()
            .unwrap_or(1) as f64
            / MS;
        let min = rounds
            .iter()
            .filter_map(|(_, r)| r.latency.first())
            .min()
            .copied()
            .unwrap_or(1) as f64
            / MS;
        let (lo, hi) = ((min * 0.8).max(0.01), (max * 1.25).max(min * 2.0).max(0.1));
        let mut chart = ChartBuilder::on(root)
            .caption("Client latency of every round", caption_font())
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(44)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)?;
        chart
            .configure_mesh()
            .x_desc("ms (logarithmic)")
            .y_desc("share of purchases at or below")
            .light_line_style(WHITE.mix(0.0))
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;
        for (i, (label, round)) in rounds.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let points: Vec<(f64, f64)> = cdf(&round.latency)
                .into_iter()
                .map(|(x, y)| (x.max(lo), y))
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(label.as_str())
                .legend(line_sample(color.stroke_width(2)));
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::tests::{row, sale};
    use crate::Variant;

    #[test]
    fn cdf_steps_up_to_one() {
        let points = cdf(&[1_000_000, 3_000_000]);
        assert_eq!(points.first(), Some(&(0.0, 0.0)));
        assert_eq!(points.last(), Some(&(3.0, 1.0)));
        assert_eq!(points.len(), 5);
    }

    #[test]
    fn charts_are_svg_documents() {
        let round = RoundView::new(&row(
            Variant::Macro,
            vec![sale(0, "i1", 0, 10, 1), sale(1, "i2", 8, 9, 2)],
        ));
        for svg in [
            stock_and_orders(&round, 20_000_000),
            latency(&round),
            answers(&round),
            all_latencies(&[("macro".to_owned(), &round)]),
        ] {
            let svg = svg.expect("drawn");
            assert!(svg.starts_with("<svg"), "{svg}");
            assert!(svg.contains("<polyline") || svg.contains("<rect"), "{svg}");
        }
    }
}
