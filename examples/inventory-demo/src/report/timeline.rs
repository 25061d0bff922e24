//! The swimlane timeline, written as SVG by hand (a plotting crate has no swimlanes): one
//! lane per instance, time across. In a lane:
//!
//! - a light band per lock hold (`class="hold"`), from when the code knew it held the lock to
//!   when it let go, or to the end of its fixed lease (a dashed `lease-end` line) when that
//!   came first (for the macro and the layer: their body or handler, which runs inside the
//!   lock's real hold);
//! - a bar per purchase that reached the stock, from its read to its write (`class="sale"`),
//!   or to the refusal of its write (`class="refused"`, with a `stale` cross); bars that
//!   overlap in time within one instance are stacked in tracks;
//! - the chaos stall as a white gap in the bar (`class="stall"`);
//! - a tick per `409 busy` answer (`class="busy"`).
//!
//! Elements carry their times as `data-t0`/`data-t1` (ns since the round started) and their
//! lane as `data-lane`, so tests can read the picture back.

use std::fmt::Write as _;

use super::model::{Bar, Kind, RoundView};

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 14.0;
const AXIS: f64 = 26.0;
const LANE_PAD: f64 = 5.0;
/// More tracks than this in one lane are drawn on the last one (overlapping).
const MAX_TRACKS: usize = 48;

const HOLD_FILL: &str = "#d6e4fa";
const HOLD_STROKE: &str = "#7fa6e3";
const SALE: &str = "#1c64d8";
const LATE_SALE: &str = "#e8590c";
const REFUSED: &str = "#c92a2a";
const BUSY: &str = "#f59f00";

/// A stretch of the round, ns since its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Window {
    fn len(self) -> u64 {
        self.end.saturating_sub(self.start).max(1)
    }

    fn overlaps(self, start: u64, end: u64) -> bool {
        start <= self.end && end >= self.start
    }
}

/// The two views of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    /// Every bar.
    Overview,
    /// A short stretch drawn large, with labels.
    Zoom,
}

impl View {
    fn name(self) -> &'static str {
        match self {
            Self::Overview => "overview",
            Self::Zoom => "zoom",
        }
    }

    fn track_height(self) -> f64 {
        match self {
            Self::Overview => 7.0,
            Self::Zoom => 15.0,
        }
    }
}

const MS: u64 = 1_000_000;

/// From the round's start to just after its last bar or busy answer (the sold-out answers
/// after them are left out: they would squeeze the sales into a corner; a busy answer is
/// drawn, as the round's `busy` column counts every one).
pub(crate) fn overview_window(view: &RoundView) -> Window {
    let last_busy = view
        .answers
        .iter()
        .filter(|(_, _, kind)| *kind == Kind::Busy)
        .map(|(t, _, _)| *t);
    let last = view
        .bars
        .iter()
        .map(Bar::end)
        .chain(last_busy)
        .max()
        .unwrap_or(view.duration);
    Window {
        start: 0,
        end: (last + last / 50).max(MS),
    }
}

/// Around a chaos stall when there is one (the stalled holder, the holders that sold while it
/// slept, and its write), else the first 40 ms of contention. Returns the window and a
/// title.
pub(crate) fn zoom_window(view: &RoundView) -> (Window, String) {
    // The stall with the most sales of others inside it (the first of those): a stall that
    // only hands over to another stalled holder shows less.
    let sales_during = |bar: &Bar| {
        let Some(stall) = bar.stall else { return 0 };
        view.bars
            .iter()
            .filter(|b| {
                b.write
                    .is_some_and(|w| w.end > stall.start && w.end < bar.end())
            })
            .count()
    };
    let mut stalled: Option<(&Bar, usize)> = None;
    for bar in view.bars.iter().filter(|b| b.stall.is_some()) {
        let sales = sales_during(bar);
        if stalled.is_none_or(|(_, best)| sales > best) {
            stalled = Some((bar, sales));
        }
    }
    if let Some((bar, _)) = stalled {
        let window = Window {
            start: bar.read.start.saturating_sub(10 * MS),
            end: bar.end() + 30 * MS,
        };
        let stall = bar.stall.map_or(0, |s| s.end.saturating_sub(s.start));
        let title = format!(
            "Around a chaos stall of {} ms, with the sales beside it ({} ms drawn large)",
            stall / MS,
            window.len() / MS
        );
        return (window, title);
    }
    let start = view
        .bars
        .first()
        .map_or(0, |b| b.read.start.saturating_sub(MS));
    (
        Window {
            start,
            end: start + 40 * MS,
        },
        "The first 40 ms of contention, drawn large".to_owned(),
    )
}

