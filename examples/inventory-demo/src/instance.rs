//! One instance as the demo runs it (`inventory-demo serve`): the service's router, plus the
//! [`control`](crate::control) purchases, the debug routes and the [`recorder`](crate::recorder)
//! in front of it all.
//!
//! | route | what it does |
//! |---|---|
//! | `PUT /debug/chaos` | `{"pause_ms", "every", "max"}`: stalls every `every`-th write of this instance (at most `max` times) for `pause_ms`, right before it writes |
//! | `DELETE /debug/chaos` | stops stalling |
//! | `PUT /debug/trace` | starts recording the purchases that carry an `x-purchase-id` header |
//! | `GET /debug/trace` | the [`Attempt`] values recorded since the last `GET`, as JSON |
//! | `DELETE /debug/trace` | stops recording |

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::put;
use axum::{Json, Router};
use inventory::{AppState, ServeArgs};
use tracing::{Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::chaos::{ChaosPlan, MAX_PAUSE};
use crate::recorder::{record, Attempt, AttemptLayer, Recorder};

/// The options of `inventory-demo serve`: the service's, and how the demo stops it.
#[derive(Debug, Clone, clap::Args)]
pub struct InstanceArgs {
    /// The service's settings.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Exit when standard input closes (the demo's instances die with it).
    #[arg(long, hide = true)]
    pub watch_stdin: bool,
}

/// The router of one demo instance: the service's and the demo's routes, recorded.
pub fn app(state: AppState) -> Router {
    let recorder = Recorder::new(state.config.instance.clone());
    let debug = Router::new()
        .route("/debug/chaos", put(arm_chaos).delete(disarm_chaos))
        .route(
            "/debug/trace",
            put(start_trace).get(take_trace).delete(stop_trace),
        )
        .with_state(recorder.clone());
    inventory::app(state.clone())
        .merge(crate::control::routes(state))
        .merge(debug)
        // Outermost, so a recorded attempt starts before any lock layer waits.
        .layer(axum::middleware::from_fn_with_state(recorder, record))
}

/// Runs one instance until SIGTERM, Ctrl-C or (with `--watch-stdin`) the end of standard input.
///
/// # Errors
///
/// The service's [`ServeError`](inventory::server::ServeError).
pub async fn serve(args: InstanceArgs) -> Result<(), inventory::server::ServeError> {
    let watch_stdin = args.watch_stdin;
    let stop = async move {
        let stdin_closed = async {
            if watch_stdin {
                let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut tokio::io::sink()).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = inventory::shutdown_signal() => {}
            () = stdin_closed => {}
        }
    };
    inventory::serve(args.serve, app, stop).await
}

/// The subscriber of a demo process: logs on standard error at `RUST_LOG` (else
/// `default_log`), and the [`AttemptLayer`] reading the service's spans.
pub fn subscriber(default_log: &str) -> impl Subscriber + Send + Sync {
    let log = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_log));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(log);
    let steps = Targets::new()
        .with_target("inventory", Level::DEBUG)
        .with_target("inventory_demo", Level::DEBUG);
    tracing_subscriber::registry()
        .with(logs)
        .with(AttemptLayer.with_filter(steps))
}

/// Arms the plan; a pause longer than [`MAX_PAUSE`] is refused (`400`).
async fn arm_chaos(
    State(recorder): State<Arc<Recorder>>,
    Json(plan): Json<ChaosPlan>,
) -> Result<StatusCode, (StatusCode, String)> {
    if Duration::from_millis(plan.pause_ms) > MAX_PAUSE {
        let max = MAX_PAUSE.as_millis();
        let message = format!(
            "pause_ms {} is longer than the {max} ms allowed\n",
            plan.pause_ms
        );
        return Err((StatusCode::BAD_REQUEST, message));
    }
    tracing::info!(?plan, "chaos armed");
    recorder.chaos.arm(Some(plan));
    Ok(StatusCode::NO_CONTENT)
}

async fn disarm_chaos(State(recorder): State<Arc<Recorder>>) -> StatusCode {
    recorder.chaos.arm(None);
    StatusCode::NO_CONTENT
}

async fn start_trace(State(recorder): State<Arc<Recorder>>) -> StatusCode {
    recorder.start();
    StatusCode::NO_CONTENT
}

async fn take_trace(State(recorder): State<Arc<Recorder>>) -> Json<Vec<Attempt>> {
    Json(recorder.take())
}

async fn stop_trace(State(recorder): State<Arc<Recorder>>) -> StatusCode {
    recorder.stop();
    StatusCode::NO_CONTENT
}
