//! W7: HTTP requests through an axum route with `DistributedLockLayer` (kit column) and the
//! same route without it (floor column), every request on its own key, from a hyper/1.1 load
//! generator with keep-alive connections in the same process.
//!
//! The handler does no work (it echoes its path parameter), so the ratio is the layer's whole
//! cost: an acquire and a confirmed release in Redis per request. A third route takes a
//! hand-rolled floor lock inside the handler: the reference for what two Redis round trips per
//! request cost without any middleware. A fourth takes the kit's lock inside the handler, as the
//! layer does (exclusive, no wait, the layer's `max_hold`): the layer against it is what the
//! middleware adds; it against the hand-rolled lock is lock-core's and its scripts' share. A
//! fifth wraps the plain route in the hand-rolled lock as an axum middleware: what any lock
//! layer pays for being middleware, whoever writes it. A sixth takes the hand-rolled lock with
//! what the kit does for five of its guarantees (`floor.rs`'s `Guarantees::ALL`, W1's and W2's
//! `floor+guarantees`) in the handler: of the kit's gap to the hand-rolled lock, the share
//! those guarantees take, and the kit's own path's share.
//!
//! Each repetition runs the six routes in short slices, taking turns (the order rotated each
//! slice), rather than one route after the other: on a shared machine whose load swings over
//! seconds, every route then samples the same swings, and the ratios between routes stop
//! following which route happened to run in a quiet moment.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lock_core::{LockError, Locker};
use lock_tower::{DistributedLockLayer, KeyFrom, Mode};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::floor::Floor;
use crate::lock::{kit_locker, release_retry_window, BoxError, Lock};
use crate::report::{Check, Row};
use crate::stats::percentile;
use crate::{Ctx, Side};

async fn echo(Path(id): Path<String>) -> String {
    id
}

/// How long a route runs before the next one takes its turn (about; the route's seconds of a
/// repetition are cut into equal slices).
const SLICE_SECS: f64 = 0.5;

/// One route's load over a repetition: the sums of its slices.
#[derive(Default)]
struct Load {
    requests: u64,
    secs: f64,
    client_cpu_s: f64,
    redis_cpu_s: f64,
    latencies: Vec<u64>,
    bad: u64,
}

/// What a repetition reports of one route.
struct Summary {
    client_cpu_us: f64,
    redis_cpu_us: f64,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    bad: f64,
}

impl Load {
    fn summary(mut self) -> Summary {
        let requests = self.requests.max(1) as f64;
        Summary {
            client_cpu_us: self.client_cpu_s * 1e6 / requests,
            redis_cpu_us: self.redis_cpu_s * 1e6 / requests,
            per_sec: self.requests as f64 / self.secs,
            p50_ms: percentile(&mut self.latencies, 50.0) / 1e6,
            p99_ms: percentile(&mut self.latencies, 99.0) / 1e6,
            bad: self.bad as f64,
        }
    }
}

