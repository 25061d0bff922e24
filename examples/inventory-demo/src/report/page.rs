//! The HTML page around the pictures: the settings, the table, a section per round, and a
//! few lines of inline script that note how many pictures the browser laid out (a test
//! reads them back from the rendered DOM).

use std::fmt::Write as _;

use super::charts;
use super::model::RoundView;
use super::timeline::{self, escape, View};
use super::ReportError;
use crate::demo::DEMO_SKU;
use crate::demo::{fmt_ms, Report, Row};
use crate::Variant;

const STYLE: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #212529; margin: 24px auto; max-width: 1140px; padding: 0 12px; }
h1 { margin-bottom: 4px; }
h2 { margin-top: 40px; border-top: 2px solid #dee2e6; padding-top: 16px; }
h3 { margin: 18px 0 4px; font-size: 15px; }
p { line-height: 1.45; }
table.summary { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.summary th, table.summary td { padding: 3px 10px; border-bottom: 1px solid #dee2e6; text-align: right; }
table.summary th:first-child, table.summary td:first-child { text-align: left; }
.bad { color: #c92a2a; font-weight: 600; }
.good { color: #2b8a3e; font-weight: 600; }
.legend { font-size: 13px; color: #495057; margin: 4px 0; }
.legend span.key { display: inline-block; width: 18px; height: 10px; margin: 0 4px 0 12px; vertical-align: middle; }
.scroll { overflow-x: auto; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 10px; }
nav a { margin-right: 12px; }
"#;

/// Notes on `<body>` how many `<svg>` elements have a size on screen, and how many of their
/// shapes do: a page that failed to lay out shows zeros.
const SCRIPT: &str = r#"
(function () {
  var svgs = document.querySelectorAll("svg"), laidOut = 0, shapes = 0;
  svgs.forEach(function (svg) {
    var box = svg.getBoundingClientRect();
    if (box.width > 0 && box.height > 0) { laidOut++; }
  });
  document.querySelectorAll("svg rect, svg path, svg polyline, svg line").forEach(function (el) {
    var box = el.getBBox();
    if (box.width > 0 || box.height > 0) { shapes++; }
  });
  document.body.setAttribute("data-svgs-laid-out", laidOut);
  document.body.setAttribute("data-shapes-laid-out", shapes);
})();
"#;

const LEGEND: &str = r##"<p class="legend">
<span class="key" style="background:#d6e4fa;border:1px solid #7fa6e3"></span>lock held, as the locked code saw it (the macro's body, the layer's handler: the lock is taken a little before and let go a little after)
<span class="key" style="border-left:2px dashed #7fa6e3;width:4px"></span>fixed lease ran out
<span class="key" style="background:#1c64d8"></span>purchase, from stock read to stock write
<span class="key" style="background:#e8590c"></span>written after its lease ran out
<span class="key" style="border:1px dashed #868e96;background:#fff"></span>stalled (chaos)
<span class="key" style="border:1px solid #c92a2a;background:#fff"></span>write refused
<span style="color:#c92a2a;font-weight:bold;margin-left:12px">✕</span> stale write refused by the fencing token
<span class="key" style="border-left:2px solid #f59f00;width:4px"></span><code>409 busy</code> answer
</p>"##;

/// What protects the read-check-write of a variant.
fn protection(variant: Variant) -> &'static str {
    match variant {
        Variant::Unlocked => "Nothing protects the read-check-write: the bug.",
        Variant::Macro => {
            "<code>#[distributed_lock(key = \"inventory:&lt;sku&gt;\", wait = \"10s\", fence = fence)]</code> on the service method; the write carries the fencing token."
        }
        Variant::Layer => {
            "The route behind <code>DistributedLockLayer</code>, waiting up to 10 s for the lock."
        }
        Variant::LayerFailFast => {
            "The route behind <code>DistributedLockLayer</code> with its default wait of zero: a purchase that finds the SKU locked is answered <code>409 busy</code> with <code>Retry-After</code>, and the client comes back after it."
        }
        Variant::Fenced => {
            "<code>locker.lock(..).lease(200ms)</code>, and the database refuses writes with a fencing token older than the latest it saw."
        }
        Variant::LockedNoFence => {
            "<code>locker.lock(..).lease(200ms)</code> and an <code>is_held()</code> check before the write, without the fencing token."
        }
    }
}

/// The whole page.
pub(crate) fn render(report: &Report) -> Result<String, ReportError> {
    let views: Vec<RoundView> = report.rows.iter().map(RoundView::new).collect();
    let c = &report.config;
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    out.push_str("<title>Oversell demo: what happened</title>");
    let _ = write!(out, "<style>{STYLE}</style></head><body>");
    out.push_str("<h1>Oversell demo: what happened</h1>");
    let _ = write!(
        out,
        "<p>{} instances of the inventory service, one SQLite file, {}. Each round: stock {} of SKU {DEMO_SKU}, {} purchases, {} in flight, {} ms between reading and writing the stock. Every timestamp below was taken by the instances and the client on one clock (<code>CLOCK_MONOTONIC</code>).</p>",
        report.instances.len(),
        escape(&report.redis),
        c.stock,
        c.purchases,
        c.concurrency,
        c.think.as_millis(),
    );
    summary_table(&mut out, report);
    out.push_str("<nav>");
    for (i, row) in report.rows.iter().enumerate() {
        let _ = write!(out, "<a href=\"#round-{i}\">{}</a>", escape(&row.label()));
    }
    out.push_str("</nav>");
    let labelled: Vec<(String, &RoundView)> = report
        .rows
        .iter()
        .zip(&views)
        .map(|(row, view)| (row.label(), view))
        .collect();
    let _ = write!(
        out,
        "<div class=\"charts\">{}</div>",
        charts::all_latencies(&labelled)?
    );
    for (i, (row, view)) in report.rows.iter().zip(&views).enumerate() {
        round_section(&mut out, report, row, view, i)?;
    }
    let _ = writeln!(out, "<script>{SCRIPT}</script></body></html>");
    Ok(out)
}

fn summary_table(out: &mut String, report: &Report) {
    out.push_str("<table class=\"summary\"><tr><th>variant</th><th>stock left</th><th>sold</th><th>oversold</th><th>sold out</th><th>busy</th><th>stale</th><th>p50</th><th>p99</th><th>req/s</th></tr>");
    for r in &report.rows {
        let oversold = if r.oversold() > 0 {
            format!("<span class=\"bad\">{}</span>", r.oversold())
        } else {
            "0".to_owned()
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{oversold}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td></tr>",
            escape(&r.label()),
            r.stock_left,
            r.sold,
            r.sold_out,
            r.busy,
            r.stale,
            fmt_ms(r.p50),
            fmt_ms(r.p99),
            r.throughput(),
        );
    }
    out.push_str("</table>");
    out.push_str("<p class=\"legend\"><code>busy</code> counts <code>409 busy</code> answers (each retried after its <code>Retry-After</code>), <code>stale</code> the writes the fencing token refused; latencies are the client's, retries included.</p>");
}

fn round_section(
    out: &mut String,
    report: &Report,
    row: &Row,
    view: &RoundView,
    index: usize,
) -> Result<(), ReportError> {
    let label = row.label();
    let verdict = report.verdict(row);
    let class = if row.raced() { "bad" } else { "good" };
    let _ = write!(
        out,
        "<section class=\"round\" id=\"round-{index}\" data-round=\"{label}\"><h2>{label}</h2><p class=\"{class}\">{verdict}</p><p>{what}{chaos}</p>",
        label = escape(&label),
        verdict = escape(&verdict),
        what = protection(row.variant),
        chaos = if row.chaos {
            " Chaos: each instance stalls its 1st, 11th and 21st write, after its last lock check, past the lease."
        } else {
            ""
        },
    );
    let overview = timeline::overview_window(view);
    let _ = write!(
        out,
        "<h3>Overview: {} sales by {} instances, {} ms</h3>{LEGEND}<div class=\"scroll\">{}</div>",
        view.sales(),
        view.lanes.len(),
        overview.end / 1_000_000,
        timeline::svg(view, overview, View::Overview, &format!("o{index}")),
    );
    let (zoom, title) = timeline::zoom_window(view);
    let _ = write!(
        out,
        "<h3>{}</h3><div class=\"scroll\">{}</div>",
        escape(&title),
        timeline::svg(view, zoom, View::Zoom, &format!("z{index}")),
    );
    let _ = write!(
        out,
        "<div class=\"charts\">{}{}{}</div></section>",
        charts::stock_and_orders(view, overview.end)?,
        charts::latency(view)?,
        charts::answers(view)?,
    );
    Ok(())
}
