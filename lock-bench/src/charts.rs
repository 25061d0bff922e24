//! SVG charts of a run, written next to the JSON (plotters' SVG backend):
//!
//! - `<stem>-ratios.svg`: kit/floor of every row with a ratio target, as bars against their
//!   target;
//! - `<stem>-w3-gaps.svg`: the W3 handoff-gap distributions, kit and floor;
//! - `<stem>-w3-fairness.svg`: acquisitions per task in W3, kit and floor.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::hot_key::HotKeyDetail;
use crate::lock::BoxError;
use crate::report::{Check, Row};

const KIT: RGBColor = RGBColor(28, 100, 216);
const FLOOR: RGBColor = RGBColor(134, 142, 150);
const PASS: RGBColor = RGBColor(47, 158, 68);
const MISS: RGBColor = RGBColor(201, 42, 42);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().into()
}

/// Writes the charts that the run has data for, next to `json`; returns their paths.
pub(crate) fn write(
    json: &Path,
    rows: &[Row],
    details: &[HotKeyDetail],
) -> Result<Vec<PathBuf>, BoxError> {
    let stem = json
        .file_stem()
        .map_or_else(|| "bench".into(), |s| s.to_string_lossy().into_owned());
    let dir = json.parent().unwrap_or_else(|| Path::new(""));
    let mut written = Vec::new();
    let mut save = |name: &str, svg: String| -> Result<(), BoxError> {
        let path = dir.join(format!("{stem}-{name}.svg"));
        std::fs::write(&path, svg)?;
        written.push(path);
        Ok(())
    };
    let ratio_rows: Vec<&Row> = rows.iter().filter(|r| ratio_target(r).is_some()).collect();
    // A chart this run has no data for is removed: one left from an earlier run next to this
    // run's JSON would pass for this run's.
    let mut stale = Vec::new();
    if ratio_rows.is_empty() {
        stale.push("ratios");
    } else {
        save("ratios", ratios(&ratio_rows)?)?;
    }
    if details.is_empty() {
        stale.extend(["w3-gaps", "w3-fairness"]);
    } else {
        save("w3-gaps", gaps(details)?)?;
        save("w3-fairness", fairness(details)?)?;
    }
    for name in stale {
        match std::fs::remove_file(dir.join(format!("{stem}-{name}.svg"))) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    Ok(written)
}

/// Draws into a fresh SVG document of `size`.
fn render(
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> DrawResult,
) -> Result<String, BoxError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present())
            .map_err(|e| format!("drawing a chart: {e}"))?;
    }
    Ok(svg)
}

/// The target of a ratio row.
fn ratio_target(row: &Row) -> Option<f64> {
    let both = !row.kit.is_empty() && !row.floor.is_empty() && row.ratio().is_finite();
    match row.check {
        Check::RatioAtLeast(x) | Check::RatioAtMost(x) if both => Some(x),
        _ => None,
    }
}

/// A row's label: its workload and metric (without the metric's parenthesis, but saying when
/// the second column is rslock's, so that its bar is not taken for the floor's).
fn row_label(row: &Row) -> String {
    let metric = row.metric.split(" (").next().unwrap_or(&row.metric);
    let against = if row.metric.contains("floor column: rslock") {
        " vs rslock"
    } else {
        ""
    };
    format!("{}: {metric}{against}", short(&row.workload))
}

/// One horizontal bar per row, its length the kit/floor ratio, labelled above; a black tick
/// at the target; green when the target is met, red when missed; a dashed line at parity.
fn ratios(rows: &[&Row]) -> Result<String, BoxError> {
    let n = rows.len();
    let x_max = rows
        .iter()
        .filter_map(|r| ratio_target(r).map(|t| r.ratio().max(t)))
        .fold(1.0f64, f64::max)
        * 1.12;
    let height = 80 + 48 * n as u32;
    render((900, height), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                "kit / floor against the target (median of the per-pair ratios)",
                font(16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(8)
            .build_cartesian_2d(0f64..x_max, 0f64..n as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .label_style(font(12))
            .axis_desc_style(font(12))
            .x_desc("kit / floor")
            .y_labels(0)
            .draw()?;
        chart.draw_series(DashedLineSeries::new(
            [(1.0, 0.0), (1.0, n as f64)],
            5,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))?;
        for (i, row) in rows.iter().enumerate() {
            let Some(target) = ratio_target(row) else {
                continue;
            };
            // The first row at the top.
            let y = (n - 1 - i) as f64;
            let ratio = row.ratio();
            let color = if row.pass() == Some(true) { PASS } else { MISS };
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.1), (ratio, y + 0.5)],
                color.mix(0.85).filled(),
            )))?;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(target, y + 0.02), (target, y + 0.58)],
                BLACK.stroke_width(3),
            )))?;
            let label = format!(
                "{}: {ratio:.2} (target {})",
                row_label(row),
                row.target_text()
            );
            // Text hangs from its top-left corner: above the bar, inside the row's band.
            chart.draw_series(std::iter::once(Text::new(
                label,
                (x_max * 0.005, y + 0.92),
                font(13),
            )))?;
        }
        Ok(())
    })
}

