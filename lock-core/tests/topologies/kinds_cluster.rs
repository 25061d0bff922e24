//! Semaphores and fair locks on a Redis Cluster, with keys on every shard.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::Locker;
use lock_testkit::RedisCluster;
use parking_lot::Mutex;

async fn cluster_locker(cluster: &RedisCluster) -> Locker {
    Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(Duration::from_millis(900))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_fair_locks_on_every_shard() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let a = cluster_locker(&cluster).await;
    let b = cluster_locker(&cluster).await;
    let names: Vec<String> = (0..9).map(|i| format!("tenant:{i}")).collect();

    // Semaphores of 2 permits on nine names, 12 tasks in two lockers: never more than 2
    // holders of one name (checked per name), and every permit comes back.
    let inside: Arc<HashMap<String, AtomicUsize>> = Arc::new(
        names
            .iter()
            .map(|n| (n.clone(), AtomicUsize::new(0)))
            .collect(),
    );
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..12 {
        let locker = if t % 2 == 0 { a.clone() } else { b.clone() };
        let (names, inside, most) = (names.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                let name = &names[(t * 5 + i) % names.len()];
                let permit = locker
                    .semaphore(name.as_str(), 2)
                    .acquire()
                    .wait(Duration::from_secs(20))
                    .await
                    .unwrap();
                let now = inside[name].fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(500)).await;
                inside[name].fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "more holders than permits"
    );

    // Held on every shard, renewed by the watchdog across several leases.
    let mut permits = Vec::new();
    for name in &names {
        permits.push(a.semaphore(name.as_str(), 2).acquire().await.unwrap());
    }
    let mut shards = HashSet::new();
    for set in cluster.keys("lock:*:semaphore:*").unwrap() {
        shards.insert(cluster.primary_for_key(&set).unwrap().port());
    }
    assert_eq!(shards.len(), 3, "semaphores on every primary");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(permits.iter().all(|p| p.is_held()));
    for p in permits {
        p.release().await.unwrap();
    }

    // Fair locks on the same names: exclusive per name and in arrival order per name.
    let order: Arc<Mutex<HashMap<String, Vec<usize>>>> = Arc::default();
    let mut firsts = Vec::new();
    for name in &names {
        firsts.push(a.fair_lock(name.as_str()).await.unwrap());
    }
    let mut waiters = Vec::new();
    for i in 0..4 {
        for name in &names {
            let locker = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (name, order) = (name.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let turn = locker
                    .fair_lock(name.as_str())
                    .wait(Duration::from_secs(20))
                    .await
                    .unwrap();
                order.lock().entry(name).or_default().push(i);
                turn.release().await.unwrap();
            }));
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    for first in firsts {
        first.release().await.unwrap();
    }
    for w in waiters {
        w.await.unwrap();
    }
    for (name, got) in order.lock().iter() {
        assert_eq!(got, &[0, 1, 2, 3], "order of {name}");
    }
    common::assert_cluster_clean(&cluster, &[&a, &b]).await;
}
