//! W4: tasks increment one Redis counter by read-modify-write (`GET`, yield, `SET n+1`) under
//! the lock; the final count must be exact. The same without any lock is the control that
//! shows lost updates. The kit's tasks are spread over several lockers (service instances), so
//! exclusion goes through Redis, not only through one locker's local queue.

use redis::aio::MultiplexedConnection;

use crate::lock::{kit_locker, BoxError, Lock};
use crate::report::{Check, Row};
use crate::{Ctx, Side};

/// Runs the increments; returns the final counter and the failed increments.
async fn increments(
    ctx: &Ctx,
    locks: Vec<Option<Lock>>,
    counter: &str,
) -> Result<(i64, u64), BoxError> {
    let p = &ctx.params;
    let wait = ctx.wait();
    let tasks: Vec<_> = (0..p.w4_tasks)
        .map(|t| {
            let lock = locks[t % locks.len()].clone();
            let mut conn: MultiplexedConnection = ctx.conn();
            let counter = counter.to_owned();
            let n = p.w4_increments;
            tokio::spawn(async move {
                let mut failed = 0u64;
                for _ in 0..n {
                    let held = match &lock {
                        Some(lock) => match lock.acquire("counter", wait).await {
                            Ok(Some(held)) => Some(held),
                            _ => {
                                failed += 1;
                                continue;
                            }
                        },
                        None => None,
                    };
                    let result: redis::RedisResult<()> = async {
                        let value: Option<i64> = redis::cmd("GET")
                            .arg(&counter)
                            .query_async(&mut conn)
                            .await?;
                        tokio::task::yield_now().await;
                        redis::cmd("SET")
                            .arg(&counter)
                            .arg(value.unwrap_or(0) + 1)
                            .query_async::<()>(&mut conn)
                            .await
                    }
                    .await;
                    if result.is_err() {
                        failed += 1;
                    }
                    if let (Some(lock), Some(held)) = (&lock, held) {
                        if lock.release(held).await.is_err() {
                            failed += 1;
                        }
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for task in tasks {
        failed += task.await?;
    }
    let value: Option<i64> = redis::cmd("GET")
        .arg(counter)
        .query_async(&mut ctx.conn())
        .await?;
    Ok((value.unwrap_or(0), failed))
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let expected = (p.w4_tasks * p.w4_increments) as f64;
    let (mut finals, mut failures, mut control) = ([vec![], vec![]], [vec![], vec![]], vec![]);
    for rep in 0..p.reps {
        for (s, side) in Side::BOTH.into_iter().enumerate() {
            let prefix = ctx.prefix("w4", rep, side);
            let locks = match side {
                Side::Kit => {
                    let mut locks = Vec::new();
                    for _ in 0..p.w4_lockers.max(1) {
                        let lock = Lock::Kit(kit_locker(&ctx.url, &prefix, None).await?);
                        lock.warm_up("warm-up").await?;
                        locks.push(Some(lock));
                    }
                    locks
                }
                Side::Floor | Side::Rslock | Side::Guarded => {
                    vec![Some(ctx.open(side, &prefix).await?)]
                }
            };
            let (value, failed) = increments(ctx, locks, &format!("{prefix}counter-value")).await?;
            ctx.progress(
                "W4",
                rep,
                side,
                &format!("final {value} of {expected}, {failed} failed increments"),
            );
            finals[s].push(value as f64);
            failures[s].push(failed as f64);
        }
        let prefix = format!("{}unlocked:", ctx.prefix("w4", rep, Side::Floor));
        let (value, _) = increments(ctx, vec![None], &format!("{prefix}counter-value")).await?;
        eprintln!(
            "[W4] run {}/{} no lock: final {value} of {expected}",
            rep + 1,
            p.reps
        );
        control.push(value as f64);
    }
    let w = format!("W4 correctness, {} tasks x {}", p.w4_tasks, p.w4_increments);
    let [kf, ff] = finals;
    let [kx, fx] = failures;
    Ok(vec![
        Row::new(&w, "final counter", "", kf, ff, Check::AllEqual(expected)),
        Row::new(&w, "failed increments", "", kx, fx, Check::AllEqual(0.0)),
        Row::new(
            &w,
            "control without lock (floor column): final counter",
            "",
            vec![],
            control,
            Check::FloorAllBelow(expected),
        )
        .target(&format!("< {expected} (lost updates)")),
    ])
}
