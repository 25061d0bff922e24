//! The demo's report: one self-contained HTML file (inline SVG, no script or style from
//! anywhere else) that draws what happened in each round from what the instances and the
//! client recorded ([`RoundTrace`](crate::demo::RoundTrace)).
//!
//! Per round: a swimlane timeline (`timeline`, hand-written SVG), in an overview and a
//! stretch drawn large; the stock and orders over time, the latency distribution with its
//! lock-wait share, and the answers over time (`charts`, plotters). `model` reads the
//! traces, `page` lays out the HTML.

mod charts;
mod model;
mod page;
mod timeline;

use std::path::{Path, PathBuf};

use crate::demo::Report;

/// Why the report could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// plotters failed to draw a chart.
    #[error("cannot draw the {chart} chart: {message}")]
    Chart {
        /// Which chart.
        chart: &'static str,
        /// What plotters said.
        message: String,
    },
    /// The file could not be written.
    #[error("cannot write the report to {path}: {source}")]
    Write {
        /// Where it was to go.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The report as an HTML document.
///
/// # Errors
///
/// [`ReportError::Chart`] when a chart cannot be drawn.
pub fn html(report: &Report) -> Result<String, ReportError> {
    page::render(report)
}

/// Writes the report to `path` (creating its directory) and returns its absolute path.
///
/// # Errors
///
/// [`ReportError::Chart`], or [`ReportError::Write`] when the file cannot be written.
pub fn write(report: &Report, path: &Path) -> Result<PathBuf, ReportError> {
    let page = html(report)?;
    let failed = |source| ReportError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    std::fs::write(path, page).map_err(failed)?;
    std::fs::canonicalize(path).map_err(failed)
}
