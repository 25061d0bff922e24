//! W5: a task that holds a key acquires and releases it again, many times. The kit answers
//! from its registry without Redis; the floor has no reentrancy (its `SET NX` on a key it holds
//! fails: a hand-rolled lock deadlocks itself), so it has no column here.

use tokio::time::Instant;

use crate::lock::{kit_locker, BoxError, Lock};
use crate::report::{Check, Row};
use crate::{Ctx, Side};

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let (mut ns, mut cmds) = (vec![], vec![]);
    for rep in 0..p.reps {
        let locker = kit_locker(&ctx.url, &ctx.prefix("w5", rep, Side::Kit), None).await?;
        Lock::Kit(locker.clone()).warm_up("warm-up").await?;
        let key = "held".to_owned();
        let outer = locker.lock(&key).await?;
        for _ in 0..1000 {
            locker.lock(&key).await?.release().await?;
        }
        let before = ctx.stats().await?;
        let started = Instant::now();
        for _ in 0..p.w5_cycles {
            let nested = locker.lock(&key).await?;
            nested.release().await?;
        }
        let per_cycle = started.elapsed().as_nanos() as f64 / p.w5_cycles.max(1) as f64;
        let stats = ctx.stats().await?.since(&before);
        outer.release().await?;
        ctx.progress(
            "W5",
            rep,
            Side::Kit,
            &format!(
                "{per_cycle:.0} ns per nested cycle, {} Redis commands {}",
                stats.all(),
                stats.to_json()
            ),
        );
        ns.push(per_cycle);
        cmds.push(stats.all() as f64);
    }
    let w = "W5 reentrancy (nested acquire+release)";
    Ok(vec![
        Row::new(
            w,
            "time per nested cycle",
            "ns",
            ns,
            vec![],
            Check::KitBelow(1000.0),
        )
        .floor_note("self-deadlock"),
        Row::new(
            w,
            "Redis commands during nested cycles",
            "",
            cmds,
            vec![],
            Check::AllEqual(0.0),
        )
        .floor_note("self-deadlock"),
    ])
}
