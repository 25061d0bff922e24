//! W7: HTTP requests through an axum route with `DistributedLockLayer` (kit column) and the
//! same route without it (floor column), every request on its own key, from a hyper/1.1 load
//! generator with keep-alive connections in the same process.
//!
//! The handler does no work (it echoes its path parameter), so the ratio is the layer's whole
//! cost: an acquire and a confirmed release in Redis per request. A third route takes a
//! hand-rolled floor lock inside the handler: the reference for what two Redis round trips per
//! request cost without any middleware.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lock_tower::{DistributedLockLayer, KeyFrom, Mode};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::floor::Floor;
use crate::lock::{kit_locker, BoxError, Lock};
use crate::report::{Check, Row};
use crate::stats::percentile;
use crate::{Ctx, Side};

async fn echo(Path(id): Path<String>) -> String {
    id
}

/// One load run: `conns` connections sending requests back to back for `secs`.
struct Load {
    client_cpu_us: f64,
    redis_cpu_us: f64,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    bad: f64,
}

async fn load(
    ctx: &Ctx,
    addr: SocketAddr,
    path: String,
    conns: usize,
    secs: f64,
) -> Result<Load, BoxError> {
    let cpu0 = ctx.cpu().await?;
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(secs);
    let clients: Vec<_> = (0..conns)
        .map(|c| {
            let path = path.clone();
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                let driver = tokio::spawn(conn);
                let (mut latencies, mut bad) = (Vec::new(), 0u64);
                let mut i = 0u64;
                while Instant::now() < end {
                    let request = Request::get(format!("{path}{c}-{i}"))
                        .header(http::header::HOST, "bench")
                        .body(Empty::<Bytes>::new())?;
                    i += 1;
                    sender.ready().await?;
                    let t = Instant::now();
                    let response = sender.send_request(request).await?;
                    let ok = response.status() == StatusCode::OK;
                    response.into_body().collect().await?;
                    latencies.push(t.elapsed().as_nanos() as u64);
                    if !ok {
                        bad += 1;
                    }
                }
                drop(sender);
                driver.abort();
                Ok::<_, BoxError>((latencies, bad))
            })
        })
        .collect();
    let (mut latencies, mut bad) = (Vec::new(), 0);
    for client in clients {
        let (l, b) = client.await??;
        latencies.extend(l);
        bad += b;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (client_cpu_us, redis_cpu_us) = ctx.cpu().await?.per_op_us(&cpu0, latencies.len() as u64);
    Ok(Load {
        client_cpu_us,
        redis_cpu_us,
        per_sec: latencies.len() as f64 / elapsed,
        p50_ms: percentile(&mut latencies, 50.0) / 1e6,
        p99_ms: percentile(&mut latencies, 99.0) / 1e6,
        bad: bad as f64,
    })
}

/// A handler that takes a hand-rolled floor lock on its key around the same (empty) work: the
/// inherent cost of two Redis round trips per request, without any middleware.
async fn floor_echo(
    State(floor): State<Floor>,
    Path(id): Path<String>,
) -> Result<String, StatusCode> {
    let guard = floor
        .lock(&format!("w7:{id}"), Duration::ZERO)
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?
        .ok_or(StatusCode::CONFLICT)?;
    floor
        .unlock(&guard)
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    Ok(id)
}

/// The three routes, in the order each repetition loads them.
const ROUTES: [(&str, &str); 3] = [
    ("/locked/", "DistributedLockLayer"),
    ("/plain/", "no lock"),
    ("/floor/", "hand-rolled lock in the handler"),
];

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let mut runs: [Vec<Load>; 3] = [vec![], vec![], vec![]];
    for rep in 0..p.reps {
        let locker = kit_locker(&ctx.url, &ctx.prefix("w7", rep, Side::Kit), None).await?;
        Lock::Kit(locker.clone()).warm_up("warm-up").await?;
        let floor = Floor::connect(
            &ctx.url,
            ctx.prefix("w7", rep, Side::Floor),
            p.floor_lease_ms,
            Duration::ZERO,
        )
        .await?;
        let app = Router::new()
            .route("/locked/{id}", get(echo))
            // Exclusive, as the hand-rolled lock it is compared with (GETs would take the read
            // lock by default).
            .route_layer(
                DistributedLockLayer::new(locker, KeyFrom::path_param("id").prefix("w7:"))
                    .mode(Mode::Exclusive),
            )
            .route("/plain/{id}", get(echo))
            .merge(
                Router::new()
                    .route("/floor/{id}", get(floor_echo))
                    .with_state(floor),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        // A short warm-up of every route (connections, allocator, scripts).
        for (path, _) in ROUTES {
            load(ctx, addr, format!("{path}warm-{rep}-"), 8, 0.2).await?;
        }
        for (r, (path, name)) in ROUTES.into_iter().enumerate() {
            let l = load(ctx, addr, format!("{path}{rep}-"), p.w7_conns, p.w7_secs).await?;
            eprintln!(
                "[W7] run {}/{} {name}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, {} non-200, CPU per request: bench process {:.1} µs, Redis {:.1} µs",
                rep + 1,
                p.reps,
                l.per_sec,
                l.p50_ms,
                l.p99_ms,
                l.bad,
                l.client_cpu_us,
                l.redis_cpu_us
            );
            runs[r].push(l);
        }
        server.abort();
    }
    let w = format!("W7 tower layer, {} connections", p.w7_conns);
    let col = |r: usize, f: fn(&Load) -> f64| -> Vec<f64> { runs[r].iter().map(f).collect() };
    let row = |metric: &str, unit: &'static str, f: fn(&Load) -> f64, check: Check| {
        Row::new(&w, metric, unit, col(0, f), col(1, f), check)
    };
    Ok(vec![
        row(
            "requests/s (floor column: same route without the layer)",
            "",
            |l| l.per_sec,
            Check::Info,
        ),
        row("latency p50 (vs no lock)", "ms", |l| l.p50_ms, Check::Info),
        row("latency p99 (vs no lock)", "ms", |l| l.p99_ms, Check::Info),
        row(
            "bench process CPU per request, HTTP client + server (vs no lock)",
            "µs",
            |l| l.client_cpu_us,
            Check::Info,
        ),
        row(
            "Redis CPU per request (vs no lock)",
            "µs",
            |l| l.redis_cpu_us,
            Check::Info,
        ),
        Row::new(
            &w,
            "requests/s (floor column: hand-rolled SET NX + EVALSHA lock in the handler, no layer)",
            "",
            col(0, |l| l.per_sec),
            col(2, |l| l.per_sec),
            Check::RatioAtLeast(0.9),
        ),
        Row::new(
            &w,
            "bench process CPU per request (floor column: hand-rolled lock in the handler)",
            "µs",
            col(0, |l| l.client_cpu_us),
            col(2, |l| l.client_cpu_us),
            Check::Info,
        ),
        Row::new(
            &w,
            "non-200 responses (floor column: no lock and hand-rolled, summed)",
            "",
            col(0, |l| l.bad),
            runs[1]
                .iter()
                .zip(&runs[2])
                .map(|(a, b)| a.bad + b.bad)
                .collect(),
            Check::KitAllEqual(0.0),
        ),
    ])
}