/// Where a time goes across the picture.
#[derive(Debug, Clone, Copy)]
struct Scale {
    window: Window,
    view: View,
}

impl Scale {
    /// The x of `t`, held to the window's edges (the clip path cuts bars there).
    fn x(self, t: u64) -> f64 {
        let t = t.clamp(self.window.start, self.window.end);
        LEFT + (t - self.window.start) as f64 / self.window.len() as f64 * (WIDTH - LEFT - RIGHT)
    }
}

/// The timeline of `view` in `window` as an `<svg>` element; `id` must be unique in the page.
pub(crate) fn svg(round: &RoundView, window: Window, view: View, id: &str) -> String {
    let plot = WIDTH - LEFT - RIGHT;
    let scale = Scale { window, view };
    let x = |t: u64| scale.x(t);
    let bars: Vec<&Bar> = round
        .bars
        .iter()
        .filter(|b| window.overlaps(b.read.start, b.end()))
        .collect();
    let (tracks, lane_tracks) = pack(&bars, round.lanes.len());
    let track_h = view.track_height();
    let lane_h: Vec<f64> = lane_tracks
        .iter()
        .map(|n| 2.0 * LANE_PAD + (*n).max(1) as f64 * track_h)
        .collect();
    let mut lane_top = Vec::with_capacity(lane_h.len());
    let mut y = AXIS;
    for h in &lane_h {
        lane_top.push(y);
        y += h;
    }
    let height = y + 4.0;

    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg class="timeline" data-view="{view}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0}" width="{WIDTH}" height="{height:.0}" font-family="sans-serif" font-size="11">"#,
        view = view.name(),
    );
    let _ = write!(
        out,
        r#"<defs><clipPath id="clip-{id}"><rect x="{LEFT}" y="0" width="{plot}" height="{height:.0}"/></clipPath></defs>"#
    );
    axis(&mut out, scale, height);
    for (lane, name) in round.lanes.iter().enumerate() {
        let top = lane_top[lane];
        let _ = write!(
            out,
            r##"<rect x="0" y="{top:.1}" width="{WIDTH}" height="{h:.1}" fill="{fill}"/><text x="8" y="{ty:.1}" fill="#333" font-weight="bold">{name}</text>"##,
            h = lane_h[lane],
            fill = if lane % 2 == 0 { "#fafafa" } else { "#f1f3f5" },
            ty = top + lane_h[lane] / 2.0 + 4.0,
            name = escape(name),
        );
    }
    let _ = write!(out, r#"<g clip-path="url(#clip-{id})">"#);
    for hold in &round.holds {
        if !window.overlaps(hold.start, hold.end) {
            continue;
        }
        let (top, h) = (lane_top[hold.lane], lane_h[hold.lane]);
        let (x0, x1) = (x(hold.start), x(hold.end));
        let _ = write!(
            out,
            r#"<rect class="hold" data-lane="{lane}" data-t0="{t0}" data-t1="{t1}" x="{x0:.2}" y="{y:.1}" width="{w:.2}" height="{hh:.1}" fill="{HOLD_FILL}" stroke="{HOLD_STROKE}" stroke-width="0.6"/>"#,
            lane = escape(&round.lanes[hold.lane]),
            t0 = hold.start,
            t1 = hold.end,
            y = top + 1.5,
            w = (x1 - x0).max(0.5),
            hh = h - 3.0,
        );
        if hold.expired && window.overlaps(hold.end, hold.end) {
            let _ = write!(
                out,
                r#"<line class="lease-end" x1="{x1:.2}" x2="{x1:.2}" y1="{top:.1}" y2="{y2:.1}" stroke="{HOLD_STROKE}" stroke-width="1.5" stroke-dasharray="3 2"/>"#,
                y2 = top + h,
            );
            if view == View::Zoom {
                let _ = write!(
                    out,
                    r#"<text x="{tx:.1}" y="{ty:.1}" fill="{HOLD_STROKE}" font-size="10">lease ran out</text>"#,
                    tx = x1 + 3.0,
                    ty = top + 10.0,
                );
            }
        }
    }
    for (bar, track) in bars.iter().zip(&tracks) {
        let top = lane_top[bar.lane] + LANE_PAD + *track as f64 * track_h;
        draw_bar(&mut out, round, bar, top, track_h - 2.0, scale);
    }
    for &(t, lane, kind) in &round.answers {
        if kind != Kind::Busy || !window.overlaps(t, t) {
            continue;
        }
        let (top, h) = (lane_top[lane], lane_h[lane]);
        let _ = write!(
            out,
            r#"<line class="busy" data-t0="{t}" x1="{x:.2}" x2="{x:.2}" y1="{y1:.1}" y2="{y2:.1}" stroke="{BUSY}" stroke-width="1"/>"#,
            x = x(t),
            y1 = top + h - 7.0,
            y2 = top + h - 1.0,
        );
    }
    out.push_str("</g></svg>");
    out
}