/// A hot-key workload's short name for captions.
fn short(workload: &str) -> String {
    workload.replace("W3 hot key, ", "W3, ")
}

/// At most this many points per CDF line: a full run has tens of thousands of gaps, and a
/// point each would make a megabyte of SVG that looks the same.
const CDF_POINTS: usize = 600;

/// `(x, share at or below x)` of `values` (ns), in µs: every value's step when there are few,
/// else the values at evenly spaced ranks.
fn cdf_us(values: &[u64]) -> Vec<(f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let at = |i: usize| (sorted[i] as f64 / 1e3).max(0.1);
    if n <= CDF_POINTS {
        let mut points = Vec::with_capacity(n * 2);
        for i in 0..n {
            points.push((at(i), i as f64 / n as f64));
            points.push((at(i), (i + 1) as f64 / n as f64));
        }
        return points;
    }
    (0..CDF_POINTS)
        .map(|k| {
            let i = k * (n - 1) / (CDF_POINTS - 1);
            (at(i), (i + 1) as f64 / n as f64)
        })
        .collect()
}

/// The handoff-gap CDFs of each W3 workload, kit and floor, on a logarithmic µs axis.
fn gaps(details: &[HotKeyDetail]) -> Result<String, BoxError> {
    let width = 480 * details.len() as u32;
    render((width, 340), |root| {
        for (detail, area) in details.iter().zip(root.split_evenly((1, details.len()))) {
            let all = detail.gaps_ns.iter().flatten();
            let hi = all.clone().max().copied().unwrap_or(1000) as f64 / 1e3;
            let lo = all.min().copied().unwrap_or(1000) as f64 / 1e3;
            let (lo, hi) = ((lo * 0.8).max(0.1), (hi * 1.25).max(lo * 4.0).max(1.0));
            let mut chart = ChartBuilder::on(&area)
                .caption(
                    format!("{}: handoff gap", short(&detail.workload)),
                    font(14),
                )
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(46)
                .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)?;
            chart
                .configure_mesh()
                .light_line_style(WHITE.mix(0.0))
                .label_style(font(11))
                .axis_desc_style(font(12))
                .x_desc("µs from release called to the next acquire (log)")
                .y_desc("share of handoffs at or below")
                .x_label_formatter(&|v| format!("{v:.0}"))
                .draw()?;
            for (side, (name, color)) in [("kit", KIT), ("floor", FLOOR)].into_iter().enumerate() {
                let points: Vec<(f64, f64)> = cdf_us(&detail.gaps_ns[side])
                    .into_iter()
                    .map(|(x, y)| (x.clamp(lo, hi), y))
                    .collect();
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                    .label(format!("{name} ({} handoffs)", detail.gaps_ns[side].len()))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .label_font(font(12))
                .draw()?;
        }
        Ok(())
    })
}

/// min/max of the counts, the fairness figure of the table (here over the summed runs).
fn min_max(counts: &[u64]) -> f64 {
    let (min, max) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    if max == 0 {
        0.0
    } else {
        min as f64 / max as f64
    }
}

