//! What a round's trace means, ready to draw: the purchases that reached the stock as bars,
//! the lock holds, the stored stock and orders over time, latencies and lock waits.
//!
//! Everything here is read from what the instances and the client recorded; nothing is
//! simulated. Times are nanoseconds since the round started.

use crate::demo::{Answer, Row};
use crate::recorder::{Attempt, Span};

/// One purchase attempt that got as far as the stock and either wrote it or was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bar {
    /// Index into [`RoundView::lanes`].
    pub(crate) lane: usize,
    /// The stock read.
    pub(crate) read: Span,
    /// A chaos stall before the write.
    pub(crate) stall: Option<Span>,
    /// The write, when it committed (a sale).
    pub(crate) write: Option<Span>,
    /// When the fencing token refused the claim or the write.
    pub(crate) stale_at: Option<u64>,
    pub(crate) stock_read: Option<i64>,
    pub(crate) stock_written: Option<i64>,
    /// Written after the attempt's fixed lease had run out: a write no lock protected.
    pub(crate) late: bool,
}

impl Bar {
    /// Where the bar ends: the write's commit, or the refusal.
    pub(crate) fn end(&self) -> u64 {
        self.write
            .map(|w| w.end)
            .or(self.stale_at)
            .unwrap_or(self.read.end)
    }

    /// Whether it is a sale (an order was stored).
    pub(crate) fn is_sale(&self) -> bool {
        self.write.is_some()
    }
}

/// The time an attempt knew it held the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hold {
    pub(crate) lane: usize,
    pub(crate) start: u64,
    /// The release, or the end of the fixed lease when that came first.
    pub(crate) end: u64,
    /// The fixed lease ran out before the code let go.
    pub(crate) expired: bool,
}

/// What one server-side answer was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sold,
    SoldOut,
    Busy,
    Stale,
    Other,
}

impl Kind {
    /// Every kind, in the order charts stack them.
    pub(crate) const ALL: [Self; 5] = [
        Self::Sold,
        Self::SoldOut,
        Self::Busy,
        Self::Stale,
        Self::Other,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Sold => "sold",
            Self::SoldOut => "sold out",
            Self::Busy => "busy (409, Retry-After)",
            Self::Stale => "stale write refused",
            Self::Other => "failed",
        }
    }

    fn of(attempt: &Attempt) -> Self {
        if attempt.order_id.is_some() {
            Self::Sold
        } else if attempt.stale_at.is_some() {
            Self::Stale
        } else if attempt.stock_read == Some(0) {
            Self::SoldOut
        } else if attempt.status == 409 && attempt.read.is_none() {
            // Refused by the layer before the handler ran.
            Self::Busy
        } else {
            Self::Other
        }
    }
}

/// A round, ready to draw.
#[derive(Debug, Clone)]
pub(crate) struct RoundView {
    /// The instances' names, one lane each.
    pub(crate) lanes: Vec<String>,
    pub(crate) bars: Vec<Bar>,
    pub(crate) holds: Vec<Hold>,
    /// Each server-side answer: when it left the instance, its lane, and what it was.
    pub(crate) answers: Vec<(u64, usize, Kind)>,
    /// The stored stock after each committed sale, in commit order: (time, stock, orders).
    pub(crate) stock: Vec<(u64, i64, i64)>,
    /// The stock at the start.
    pub(crate) stock_start: i64,
    /// Client latency of each purchase, sorted (ns).
    pub(crate) latency: Vec<u64>,
    /// Time each purchase spent waiting for the lock, sorted (ns): acquire waits in the
    /// instances, and the client's waits for `Retry-After`.
    pub(crate) lock_wait: Vec<u64>,
    /// Nanoseconds from the round's start to its last answer.
    pub(crate) duration: u64,
}