fn draw_bar(out: &mut String, round: &RoundView, bar: &Bar, top: f64, h: f64, scale: Scale) {
    let (view, window) = (scale.view, scale.window);
    let x = |t: u64| scale.x(t);
    let (x0, x1) = (x(bar.read.start), x(bar.end()));
    let w = (x1 - x0).max(1.0);
    let lane = escape(&round.lanes[bar.lane]);
    let (t0, t1) = (bar.read.start, bar.end());
    if bar.is_sale() {
        let fill = if bar.late { LATE_SALE } else { SALE };
        let _ = write!(
            out,
            r#"<rect class="sale" data-lane="{lane}" data-t0="{t0}" data-t1="{t1}" x="{x0:.2}" y="{top:.1}" width="{w:.2}" height="{h:.1}" fill="{fill}" fill-opacity="0.85"/>"#,
        );
    } else {
        let _ = write!(
            out,
            r##"<rect class="refused" data-lane="{lane}" data-t0="{t0}" data-t1="{t1}" x="{x0:.2}" y="{top:.1}" width="{w:.2}" height="{h:.1}" fill="#fff" stroke="{REFUSED}" stroke-width="1"/>"##,
        );
    }
    if let Some(stall) = bar.stall {
        let (s0, s1) = (x(stall.start), x(stall.end));
        let _ = write!(
            out,
            r##"<rect class="stall" data-lane="{lane}" data-t0="{a}" data-t1="{b}" x="{s0:.2}" y="{y:.1}" width="{sw:.2}" height="{sh:.1}" fill="#fff" stroke="#868e96" stroke-width="0.8" stroke-dasharray="2 2"/>"##,
            a = stall.start,
            b = stall.end,
            y = top + 1.0,
            sw = (s1 - s0).max(1.0),
            sh = (h - 2.0).max(1.0),
        );
        if view == View::Zoom && s1 - s0 > 130.0 {
            let _ = write!(
                out,
                r##"<text x="{tx:.1}" y="{ty:.1}" fill="#495057" font-size="10">stalled {ms} ms (chaos)</text>"##,
                tx = s0 + 4.0,
                ty = top + h - 3.5,
                ms = (stall.end - stall.start) / MS,
            );
        }
    }
    if let Some(at) = bar.stale_at.filter(|at| window.overlaps(*at, *at)) {
        let (cx, cy) = (x(at), top + h / 2.0);
        let r = (h / 2.0 + 1.0).min(6.0);
        let _ = write!(
            out,
            r#"<path class="stale" data-t0="{at}" d="M{a:.1} {b:.1}L{c:.1} {d:.1}M{a:.1} {d:.1}L{c:.1} {b:.1}" stroke="{REFUSED}" stroke-width="2.2"/>"#,
            a = cx - r,
            b = cy - r,
            c = cx + r,
            d = cy + r,
        );
        if view == View::Zoom {
            let _ = write!(
                out,
                r#"<text x="{tx:.1}" y="{ty:.1}" fill="{REFUSED}" font-size="10" font-weight="bold" text-anchor="end">stale write refused (fencing token)</text>"#,
                tx = cx - r - 3.0,
                ty = cy + 3.5,
            );
        }
    }
    if view == View::Zoom && bar.late && window.overlaps(t1, t1) {
        if let Some(written) = bar.stock_written {
            let _ = write!(
                out,
                r#"<text x="{tx:.1}" y="{ty:.1}" fill="{LATE_SALE}" font-size="10" font-weight="bold" text-anchor="end">then wrote its stale stock {written} over the sales since</text>"#,
                // Inside the stall's gap, whose left end has the stall's own label.
                tx = x1 - 6.0,
                ty = top + h - 3.5,
            );
        }
    }
    if view == View::Zoom && bar.stall.is_none() {
        let label = match (bar.stock_read, bar.stock_written) {
            (Some(read), Some(written)) => format!("{read}→{written}"),
            (Some(read), None) => format!("{read}→✕"),
            _ => String::new(),
        };
        // Only where it fits (about 6 px per character at 10 px).
        if !label.is_empty() && w > label.chars().count() as f64 * 6.0 + 4.0 {
            let _ = write!(
                out,
                r#"<text x="{tx:.1}" y="{ty:.1}" fill="{color}" font-size="10" text-anchor="middle">{label}</text>"#,
                tx = x0 + w / 2.0,
                ty = top + h - 3.5,
                color = if bar.is_sale() { "#fff" } else { REFUSED },
            );
        }
    }
}