/// Acquisitions per task of each W3 workload, kit and floor side by side, summed over the
/// runs.
fn fairness(details: &[HotKeyDetail]) -> Result<String, BoxError> {
    let width = 480 * details.len() as u32;
    render((width, 340), |root| {
        for (detail, area) in details.iter().zip(root.split_evenly((1, details.len()))) {
            let tasks = detail.per_task.iter().map(Vec::len).max().unwrap_or(0);
            let y_max = detail.per_task.iter().flatten().max().copied().unwrap_or(1) as f64 * 1.35;
            let mut chart = ChartBuilder::on(&area)
                .caption(
                    format!(
                        "{}: acquisitions per task ({} runs)",
                        short(&detail.workload),
                        detail.runs
                    ),
                    font(14),
                )
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(52)
                .build_cartesian_2d(-0.6f64..tasks.max(1) as f64 - 0.4, 0f64..y_max.max(1.0))?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .light_line_style(WHITE.mix(0.0))
                .label_style(font(11))
                .axis_desc_style(font(12))
                .x_desc(if detail.workload.contains("processes") {
                    "task (4 per process)"
                } else {
                    "task"
                })
                .y_desc("acquisitions")
                .x_labels(tasks.clamp(2, 16))
                .x_label_formatter(&|v| {
                    if v.fract().abs() < 1e-9 {
                        format!("{v:.0}")
                    } else {
                        String::new()
                    }
                })
                .y_label_formatter(&|v| format!("{v:.0}"))
                .draw()?;
            for (side, (name, color)) in [("kit", KIT), ("floor", FLOOR)].into_iter().enumerate() {
                let counts = &detail.per_task[side];
                let offset = side as f64 * 0.4;
                chart
                    .draw_series(counts.iter().enumerate().map(|(task, n)| {
                        // Kit left of the task's tick, floor right of it.
                        let x0 = task as f64 - 0.4 + offset;
                        Rectangle::new([(x0, 0.0), (x0 + 0.4, *n as f64)], color.filled())
                    }))?
                    .label(format!("{name}: min/max {:.2}", min_max(counts)))
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK.mix(0.3))
                .label_font(font(12))
                .draw()?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail() -> HotKeyDetail {
        HotKeyDetail {
            workload: "W3 hot key, 1 process x 2 tasks".to_owned(),
            gaps_ns: [vec![7_000, 9_000, 200_000], vec![90_000, 110_000]],
            per_task: [vec![10, 12], vec![8, 14]],
            runs: 3,
        }
    }

    #[test]
    fn charts_are_written_next_to_the_json() {
        let dir = std::env::temp_dir().join(format!("lock-bench-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let rows = vec![
            Row::new(
                "W1 uncontended, 1 task",
                "p50",
                "µs",
                vec![1.0],
                vec![1.0],
                Check::RatioAtMost(1.05),
            ),
            Row::new(
                "W2 parallel, 64 tasks",
                "cycles/s",
                "",
                vec![5.0],
                vec![10.0],
                Check::RatioAtLeast(0.9),
            ),
            Row::new(
                "W2 parallel, 64 tasks",
                "failed",
                "",
                vec![0.0],
                vec![0.0],
                Check::KitAllEqual(0.0),
            ),
        ];
        let written = write(&dir.join("run.json"), &rows, &[detail(), detail()]).expect("charts");
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["run-ratios.svg", "run-w3-gaps.svg", "run-w3-fairness.svg"]
        );
        let ratios = std::fs::read_to_string(&written[0]).expect("svg");
        assert!(ratios.starts_with("<svg"));
        assert!(
            ratios.contains("W2 parallel, 64 tasks: cycles/s: 0.50"),
            "{ratios}"
        );
        assert!(!ratios.contains("failed"), "only ratio rows");
        assert!(ratios.contains("(target ≥ 0.9x floor)"), "{ratios}");

        // A later run without hot-key workloads leaves no W3 chart of the earlier one behind.
        let written = write(&dir.join("run.json"), &rows, &[]).expect("charts");
        assert_eq!(written.len(), 1);
        assert!(!dir.join("run-w3-gaps.svg").exists());
        assert!(!dir.join("run-w3-fairness.svg").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn long_cdfs_are_thinned_to_evenly_spaced_ranks() {
        let few = cdf_us(&[3_000, 1_000]);
        assert_eq!(few, [(1.0, 0.0), (1.0, 0.5), (3.0, 0.5), (3.0, 1.0)]);
        let many: Vec<u64> = (1..=10_000).collect();
        let points = cdf_us(&many);
        assert_eq!(points.len(), CDF_POINTS);
        assert_eq!(points.last(), Some(&(10.0, 1.0)));
        assert!(points
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }

    #[test]
    fn min_max_of_counts() {
        assert_eq!(min_max(&[5, 10]), 0.5);
        assert_eq!(min_max(&[]), 0.0);
    }
}
