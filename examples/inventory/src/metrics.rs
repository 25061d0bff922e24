//! `GET /metrics`: the lock kit's metrics (lock-core's `metrics` feature, every name `lock_*`)
//! in the Prometheus text format, for a Prometheus server to scrape from each instance.
//!
//! lock-core records through the `metrics` facade; this module installs the recorder that
//! collects them, `metrics-exporter-prometheus`, once per process (a process has one global
//! recorder), and the route renders what it collected. The exporter's own HTTP listener is
//! not used: the text is served on the service's router, next to the other endpoints.

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// How often histograms are drained into their buckets between scrapes (the exporter's own
/// default), so that their memory stays bounded however rarely `/metrics` is read.
const UPKEEP: Duration = Duration::from_secs(5);

/// The bucket bounds of every histogram, in seconds (all of the kit's are durations): from
/// an uncontended acquire call on a LAN (sub-millisecond) to holds of minutes. Without
/// buckets the exporter renders summaries (client-side quantiles), which Prometheus cannot
/// aggregate across instances.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0,
];

/// The recorder of this process: `None` when another recorder was installed before ours.
static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder as the process's `metrics` recorder, the first time it is
/// called; every call returns the same handle. `None` (logged once) when the process already
/// had another recorder: the lock metrics go there, and `/metrics` answers `503`.
pub fn install() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            match PrometheusBuilder::new()
                .set_buckets(SECONDS_BUCKETS)
                .and_then(PrometheusBuilder::install_recorder)
            {
                Ok(handle) => {
                    // The HELP lines: lock-core describes its metrics when a locker is built, which
                    // may have happened before this recorder existed.
                    lock_core::metrics::describe();
                    spawn_upkeep(handle.clone());
                    Some(handle)
                }
                Err(error) => {
                    tracing::warn!(%error, "no Prometheus recorder: GET /metrics will answer 503");
                    None
                }
            }
        })
        .as_ref()
}

/// Drains the histograms every [`UPKEEP`] for the life of the process. A thread rather than a
/// task: the recorder outlives any one tokio runtime (each test has its own).
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".to_owned())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP);
            handle.run_upkeep();
        });
    if let Err(error) = spawned {
        // Each scrape still runs the upkeep itself.
        tracing::warn!(%error, "cannot start the metrics upkeep thread");
    }
}

/// `GET /metrics`: the Prometheus text of everything recorded in this process.
pub async fn render() -> Response {
    match install() {
        Some(handle) => {
            handle.run_upkeep();
            (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                handle.render(),
            )
                .into_response()
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "another metrics recorder is installed in this process\n",
        )
            .into_response(),
    }
}