/// The time axis along the top, with grid lines.
fn axis(out: &mut String, scale: Scale, height: f64) {
    let window = scale.window;
    let step = tick_step(window.len());
    let mut t = window.start.div_ceil(step) * step;
    while t <= window.end {
        let xt = scale.x(t);
        let _ = write!(
            out,
            r##"<line x1="{xt:.2}" x2="{xt:.2}" y1="{y1}" y2="{height:.0}" stroke="#dee2e6" stroke-width="1"/><text x="{xt:.2}" y="{ty}" text-anchor="middle" fill="#555">{label}</text>"##,
            y1 = AXIS - 4.0,
            ty = AXIS - 8.0,
            label = ms_label(t, step),
        );
        t += step;
    }
    let _ = write!(
        out,
        r##"<text x="8" y="{ty}" fill="#555">ms</text>"##,
        ty = AXIS - 8.0
    );
}

/// A round step (1, 2 or 5 times a power of ten ns) giving at most about 12 ticks.
fn tick_step(len: u64) -> u64 {
    let raw = (len / 12).max(1);
    let mut magnitude = 1u64;
    while magnitude * 10 <= raw {
        magnitude *= 10;
    }
    [1, 2, 5, 10]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(raw)
}

fn ms_label(t: u64, step: u64) -> String {
    if step >= MS {
        format!("{}", t / MS)
    } else {
        format!("{:.1}", t as f64 / MS as f64)
    }
}

/// Packs the bars of each lane into tracks so that bars of one track do not overlap: the
/// track of each bar, and the number of tracks per lane.
fn pack(bars: &[&Bar], lanes: usize) -> (Vec<usize>, Vec<usize>) {
    let mut ends: Vec<Vec<u64>> = vec![Vec::new(); lanes.max(1)];
    let mut tracks = Vec::with_capacity(bars.len());
    for bar in bars {
        let lane = &mut ends[bar.lane.min(lanes.saturating_sub(1))];
        let free = lane.iter().position(|end| *end < bar.read.start);
        let track = match free {
            Some(track) => track,
            None if lane.len() < MAX_TRACKS => {
                lane.push(0);
                lane.len() - 1
            }
            None => MAX_TRACKS - 1,
        };
        lane[track] = lane[track].max(bar.end());
        tracks.push(track);
    }
    (tracks, ends.iter().map(Vec::len).collect())
}

/// Escapes text for XML content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::tests::{row, sale};
    use crate::Variant;

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(tick_step(40 * MS), 5 * MS);
        assert_eq!(tick_step(1000 * MS), 100 * MS);
        assert_eq!(tick_step(12), 1);
    }

    #[test]
    fn overlapping_bars_of_one_lane_get_their_own_tracks() {
        let round = RoundView::new(&row(
            Variant::Unlocked,
            vec![
                sale(0, "i1", 0, 10, 1),
                sale(1, "i1", 2, 10, 2),
                sale(2, "i1", 20, 9, 3),
            ],
        ));
        let bars: Vec<&Bar> = round.bars.iter().collect();
        let (tracks, per_lane) = pack(&bars, 1);
        assert_eq!(tracks, [0, 1, 0]);
        assert_eq!(per_lane, [2]);
    }

    #[test]
    fn the_svg_has_a_bar_per_sale_with_its_times() {
        let round = RoundView::new(&row(
            Variant::Macro,
            vec![sale(0, "i1", 0, 10, 1), sale(1, "i2<", 8, 9, 2)],
        ));
        let svg = svg(&round, overview_window(&round), View::Overview, "t");
        assert_eq!(svg.matches(r#"class="sale""#).count(), 2);
        assert_eq!(svg.matches(r#"class="hold""#).count(), 2);
        assert!(
            svg.contains(r#"data-lane="i2&lt;" data-t0="8000000""#),
            "{svg}"
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }
}
