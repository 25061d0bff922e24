//! `GET /metrics`: the lock kit's metrics (every name `lock_*`) in the Prometheus text format.
//! lock-core records through the `metrics` facade; this module installs the process's
//! recorder, `metrics-exporter-prometheus`, and renders it on the service's own router.

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The bucket bounds of every histogram (the kit's are all durations), in seconds: from an
/// uncontended acquire (sub-millisecond) to holds of minutes. Without buckets the exporter
/// renders summaries, which Prometheus cannot aggregate across instances.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0,
];

/// Installs the Prometheus recorder, the first time it is called. `None` (logged) when the
/// process already had another recorder: the metrics go there, and `/metrics` answers `503`.
pub fn install() -> Option<&'static PrometheusHandle> {
    static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    let install = || {
        let builder = PrometheusBuilder::new().set_buckets(SECONDS_BUCKETS);
        let handle = builder.and_then(PrometheusBuilder::install_recorder);
        let handle = handle
            .map_err(|e| tracing::warn!(%e, "no Prometheus recorder"))
            .ok()?;
        // The HELP lines, in case a locker was built before this recorder existed.
        lock_core::metrics::describe();
        // Drains histograms into their buckets however rarely `/metrics` is read, so that their
        // memory stays bounded. A thread: the recorder outlives any one runtime.
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new().spawn(move || loop {
            std::thread::sleep(Duration::from_secs(5));
            upkeep.run_upkeep();
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "no metrics upkeep thread: only scrapes run it");
        }
        Some(handle)
    };
    RECORDER.get_or_init(install).as_ref()
}

/// `GET /metrics`: the Prometheus text of everything recorded in this process.
pub async fn render() -> Response {
    let Some(handle) = install() else {
        let message = "another metrics recorder is installed in this process\n";
        return (StatusCode::SERVICE_UNAVAILABLE, message).into_response();
    };
    handle.run_upkeep();
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], handle.render()).into_response()
}
