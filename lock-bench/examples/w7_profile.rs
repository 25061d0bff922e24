//! One W7 route at a time, a fixed number of requests, for an instruction count under
//! `valgrind --tool=callgrind` (the difference of two request counts cancels the start-up).
//!
//! `cargo build --release -p lock-bench --example w7_profile`, then, with a `redis-server` on
//! `REDIS_URL`: `valgrind --tool=callgrind target/release/examples/w7_profile layer 16 250`
//! (route: `layer`, `kit`, `floor` or `plain`; connections; requests per connection).
//!
//! Three more routes take W7's comparison apart: `cm` is the hand-rolled lock on `redis`'s
//! `ConnectionManager` (the kit's reconnecting connection) instead of a plain multiplexed
//! connection, `identity` the plain route behind a layer that does nothing (`MapResponse`
//! with the identity), `middleware` the plain route behind the hand-rolled lock written as an
//! axum middleware (what any lock layer pays for being middleware).
//!
//! The routes and the load loop repeat `src/http.rs`'s, so that the profile is of the code the
//! benchmark times: the benchmark is a binary crate, with no library to share them from.

use std::net::SocketAddr;
use std::sync::LazyLock;
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
use redis::aio::MultiplexedConnection;
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

async fn echo(Path(id): Path<String>) -> String {
    id
}

/// The hand-rolled lock's acquire: `SET NX PX` with a fresh random token, which it returns.
async fn hand_rolled_lock<C: redis::aio::ConnectionLike + Clone>(
    conn: &C,
    key: &str,
) -> Result<String, StatusCode> {
    let token = format!("{:032x}", rand::random::<u128>());
    let reply: redis::Value = redis::cmd("SET")
        .arg(key)
        .arg(&token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn.clone())
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    if matches!(reply, redis::Value::Nil) {
        return Err(StatusCode::CONFLICT);
    }
    Ok(token)
}

/// The hand-rolled lock's release: compare-and-delete by `EVALSHA`.
async fn hand_rolled_unlock<C: redis::aio::ConnectionLike + Clone>(
    conn: &C,
    key: &str,
    token: &str,
) -> Result<(), StatusCode> {
    let _: i64 = RELEASE
        .key(key)
        .arg(token)
        .invoke_async(&mut conn.clone())
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    Ok(())
}

async fn floor_echo<C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static>(
    State(conn): State<C>,
    Path(id): Path<String>,
) -> Result<String, StatusCode> {
    let key = format!("w7prof:floor:w7:{id}");
    let token = hand_rolled_lock(&conn, &key).await?;
    hand_rolled_unlock(&conn, &key, &token).await?;
    Ok(id)
}

/// The hand-rolled lock as an axum middleware: what a layer costs that does only what the
/// hand-rolled lock in the handler does.
async fn floor_middleware(
    State(conn): State<MultiplexedConnection>,
    Path(id): Path<String>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<axum::response::Response, StatusCode> {
    let key = format!("w7prof:mw:w7:{id}");
    let token = hand_rolled_lock(&conn, &key).await?;
    let response = next.run(request).await;
    hand_rolled_unlock(&conn, &key, &token).await?;
    Ok(response)
}

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

async fn load(
    addr: SocketAddr,
    path: &str,
    conns: usize,
    per_conn: usize,
) -> Result<u64, BoxError> {
    let clients: Vec<_> = (0..conns)
        .map(|c| {
            let path = path.to_owned();
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                let driver = tokio::spawn(conn);
                let mut bad = 0u64;
                for i in 0..per_conn {
                    let request = Request::get(format!("{path}{c}-{i}"))
                        .header(http::header::HOST, "bench")
                        .body(Empty::<Bytes>::new())?;
                    sender.ready().await?;
                    let response = sender.send_request(request).await?;
                    if response.status() != StatusCode::OK {
                        bad += 1;
                    }
                    response.into_body().collect().await?;
                }
                drop(sender);
                driver.abort();
                Ok::<_, BoxError>(bad)
            })
        })
        .collect();
    let mut bad = 0;
    for client in clients {
        bad += client.await??;
    }
    Ok(bad)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let route = args.get(1).map_or("layer", String::as_str);
    let conns: usize = args.get(2).map_or(Ok(16), |a| a.parse())?;
    let per_conn: usize = args.get(3).map_or(Ok(250), |a| a.parse())?;
    let url = std::env::var("REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let run = rand::random::<u32>();
    let locker = Locker::builder()
        .url(&url)
        .prefix(format!("w7prof:{run}"))
        .fence_retention(Duration::from_secs(120))
        .build()
        .await?;
    let conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let manager = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    let app = Router::new()
        .route("/layer/{id}", get(echo))
        .route_layer(
            DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("id").prefix("w7:"))
                .mode(Mode::Exclusive),
        )
        .route("/plain/{id}", get(echo))
        .merge(
            Router::new()
                .route("/identity/{id}", get(echo))
                .route_layer(tower::util::MapResponseLayer::new(
                    |r: axum::response::Response| r,
                )),
        )
        .merge(
            Router::new()
                .route("/middleware/{id}", get(echo))
                .route_layer(axum::middleware::from_fn_with_state(
                    conn.clone(),
                    floor_middleware,
                )),
        )
        .merge(
            Router::new()
                .route("/floor/{id}", get(floor_echo::<MultiplexedConnection>))
                .with_state(conn),
        )
        .merge(
            Router::new()
                .route("/cm/{id}", get(floor_echo::<redis::aio::ConnectionManager>))
                .with_state(manager),
        )
        .merge(
            Router::new()
                .route("/kit/{id}", get(kit_echo))
                .with_state(locker),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let path = format!("/{route}/{run}-");
    let bad = load(addr, &path, conns, per_conn).await?;
    eprintln!("{route}: {} requests, {bad} not 200", conns * per_conn);
    Ok(())
}