/// Adds one slice of load to `into`: `conns` connections sending requests back to back for
/// `secs`.
async fn load(
    ctx: &Ctx,
    addr: SocketAddr,
    path: String,
    conns: usize,
    secs: f64,
    into: &mut Load,
) -> Result<(), BoxError> {
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
    let mut requests = 0;
    for client in clients {
        let (l, b) = client.await??;
        requests += l.len() as u64;
        into.latencies.extend(l);
        into.bad += b;
    }
    into.secs += started.elapsed().as_secs_f64();
    let cpu = ctx.cpu().await?;
    into.client_cpu_s += cpu.client - cpu0.client;
    into.redis_cpu_s += cpu.server - cpu0.server;
    into.requests += requests;
    Ok(())
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

/// The hand-rolled floor lock as an axum middleware around the plain route: the layer's
/// structure (the route's service wrapped, the response awaited through `Next`, the release
/// after it) with nothing of the kit's.
async fn floor_middleware(
    State(floor): State<Floor>,
    Path(id): Path<String>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<axum::response::Response, StatusCode> {
    let guard = floor
        .lock(&format!("w7-middleware:{id}"), Duration::ZERO)
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?
        .ok_or(StatusCode::CONFLICT)?;
    let response = next.run(request).await;
    floor
        .unlock(&guard)
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    Ok(response)
}

/// A handler that takes the kit's lock on its key itself, as the layer would (exclusive, no
/// wait, the layer's default `max_hold`), and releases it before answering: the layer's
/// Redis work and lock-core's cost without the middleware, so that the layer's own share of
/// the gap to the hand-rolled lock shows.
async fn kit_echo(
    State(locker): State<Locker>,
    Path(id): Path<String>,
) -> Result<String, StatusCode> {
    let guard = locker
        .lock(format!("w7:{id}"))
        .max_hold(lock_tower::DEFAULT_MAX_HOLD)
        .await
        .map_err(|e| match e {
            LockError::Busy { .. } => StatusCode::CONFLICT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        })?;
    guard
        .release()
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    Ok(id)
}

/// The routes of `ROUTES` that take the kit's lock, whose releases leave latches in Redis.
const KIT_ROUTES: [usize; 2] = [0, 3];

/// The six routes, in the order each repetition loads them.
const ROUTES: [(&str, &str); 6] = [
    ("/locked/", "DistributedLockLayer"),
    ("/plain/", "no lock"),
    ("/floor/", "hand-rolled lock in the handler"),
    ("/kit/", "the kit's lock in the handler"),
    ("/middleware/", "hand-rolled lock as axum middleware"),
    (
        "/guarded/",
        "hand-rolled lock with the kit's guarantees in the handler",
    ),
];

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let mut runs: [Vec<Summary>; ROUTES.len()] = Default::default();
    let slices = (p.w7_secs / SLICE_SECS).ceil().max(1.0) as usize;
    let slice_secs = p.w7_secs / slices as f64;
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
        let guarded = Floor::connect_guarded(
            &ctx.url,
            ctx.prefix("w7", rep, Side::Guarded),
            p.floor_lease_ms,
            Duration::ZERO,
        )
        .await?;
        let app = Router::new()
            .route("/locked/{id}", get(echo))
            // Exclusive, as the hand-rolled lock it is compared with (GETs would take the read
            // lock by default).
            .route_layer(
                DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("id").prefix("w7:"))
                    .mode(Mode::Exclusive),
            )
            .route("/plain/{id}", get(echo))
            .merge(
                Router::new()
                    .route("/middleware/{id}", get(echo))
                    .route_layer(axum::middleware::from_fn_with_state(
                        floor.clone(),
                        floor_middleware,
                    )),
            )
            .merge(
                Router::new()
                    .route("/floor/{id}", get(floor_echo))
                    .with_state(floor),
            )
            .merge(
                Router::new()
                    .route("/guarded/{id}", get(floor_echo))
                    .with_state(guarded),
            )
            .merge(
                Router::new()
                    .route("/kit/{id}", get(kit_echo))
                    .with_state(locker),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        // A short warm-up of every route (connections, allocator, scripts).
        for (path, _) in ROUTES {
            load(
                ctx,
                addr,
                format!("{path}warm-{rep}-"),
                8,
                0.2,
                &mut Load::default(),
            )
            .await?;
        }
        // With a release window (an A/B of what it costs), a kit route's slice is followed by
        // a pause until its release latches expired: Redis's work expiring them is charged to
        // no other route's slice. Without one (the default) releases leave nothing to expire.
        let latches = release_retry_window()
            .filter(|window| !window.is_zero())
            .map(|window| window + Duration::from_millis(300));
        if let Some(latches) = latches {
            tokio::time::sleep(latches).await;
        }
        let mut loads: [Load; ROUTES.len()] = Default::default();
        for slice in 0..slices {
            for turn in 0..ROUTES.len() {
                let r = (slice + turn) % ROUTES.len();
                let path = format!("{}{rep}-{slice}-", ROUTES[r].0);
                load(ctx, addr, path, p.w7_conns, slice_secs, &mut loads[r]).await?;
                if let (Some(latches), true) = (latches, KIT_ROUTES.contains(&r)) {
                    tokio::time::sleep(latches).await;
                }
            }
        }
        for (r, l) in loads.into_iter().enumerate() {
            let l = l.summary();
            eprintln!(
                "[W7] run {}/{} {}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, {} non-200, CPU per request: bench process {:.1} µs, Redis {:.1} µs",
                rep + 1,
                p.reps,
                ROUTES[r].1,
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
    let col = |r: usize, f: fn(&Summary) -> f64| -> Vec<f64> { runs[r].iter().map(f).collect() };
    // One metric of route `kit` (the kit column) against route `floor` (the floor column).
    let compare =
        |metric: &str,
         unit: &'static str,
         kit: usize,
         floor: usize,
         f: fn(&Summary) -> f64,
         check: Check| { Row::new(&w, metric, unit, col(kit, f), col(floor, f), check) };
    let row = |metric: &str, unit: &'static str, f: fn(&Summary) -> f64, check: Check| {
        compare(metric, unit, 0, 1, f, check)
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
        compare(
            "requests/s (floor column: hand-rolled SET NX + EVALSHA lock in the handler, no layer)",
            "",
            0,
            2,
            |l| l.per_sec,
            Check::RatioAtLeast(0.9),
        ),
        compare(
            "bench process CPU per request (floor column: hand-rolled lock in the handler)",
            "µs",
            0,
            2,
            |l| l.client_cpu_us,
            Check::Info,
        ),
        compare(
            "requests/s (floor column: the kit's lock taken in the handler, no layer)",
            "",
            0,
            3,
            |l| l.per_sec,
            Check::Info,
        ),
        compare(
            "bench process CPU per request (floor column: the kit's lock in the handler)",
            "µs",
            0,
            3,
            |l| l.client_cpu_us,
            Check::Info,
        ),
        compare(
            "kit's lock in the handler: requests/s (floor column: hand-rolled lock in the handler)",
            "",
            3,
            2,
            |l| l.per_sec,
            Check::Info,
        ),
        compare(
            "requests/s (floor column: hand-rolled lock as axum middleware)",
            "",
            0,
            4,
            |l| l.per_sec,
            Check::Info,
        ),
        compare(
            "bench process CPU per request (floor column: hand-rolled lock as axum middleware)",
            "µs",
            0,
            4,
            |l| l.client_cpu_us,
            Check::Info,
        ),
        compare(
            "hand-rolled lock as axum middleware: requests/s (floor column: hand-rolled lock in the handler)",
            "",
            4,
            2,
            |l| l.per_sec,
            Check::Info,
        ),
        compare(
            "kit's lock in the handler: requests/s (floor column: hand-rolled lock with the kit's guarantees in the handler)",
            "",
            3,
            5,
            |l| l.per_sec,
            Check::Info,
        ),
        compare(
            "kit's lock in the handler: bench process CPU per request (floor column: hand-rolled lock with the kit's guarantees in the handler)",
            "µs",
            3,
            5,
            |l| l.client_cpu_us,
            Check::Info,
        ),
        compare(
            "hand-rolled lock with the kit's guarantees in the handler: requests/s (floor column: hand-rolled lock in the handler)",
            "",
            5,
            2,
            |l| l.per_sec,
            Check::Info,
        ),
        compare(
            "hand-rolled lock with the kit's guarantees in the handler: bench process CPU per request (floor column: hand-rolled lock in the handler)",
            "µs",
            5,
            2,
            |l| l.client_cpu_us,
            Check::Info,
        ),
        Row::new(
            &w,
            "non-200 responses (floor column: no lock, the hand-rolled lock in the handler, as middleware and with the kit's guarantees, the kit's lock in the handler, summed)",
            "",
            col(0, |l| l.bad),
            (0..runs[1].len())
                .map(|i| (1..ROUTES.len()).map(|r| runs[r][i].bad).sum())
                .collect(),
            Check::KitAllEqual(0.0),
        ),
    ])
}
