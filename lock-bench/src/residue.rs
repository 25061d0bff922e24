//! W12: what releases leave behind in Redis.
//!
//! Tasks cycle acquire+release on fresh keys for a while; then the keys under the run's prefix
//! are counted and their memory summed (`MEMORY USAGE`), at once and again after a pause
//! longer than the kit's release retry window. The floor's compare-and-delete leaves nothing;
//! the kit leaves each release's latch for the window (see `release.lua`), then nothing.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::lock::BoxError;
use crate::report::{Check, Row};
use crate::uncontended::cycle;
use crate::{Ctx, Side};

/// Keys asked per `SCAN` step and per pipelined batch of `MEMORY USAGE`.
const BATCH: usize = 1_000;

/// Keys under `prefix` that are alive now, and the bytes Redis reports for them.
async fn left_behind(
    conn: &mut MultiplexedConnection,
    prefix: &str,
) -> Result<(u64, u64), BoxError> {
    let pattern = format!("{prefix}*");
    let mut cursor = 0u64;
    let (mut keys, mut bytes) = (0u64, 0u64);
    loop {
        // SCAN skips keys whose TTL ran out (it deletes them in passing), so what it returns is
        // what a client could still read.
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query_async(conn)
            .await?;
        if !batch.is_empty() {
            let mut pipe = redis::pipe();
            for key in &batch {
                pipe.cmd("MEMORY").arg("USAGE").arg(key);
            }
            // A key that expired between SCAN and MEMORY USAGE answers nil.
            let sizes: Vec<Option<u64>> = pipe.query_async(conn).await?;
            keys += sizes.iter().flatten().count() as u64;
            bytes += sizes.iter().flatten().sum::<u64>();
        }
        cursor = next;
        if cursor == 0 {
            return Ok((keys, bytes));
        }
    }
}

/// W12: `w12_tasks` tasks cycling on fresh keys for `w12_secs`, then what is left, at once and
/// `w12_after_secs` later.
pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let wait = ctx.wait();
    let mut cycles = [vec![], vec![]];
    let (mut keys_now, mut bytes_now) = ([vec![], vec![]], [vec![], vec![]]);
    let (mut keys_later, mut bytes_later) = ([vec![], vec![]], [vec![], vec![]]);
    for rep in 0..p.reps {
        for (s, side) in Side::BOTH.into_iter().enumerate() {
            let prefix = ctx.prefix("w12", rep, side);
            let lock = ctx.open(side, &prefix).await?;
            let end = Instant::now() + Duration::from_secs_f64(p.w12_secs);
            let tasks: Vec<_> = (0..p.w12_tasks)
                .map(|t| {
                    let lock = lock.clone();
                    tokio::spawn(async move {
                        let mut done = 0u64;
                        while Instant::now() < end {
                            cycle(&lock, &format!("t{t}:{done}"), wait).await?;
                            done += 1;
                        }
                        Ok::<u64, BoxError>(done)
                    })
                })
                .collect();
            let mut done = 0;
            for task in tasks {
                done += task.await??;
            }
            let mut conn = ctx.conn();
            let (k0, b0) = left_behind(&mut conn, &prefix).await?;
            tokio::time::sleep(Duration::from_secs_f64(p.w12_after_secs)).await;
            let (k1, b1) = left_behind(&mut conn, &prefix).await?;
            ctx.progress(
                "W12",
                rep,
                side,
                &format!(
                    "{done} releases; left at once: {k0} keys, {b0} B; {:.1} s later: {k1} keys, {b1} B",
                    p.w12_after_secs
                ),
            );
            cycles[s].push(done as f64);
            keys_now[s].push(k0 as f64);
            bytes_now[s].push(b0 as f64);
            keys_later[s].push(k1 as f64);
            bytes_later[s].push(b1 as f64);
        }
    }
    let w = format!(
        "W12 residue, {} tasks x {} s on fresh keys",
        p.w12_tasks, p.w12_secs
    );
    let later = format!("{} s later", p.w12_after_secs);
    let [kc, fc] = cycles;
    let [kk0, fk0] = keys_now;
    let [kb0, fb0] = bytes_now;
    let [kk1, fk1] = keys_later;
    let [kb1, fb1] = bytes_later;
    Ok(vec![
        Row::new(&w, "releases", "", kc, fc, Check::Info),
        Row::new(&w, "keys left at once", "", kk0, fk0, Check::Info),
        Row::new(
            &w,
            "bytes left at once (MEMORY USAGE)",
            "B",
            kb0,
            fb0,
            Check::Info,
        ),
        Row::new(
            &w,
            &format!("keys left {later}"),
            "",
            kk1,
            fk1,
            Check::KitAllEqual(0.0),
        ),
        Row::new(
            &w,
            &format!("bytes left {later}"),
            "B",
            kb1,
            fb1,
            Check::KitAllEqual(0.0),
        ),
    ])
}