impl RoundView {
    /// Reads a round's trace.
    pub(crate) fn new(row: &Row) -> Self {
        let trace = &row.trace;
        let t0 = trace.started;
        let rel = |t: u64| t.saturating_sub(t0);
        let rel_span = |s: Span| Span {
            start: rel(s.start),
            end: rel(s.end),
        };

        let mut lanes: Vec<String> = trace.attempts.iter().map(|a| a.instance.clone()).collect();
        lanes.sort();
        lanes.dedup();
        let lane = |name: &str| lanes.iter().position(|l| l == name).unwrap_or(0);

        let mut bars = Vec::new();
        let mut holds = Vec::new();
        let mut answers = Vec::new();
        let mut commits = Vec::new();
        for attempt in &trace.attempts {
            let lane = lane(&attempt.instance);
            answers.push((rel(attempt.responded), lane, Kind::of(attempt)));
            if let Some(start) = attempt.acquired {
                let let_go = attempt.releasing.unwrap_or(attempt.responded);
                let end = attempt.lease_end.map_or(let_go, |lease| lease.min(let_go));
                holds.push(Hold {
                    lane,
                    start: rel(start),
                    end: rel(end.max(start)),
                    expired: attempt.lease_end.is_some_and(|lease| lease < let_go),
                });
            }
            let Some(read) = attempt.read else { continue };
            if attempt.write.is_none() && attempt.stale_at.is_none() {
                continue;
            }
            let late = match (attempt.write, attempt.lease_end) {
                (Some(write), Some(lease)) => write.end > lease,
                _ => false,
            };
            bars.push(Bar {
                lane,
                read: rel_span(read),
                stall: attempt.stall.map(rel_span),
                write: attempt.write.map(rel_span),
                stale_at: attempt.stale_at.map(rel),
                stock_read: attempt.stock_read,
                stock_written: attempt.stock_written,
                late,
            });
            if let (Some(order), Some(write), Some(stock)) =
                (attempt.order_id, attempt.write, attempt.stock_written)
            {
                commits.push((order, rel(write.end), stock));
            }
        }
        bars.sort_by_key(|b| (b.read.start, b.lane));
        holds.sort_by_key(|h| (h.start, h.lane));
        answers.sort_by_key(|a| a.0);

        // Order ids follow the commits; a commit's timestamp is taken just after it, so two
        // close commits can be stamped out of order by a few µs: keep the line monotonic.
        commits.sort_by_key(|c| c.0);
        let mut stock = Vec::with_capacity(commits.len());
        let mut last = 0;
        for (n, (_, t, s)) in commits.into_iter().enumerate() {
            last = last.max(t);
            stock.push((last, s, n as i64 + 1));
        }

        let mut latency: Vec<u64> = trace.purchases.iter().map(|p| p.latency()).collect();
        latency.sort_unstable();
        let mut lock_wait = lock_waits(row);
        lock_wait.sort_unstable();

        Self {
            lanes,
            bars,
            holds,
            answers,
            stock,
            stock_start: row.stock_start,
            latency,
            lock_wait,
            duration: rel(trace.ended),
        }
    }

    /// The share of the client's time spent waiting for the lock, 0 to 1.
    pub(crate) fn lock_wait_share(&self) -> f64 {
        let total: u64 = self.latency.iter().sum();
        let waiting: u64 = self.lock_wait.iter().sum();
        if total == 0 {
            0.0
        } else {
            waiting as f64 / total as f64
        }
    }

    /// The number of sales drawn.
    pub(crate) fn sales(&self) -> usize {
        self.bars.iter().filter(|b| b.is_sale()).count()
    }
}

