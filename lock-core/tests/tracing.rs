//! The tracing spans: `lock.acquire` (key, outcome), `lock.hold` from the grant to the release
//! (key, the release's outcome; info level with `trace_holds(true)`, else debug) and
//! `lock.release` (key, outcome), seen through a fmt subscriber that logs span closes.

mod common;

use lock_testkit::LogBuffer;
use std::time::Duration;

use common::{locker, server};
use lock_core::Locker;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::fmt::format::FmtSpan;

/// The lines of `logs` that close a span named `name` (its own close, not a child's: the last
/// span of the line's context is `name`).
fn closed(logs: &LogBuffer, name: &str) -> Vec<String> {
    let open = format!("{name}{{");
    logs.text()
        .lines()
        .filter(|line| line.contains(": close "))
        .filter(|line| {
            let context = line.split(": ").next().unwrap_or_default();
            let last = context.rsplit("}:").next().unwrap_or_default();
            last.starts_with(&open) || last.contains(&format!(" {open}"))
        })
        .map(str::to_owned)
        .collect()
}

/// Logs of this thread (the tests' runtimes have one) at `level`, span closes included.
fn capture(level: tracing::Level) -> (LogBuffer, DefaultGuard) {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

#[tokio::test]
async fn acquire_hold_and_release_spans_carry_the_key_and_the_outcome() {
    let (logs, _default) = capture(tracing::Level::DEBUG);
    let server = server();
    let locker = locker(&server).await;
    let other = common::locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    assert!(other
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    guard.release().await.unwrap();

    let acquires = closed(&logs, "lock.acquire");
    assert_eq!(acquires.len(), 2, "{}", logs.text());
    assert!(
        acquires[0].contains("key=k") && acquires[0].contains("outcome=\"acquired\""),
        "{acquires:?}"
    );
    assert!(acquires[1].contains("outcome=\"busy\""), "{acquires:?}");
    let releases = closed(&logs, "lock.release");
    assert_eq!(releases.len(), 1, "{}", logs.text());
    assert!(
        releases[0].contains("key=k") && releases[0].contains("outcome=\"released\""),
        "{releases:?}"
    );
    // The release runs inside the hold, which ends with its outcome.
    assert!(releases[0].contains("lock.hold{"), "{releases:?}");
    let holds = closed(&logs, "lock.hold");
    assert_eq!(holds.len(), 1, "{}", logs.text());
    assert!(holds[0].contains("key=k outcome=\"released\""), "{holds:?}");
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

#[tokio::test]
async fn the_hold_span_is_at_info_level_only_with_trace_holds() {
    let (logs, _default) = capture(tracing::Level::INFO);
    let server = server();
    let quiet = locker(&server).await;
    quiet.lock("quiet").await.unwrap().release().await.unwrap();
    let traced = Locker::builder()
        .url(server.url())
        .trace_holds(true)
        .build()
        .await
        .unwrap();
    traced
        .lock("traced")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let holds = closed(&logs, "lock.hold");
    assert_eq!(holds.len(), 1, "{}", logs.text());
    assert!(
        holds[0].contains("key=traced") && holds[0].contains("outcome=\"released\""),
        "{holds:?}"
    );
    // The per-acquire detail stays at debug.
    assert!(closed(&logs, "lock.acquire").is_empty(), "{}", logs.text());
    assert!(closed(&logs, "lock.release").is_empty(), "{}", logs.text());
    common::assert_nothing_left(&server, &[&quiet, &traced]).await;
}
