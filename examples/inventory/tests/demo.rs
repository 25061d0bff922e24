//! The demo at small scale, against a redis-server it starts itself (lock-testkit) and
//! instances that are separate processes of the `inventory` binary: the unlocked variant
//! oversells, every locked variant sells exactly the stock; with chaos, the lock without a
//! fencing token oversells and the fenced one does not.

use std::time::Duration;

use inventory::demo::{self, DemoConfig};
use inventory::Variant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_stop_the_oversell_and_fencing_stops_it_under_chaos() {
    let mut config = DemoConfig::new(env!("CARGO_BIN_EXE_inventory"));
    config.instances = 2;
    config.stock = 20;
    config.purchases = 200;
    config.concurrency = 32;
    // Wider than the demo's 5 ms, so the unlocked race shows at this small scale.
    config.think = Duration::from_millis(10);
    config.variants = vec![
        Variant::Unlocked,
        Variant::Macro,
        Variant::Layer,
        Variant::Fenced,
        Variant::LockedNoFence,
    ];
    config.chaos = true;
    config.progress = false;
    config.redis_url = None; // the demo starts its own redis-server

    let report = demo::run(&config).await.expect("the demo runs");
    println!("{}", report.render());
    assert_eq!(report.instances.len(), 2);
    assert_eq!(report.rows.len(), 7);

    for row in &report.rows {
        assert_eq!(row.errors, 0, "{}: {:?}", row.label(), row.first_error);
        assert_eq!(
            row.busy,
            0,
            "{}: every variant waits for its lock",
            row.label()
        );
        if row.must_be_exact() {
            assert_eq!(row.oversold(), 0, "{} oversold", row.label());
            assert_eq!(row.sold, 20, "{} must sell exactly the stock", row.label());
            assert_eq!(row.stock_left, 0, "{}", row.label());
        }
    }

    let unlocked = report.row(Variant::Unlocked, false).expect("unlocked row");
    assert!(
        unlocked.oversold() > 0,
        "the unlocked variant must oversell"
    );

    let no_fence = report.row(Variant::LockedNoFence, true).expect("chaos row");
    assert!(
        no_fence.oversold() > 0,
        "a lock holder stalled past its lease must oversell without a fence"
    );
    let fenced = report.row(Variant::Fenced, true).expect("fenced chaos row");
    assert!(
        fenced.stale > 0,
        "the fencing token must reject stale writes"
    );
    assert_eq!(fenced.oversold(), 0);

    assert!(report.failures().is_empty());
}