/// Per purchase: its attempts' waits for the lock in the instances (until the acquire
/// returned, or until a busy answer), plus the client's waits for `Retry-After`.
fn lock_waits(row: &Row) -> Vec<u64> {
    let trace = &row.trace;
    let mut in_instances = vec![0u64; trace.purchases.len()];
    let index = |id: u64| trace.purchases.binary_search_by_key(&id, |p| p.id).ok();
    for attempt in &trace.attempts {
        let waited = match attempt.acquired {
            Some(acquired) => acquired.saturating_sub(attempt.received),
            None if Kind::of(attempt) == Kind::Busy => {
                attempt.responded.saturating_sub(attempt.received)
            }
            None => 0,
        };
        if let Some(i) = index(attempt.purchase) {
            in_instances[i] += waited;
        }
    }
    trace
        .purchases
        .iter()
        .zip(in_instances)
        .map(|(p, waited)| {
            if p.answer == Answer::Failed {
                0
            } else {
                (waited + p.retry_wait).min(p.latency())
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::demo::{ClientPurchase, RoundTrace};
    use crate::Variant;

    const MS: u64 = 1_000_000;

    /// An attempt of purchase `id` on `instance` that read at `read` ms (1 ms read), wrote
    /// 5 ms later (1 ms write), holding the lock from 1 ms before the read to just after.
    pub(crate) fn sale(id: u64, instance: &str, read: u64, stock: i64, order: i64) -> Attempt {
        let t = 1_000 * MS + read * MS;
        Attempt {
            purchase: id,
            instance: instance.to_owned(),
            received: t - 2 * MS,
            acquired: Some(t - MS),
            read: Some(Span {
                start: t,
                end: t + MS,
            }),
            stock_read: Some(stock),
            write: Some(Span {
                start: t + 6 * MS,
                end: t + 7 * MS,
            }),
            stock_written: Some(stock - 1),
            order_id: Some(order),
            releasing: Some(t + 7 * MS),
            responded: t + 8 * MS,
            status: 200,
            ..Attempt::default()
        }
    }

    pub(crate) fn row(variant: Variant, attempts: Vec<Attempt>) -> Row {
        let purchases = attempts
            .iter()
            .map(|a| ClientPurchase {
                id: a.purchase,
                sent: a.received - MS,
                answered: a.responded + MS,
                busy_answers: 0,
                retry_wait: 0,
                answer: Answer::Sold,
                error: None,
            })
            .collect();
        Row {
            variant,
            chaos: false,
            stock_start: 10,
            stock_left: 0,
            sold: attempts.len() as i64,
            sold_out: 0,
            busy: 0,
            stale: 0,
            errors: 0,
            first_error: None,
            p50: Duration::ZERO,
            p99: Duration::ZERO,
            elapsed: Duration::from_secs(1),
            purchases: attempts.len(),
            trace: RoundTrace {
                started: 1_000 * MS,
                ended: 1_100 * MS,
                purchases,
                attempts,
            },
        }
    }

    #[test]
    fn a_round_becomes_lanes_bars_holds_and_a_stock_line() {
        let mut stalled = sale(2, "i2", 10, 8, 3);
        stalled.lease_end = Some(stalled.acquired.expect("acquired") + 4 * MS);
        stalled.stall = Some(Span {
            start: 1_016 * MS,
            end: 1_016 * MS + 400,
        });
        let view = RoundView::new(&row(
            Variant::Fenced,
            vec![sale(0, "i2", 0, 10, 1), sale(1, "i1", 8, 9, 2), stalled],
        ));
        assert_eq!(view.lanes, ["i1", "i2"]);
        assert_eq!(view.bars.len(), 3);
        assert_eq!(view.sales(), 3);
        assert_eq!(view.bars[0].lane, 1);
        assert_eq!(view.bars[0].read.start, 0);
        assert!(view.bars[2].late, "written after its lease");
        assert!(view.holds[2].expired);
        assert_eq!(view.holds[2].end, 13 * MS, "cut at the lease's end");
        assert_eq!(
            view.stock.iter().map(|s| (s.1, s.2)).collect::<Vec<_>>(),
            [(9, 1), (8, 2), (7, 3)]
        );
        // Each waited 1 ms for its lock out of 12 ms.
        assert_eq!(view.lock_wait, [MS, MS, MS]);
        assert!((view.lock_wait_share() - 1.0 / 12.0).abs() < 1e-9);
    }
}
