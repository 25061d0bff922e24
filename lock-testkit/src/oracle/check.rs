//! The offline checker: classifies a run's intervals and fenced writes into violations and
//! reported-but-explained events.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use super::record::{FencedWrite, Interval, Kind, Outcome, Release, Wipe};

/// The result of [`check`]. [`is_clean`](Self::is_clean) is the verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Intervals checked.
    pub cycles: u64,
    /// Enters counted by the referee (filled by [`Oracle::report`](super::Oracle::report);
    /// [`check`] sets `cycles`).
    pub enters: u64,
    /// Sections entered but never finished (filled by [`Oracle::report`](super::Oracle::report)).
    pub unfinished: u64,
    /// Intervals per outcome.
    pub completed: u64,
    /// See [`Outcome::Lost`].
    pub lost: u64,
    /// See [`Outcome::ReleaseFailed`].
    pub release_failed: u64,
    /// See [`Outcome::Killed`].
    pub killed: u64,
    /// Pairs of intervals of one key that overlap in time and exclude each other (at least one
    /// of them exclusive, or of different accesses).
    pub overlaps: u64,
    /// Pairs of intervals of one key that overlap in time and may (two shared sections, two
    /// permit sections): reported, not a violation; a read-write run whose readers never
    /// overlapped has 0.
    pub shared_overlaps: u64,
    /// The most intervals of one key inside at one time (from the log), of any access.
    pub max_inside: u64,
    /// Enters of a permit section while at least `n` other permit holders of the key were
    /// inside and not excused (signalled, late-signalled or killed, as for overlaps):
    /// violations of "at most `n` holders".
    pub over_limit: u64,
    /// Overlaps where the older holder had been told it lost the lock before the younger one
    /// entered.
    pub signalled_overlaps: u64,
    /// Overlaps where the older holder learned the loss later but never confirmed holding
    /// while the younger one held (it was paused): reported, not a violation.
    pub late_signalled_overlaps: u64,
    /// Overlaps whose older holder was SIGKILLed without having confirmed the lock after the
    /// younger one entered: reported, not a violation.
    pub killed_overlaps: u64,
    /// Overlaps whose older holder was inside when a [`Wipe`] took its lock and the younger
    /// entered after the wipe began, the older noticing the loss within the wipe's `notice`
    /// (and its release not answering `Ok`): reported, not a violation (nobody can know of a
    /// deletion before the next look at Redis).
    pub wiped_overlaps: u64,
    /// Longest time from a wipe's end to the older holder's notice, over the wiped overlaps.
    pub max_wipe_notice: Duration,
    /// Violations: overlaps the older holder was not told about in time.
    pub unsignalled_overlaps: u64,
    /// Of the unsignalled overlaps, those whose two holders both entered after a wipe of the
    /// key began, the first of them within the wipe's notice: a holder that got the lock after
    /// its key was gone (e.g. a local handoff of a deleted lock) entered beside another, and
    /// neither was told.
    pub untold_after_wipe: u64,
    /// Unsignalled overlaps per key.
    pub unsignalled_by_key: BTreeMap<String, u64>,
    /// Sections whose release answered `Ok` although the lock was not theirs to the end
    /// (violations): the older of two overlapping holders ordered by fencing tokens (the
    /// younger got the key while it was inside), or a section inside from before a [`Wipe`]
    /// of its key began until after it ended. Each section counts once.
    pub false_ok_releases: u64,
    /// False `Ok` releases per key.
    pub false_ok_by_key: BTreeMap<String, u64>,
    /// Longest overlap of any kind.
    pub max_overlap: Duration,
    /// Longest late-signalled overlap: from the younger holder's enter to the older one's
    /// loss signal.
    pub max_late_signal: Duration,
    /// Enters that found the occupancy counter above 0 (raw).
    pub occupancy_collisions: u64,
    /// Collisions not explained by the older holder having been marked lost (violations);
    /// for a permit section, when the holders inside not explained so were `n` or more.
    pub occupancy_violations: u64,
    /// Acquisitions whose fencing token was not above every token entered before it, by a
    /// holder that was never marked lost (violations).
    pub fence_regressions: u64,
    /// Holders that entered with a token below one entered before them and were marked lost:
    /// they acquired first but were paused before entering (reported, not a violation).
    pub late_claims: u64,
    /// Writes to the fenced resource.
    pub writes: u64,
    /// Writes accepted.
    pub writes_accepted: u64,
    /// Writes carrying a token below one a newer holder had already registered.
    pub stale_attempted: u64,
    /// Stale writes the resource rejected.
    pub stale_rejected: u64,
    /// Stale writes the resource accepted (violations).
    pub stale_accepted: u64,
    /// Writes of the newest holder that the resource rejected (only after a fence
    /// regression).
    pub fresh_rejected: u64,
    /// The first violations, described.
    pub violations: Vec<String>,
}

impl Report {
    /// No unsignalled overlap, no false `Ok` release, no permit enter over the limit, no
    /// unexplained occupancy collision, no fence regression, no stale write accepted.
    pub fn is_clean(&self) -> bool {
        self.unsignalled_overlaps == 0
            && self.false_ok_releases == 0
            && self.over_limit == 0
            && self.occupancy_violations == 0
            && self.fence_regressions == 0
            && self.stale_accepted == 0
    }

    fn violation(&mut self, what: String) {
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cycles={} completed={} lost={} release_failed={} killed={} overlaps={} \
             signalled={} late_signalled={} killed_overlaps={} wiped_overlaps={} \
             max_wipe_notice={:?} unsignalled={} untold_after_wipe={} false_ok_releases={} \
             shared_overlaps={} max_inside={} over_limit={} max_overlap={:?} \
             max_late_signal={:?} occupancy_collisions={} occupancy_violations={} \
             fence_regressions={} late_claims={} writes={} accepted={} stale_attempted={} stale_rejected={} \
             stale_accepted={}",
            self.cycles,
            self.completed,
            self.lost,
            self.release_failed,
            self.killed,
            self.overlaps,
            self.signalled_overlaps,
            self.late_signalled_overlaps,
            self.killed_overlaps,
            self.wiped_overlaps,
            self.max_wipe_notice,
            self.unsignalled_overlaps,
            self.untold_after_wipe,
            self.false_ok_releases,
            self.shared_overlaps,
            self.max_inside,
            self.over_limit,
            self.max_overlap,
            self.max_late_signal,
            self.occupancy_collisions,
            self.occupancy_violations,
            self.fence_regressions,
            self.late_claims,
            self.writes,
            self.writes_accepted,
            self.stale_attempted,
            self.stale_rejected,
            self.stale_accepted,
        )
    }
}

/// Whether two holders of one key are ordered by their fencing tokens: both exclusive, both
/// with a token.
fn by_fence(a: &Interval, b: &Interval) -> bool {
    a.access == Kind::Exclusive && b.access == Kind::Exclusive && a.fence > 0 && b.fence > 0
}

/// The older (earlier acquired) of two holders of one key: of two exclusive holders with
/// tokens the lower token, on a tie (itself a regression) the earlier enter; when either has
/// no token (shared, permit, or an exclusive holder that did not ask) the earlier grant
/// ([`Interval::granted_at`]: a holder may be slow to enter a lock it got first).
fn older_younger<'a>(a: &'a Interval, b: &'a Interval) -> (&'a Interval, &'a Interval) {
    let older_first = if by_fence(a, b) {
        (a.fence, a.t_enter) <= (b.fence, b.t_enter)
    } else {
        (a.granted_at(), a.enter_seq) <= (b.granted_at(), b.enter_seq)
    };
    if older_first {
        (a, b)
    } else {
        (b, a)
    }
}

/// Whether the older of two holders inside together is excused for the younger one's enter:
/// it had been marked lost, or it was SIGKILLed and either dead already or not confirmed
/// holding since (the occupancy rule of the [module docs](super)).
/// When the order comes from enter times alone (a side without a token), also when the later
/// one entered knowing its lock was lost: it may be the one that acquired first and was paused
/// before it entered.
fn excused_on_referee(older: &Interval, younger: &Interval) -> bool {
    older.lost_at.is_some()
        || (older.outcome == Outcome::Killed
            && (older.t_exit <= younger.t_enter
                || older.last_held.is_none_or(|h| h < younger.t_enter)))
        || (!by_fence(older, younger) && entered_told(younger))
}

/// Whether a holder knew when it entered that its lock was lost: its enter check said so, and
/// it never confirmed holding.
fn entered_told(iv: &Interval) -> bool {
    iv.last_held.is_none() && iv.lost_at.is_some()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Signalled,
    Late,
    Killed,
    /// Excused by a wipe; the time from its end to the older holder's notice.
    Wiped(Duration),
    Unsignalled,
}

fn verdict(older: &Interval, younger: &Interval, wipes: &[Wipe]) -> Verdict {
    let confirmed_after = older.last_held.is_some_and(|h| h >= younger.t_enter);
    let verdict = match older.lost_at {
        Some(lost) if lost <= younger.t_enter => Verdict::Signalled,
        Some(_) if !confirmed_after => Verdict::Late,
        None if older.outcome == Outcome::Killed && !confirmed_after => Verdict::Killed,
        _ => Verdict::Unsignalled,
    };
    if verdict != Verdict::Unsignalled {
        return verdict;
    }
    // Ordered by enter times only, the later one may have acquired first (see
    // `excused_on_referee`); it entered knowing, so it did not hold beside the other.
    if !by_fence(older, younger) && entered_told(younger) {
        return Verdict::Signalled;
    }
    wiped(older, younger, wipes).map_or(Verdict::Unsignalled, Verdict::Wiped)
}

/// Whether an overlap comes from a wipe that took the older holder's lock, the older having
/// got it before the wipe ended and the younger after it began (by their grant stamps,
/// [`Interval::granted_at`]: upper bounds of when Redis granted, so a holder whose lock was
/// granted after the wipe is never excused by it): excused if the older noticed (or died)
/// within the wipe's notice and its release did not say `Ok`. Returns the time from the
/// wipe's end to the notice.
fn wiped(older: &Interval, younger: &Interval, wipes: &[Wipe]) -> Option<Duration> {
    if older.release == Some(Release::Ok) {
        return None;
    }
    let noticed = older
        .lost_at
        .or((older.outcome == Outcome::Killed).then_some(older.t_exit))?;
    wipes
        .iter()
        .filter(|w| {
            w.covers(&older.key) && older.granted_at() < w.end && younger.granted_at() > w.begin
        })
        .filter(|w| noticed <= w.end.saturating_add(w.notice))
        .map(|w| ns(noticed.saturating_sub(w.end)))
        .min()
}

/// Whether two holders both got their lock after a wipe of their key began, the first of
/// them within its notice: neither had the lock from before it.
fn both_after_wipe(a: &Interval, b: &Interval, wipes: &[Wipe]) -> bool {
    let first = a.granted_at().min(b.granted_at());
    wipes
        .iter()
        .any(|w| w.covers(&a.key) && first > w.begin && first <= w.end.saturating_add(w.notice))
}

fn ns(d: u64) -> Duration {
    Duration::from_nanos(d)
}

/// Checks a run offline: interval overlaps, false `Ok` releases, occupancy collisions, fence
/// monotonicity and stale writes (see the [module docs](super) for the verdicts); a run
/// without wipes ([`check_with_wipes`]).
pub fn check(intervals: &[Interval], writes: &[FencedWrite]) -> Report {
    check_with_wipes(intervals, writes, &[])
}

/// [`check`], knowing which lock keys were taken from their holders when ([`Wipe`]): an
/// overlap a wipe caused is excused if the holder it caught inside noticed in time, and no
/// section inside across a wipe of its key may release with `Ok`.
pub fn check_with_wipes(intervals: &[Interval], writes: &[FencedWrite], wipes: &[Wipe]) -> Report {
    let mut false_ok: HashSet<&str> = HashSet::new();
    let mut report = Report {
        cycles: intervals.len() as u64,
        enters: intervals.len() as u64,
        ..Report::default()
    };
    let mut by_key: HashMap<&str, Vec<&Interval>> = HashMap::new();
    let mut by_id: HashMap<&str, &Interval> = HashMap::new();
    for iv in intervals {
        match iv.outcome {
            Outcome::Completed => report.completed += 1,
            Outcome::Lost => report.lost += 1,
            Outcome::ReleaseFailed => report.release_failed += 1,
            Outcome::Killed => report.killed += 1,
        }
        by_key.entry(&iv.key).or_default().push(iv);
        by_id.insert(&iv.id, iv);
    }

    // 1. Overlaps, per key, by a sweep over the enter times. Sections that may be inside
    //    together (readers, permits) are counted, not judged, except that a permit enter
    //    finding `n` permit holders inside that were not excused is one too many.
    for list in by_key.values_mut() {
        list.sort_by_key(|iv| (iv.t_enter, iv.enter_seq));
        let mut active: Vec<&Interval> = Vec::new();
        for &cur in list.iter() {
            active.retain(|a| a.t_exit.max(a.t_enter) > cur.t_enter);
            report.max_inside = report.max_inside.max(active.len() as u64 + 1);
            let mut live_permits = 0u64;
            for &a in &active {
                let overlap = a.t_exit.min(cur.t_exit).saturating_sub(cur.t_enter);
                let (older, younger) = older_younger(a, cur);
                let verdict = verdict(older, younger, wipes);
                if a.access.compatible(cur.access) {
                    report.shared_overlaps += 1;
                    if matches!(cur.access, Kind::Permits(_)) && verdict == Verdict::Unsignalled {
                        live_permits += 1;
                    }
                    continue;
                }
                report.overlaps += 1;
                report.max_overlap = report.max_overlap.max(ns(overlap));
                // The younger got the key (its token was issued) while the older was inside:
                // the older's key was gone by then, so its release cannot have deleted it.
                if by_fence(older, younger)
                    && older.release == Some(Release::Ok)
                    && false_ok.insert(&older.id)
                {
                    *report.false_ok_by_key.entry(older.key.clone()).or_default() += 1;
                    report.violation(format!(
                        "release said Ok on {:?}: {} (fence {}, exit {}) overlapped {} (fence {}, entered {}), which got the key meanwhile",
                        older.key, older.id, older.fence, older.t_exit, younger.id, younger.fence, younger.t_enter
                    ));
                }
                match verdict {
                    Verdict::Signalled => report.signalled_overlaps += 1,
                    Verdict::Late => {
                        report.late_signalled_overlaps += 1;
                        let late = older.lost_at.unwrap_or(0).saturating_sub(younger.t_enter);
                        report.max_late_signal = report.max_late_signal.max(ns(late));
                    }
                    Verdict::Killed => report.killed_overlaps += 1,
                    Verdict::Wiped(notice) => {
                        report.wiped_overlaps += 1;
                        report.max_wipe_notice = report.max_wipe_notice.max(notice);
                    }
                    Verdict::Unsignalled => {
                        report.unsignalled_overlaps += 1;
                        *report
                            .unsignalled_by_key
                            .entry(older.key.clone())
                            .or_default() += 1;
                        if both_after_wipe(older, younger, wipes) {
                            report.untold_after_wipe += 1;
                        }
                        report.violation(format!(
                            "unsignalled overlap on {:?}: {} ({:?}, fence {}, lost_at {:?}, last_held {:?}, {:?}) still held when {} ({:?}, fence {}) entered at {}; overlap {:?}",
                            older.key, older.id, older.access, older.fence, older.lost_at, older.last_held,
                            older.outcome, younger.id, younger.access, younger.fence, younger.t_enter, ns(overlap)
                        ));
                    }
                }
            }
            if live_permits > cur.access.others_allowed() {
                report.over_limit += 1;
                report.violation(format!(
                    "over the limit on {:?}: {} entered as {:?} with {} other permit holders inside",
                    cur.key, cur.id, cur.access, live_permits
                ));
            }
            active.push(cur);
        }
    }

    // 1b. A wipe took the key while the section held it (its lock was granted before the
    //     wipe was sent, and it left after the wipe was answered): the release, sent after
    //     that, found the key gone, and cannot have answered Ok.
    for iv in intervals {
        if iv.release != Some(Release::Ok) {
            continue;
        }
        let Some(w) = wipes
            .iter()
            .find(|w| w.covers(&iv.key) && iv.granted_at() < w.begin && iv.t_exit > w.end)
        else {
            continue;
        };
        if false_ok.insert(&iv.id) {
            *report.false_ok_by_key.entry(iv.key.clone()).or_default() += 1;
            report.violation(format!(
                "release said Ok on {:?}: {} (granted {}, exit {}) held the lock when a {} took the key ({}..{})",
                iv.key, iv.id, iv.granted_at(), iv.t_exit, w.kind, w.begin, w.end
            ));
        }
    }
    report.false_ok_releases = false_ok.len() as u64;

    // 2. Occupancy collisions, attributed to the older holder of each colliding pair. An
    //    exclusive enter that counted others inside but named none is unexplained.
    for iv in intervals {
        let unnamed = iv.access == Kind::Exclusive && iv.occupancy > 1;
        if iv.collided_with.is_empty() && !unnamed {
            continue;
        }
        report.occupancy_collisions += 1;
        // Holders inside that were not excused: those the rules exclude (or unknown ones),
        // and those of the same kind that only a permit's number limits.
        let (mut excluded, mut counted) = (u64::from(iv.collided_with.is_empty()), 0u64);
        for other in &iv.collided_with {
            let Some(other) = by_id.get(other.as_str()) else {
                excluded += 1;
                continue;
            };
            let (older, younger) = older_younger(iv, other);
            if excused_on_referee(older, younger) {
                continue;
            }
            if other.access.compatible(iv.access) {
                counted += 1;
            } else {
                excluded += 1;
            }
        }
        if excluded > 0 || counted > iv.access.others_allowed() {
            report.occupancy_violations += 1;
            report.violation(format!(
                "occupancy {} when {} ({:?}, fence {}) entered {:?}; inside: {:?}",
                iv.occupancy, iv.id, iv.access, iv.fence, iv.key, iv.collided_with
            ));
        }
    }

    // 3. Fencing tokens strictly increase in acquisition order, per key. The referee sees the
    //    enters, not the acquisitions: a token at or below an earlier-entered one is a
    //    regression unless its holder was marked lost (it acquired first, was paused before
    //    it entered, and its lock passed on meanwhile: a late claim). Only exclusive holders
    //    have tokens (and not all of them ask for one).
    let mut enters_by_key: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for (key, list) in &by_key {
        let mut enters: Vec<&Interval> = list
            .iter()
            .copied()
            .filter(|iv| iv.access == Kind::Exclusive && iv.fence > 0)
            .collect();
        enters.sort_unstable_by_key(|iv| iv.enter_seq);
        let mut max: Option<&Interval> = None;
        let mut running = Vec::with_capacity(enters.len());
        for iv in enters {
            match max {
                Some(m) if iv.fence <= m.fence => {
                    if iv.lost_at.is_some() {
                        report.late_claims += 1;
                    } else {
                        report.fence_regressions += 1;
                        report.violation(format!(
                            "fence regression on {key:?}: {} entered with token {} after {} had entered with token {}",
                            iv.id, iv.fence, m.id, m.fence
                        ));
                    }
                }
                _ => max = Some(iv),
            }
            running.push((iv.enter_seq, max.map_or(0, |m| m.fence)));
        }
        enters_by_key.insert(key, running);
    }

    // 4. Stale writes: a token below the highest registered before the write, recounted from
    //    the log (independently of the script's decision).
    for w in writes {
        report.writes += 1;
        if w.accepted {
            report.writes_accepted += 1;
        }
        let newest = enters_by_key
            .get(w.key.as_str())
            .map(|enters| {
                let i = enters.partition_point(|(seq, _)| *seq < w.seq);
                if i == 0 {
                    0
                } else {
                    enters[i - 1].1
                }
            })
            .unwrap_or(0);
        if w.fence < newest {
            report.stale_attempted += 1;
            if w.accepted {
                report.stale_accepted += 1;
                report.violation(format!(
                    "stale write accepted on {:?}: token {} by {} after token {} had entered",
                    w.key, w.fence, w.id, newest
                ));
            } else {
                report.stale_rejected += 1;
            }
        } else if !w.accepted {
            report.fresh_rejected += 1;
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn iv(id: &str, fence: u64, seq: u64, enter_ms: u64, exit_ms: u64) -> Interval {
        Interval {
            id: id.to_owned(),
            key: "k".to_owned(),
            access: Kind::Exclusive,
            fence,
            enter_seq: seq,
            t_enter: enter_ms * MS,
            t_granted: None,
            t_exit: exit_ms * MS,
            last_held: Some(enter_ms * MS),
            lost_at: None,
            occupancy: 1,
            collided_with: Vec::new(),
            outcome: Outcome::Completed,
            release: None,
        }
    }

    fn write(seq: u64, fence: u64, accepted: bool) -> FencedWrite {
        FencedWrite {
            seq,
            key: "k".to_owned(),
            fence,
            accepted,
            id: format!("w{seq}"),
        }
    }

    #[test]
    fn disjoint_intervals_are_clean() {
        let log = [
            iv("a", 10, 1, 0, 5),
            iv("b", 11, 2, 5, 9),
            iv("c", 12, 3, 10, 12),
        ];
        let r = check(&log, &[]);
        assert!(r.is_clean(), "{r:?}");
        assert_eq!((r.cycles, r.completed, r.overlaps), (3, 3, 0));
    }

    #[test]
    fn an_unsignalled_overlap_is_a_violation() {
        // b entered at 5 while a, never told it lost the lock, was inside until 8.
        let log = [iv("a", 10, 1, 0, 8), iv("b", 11, 2, 5, 9)];
        let r = check(&log, &[]);
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.unsignalled_overlaps, 1);
        assert_eq!(r.max_overlap, Duration::from_millis(3));
        assert!(!r.is_clean());
        assert!(r.violations[0].contains("unsignalled overlap"), "{r:?}");
    }

    #[test]
    fn an_overlap_after_the_loss_signal_is_not_a_violation() {
        // a was told at 4 that its lock was lost, then took until 8 to leave; b entered at 5.
        let mut a = iv("a", 10, 1, 0, 8);
        a.lost_at = Some(4 * MS);
        a.outcome = Outcome::Lost;
        let log = [a, iv("b", 11, 2, 5, 9)];
        let r = check(&log, &[]);
        assert_eq!(
            (r.overlaps, r.signalled_overlaps, r.unsignalled_overlaps),
            (1, 1, 0)
        );
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.lost, 1);
    }

    #[test]
    fn a_late_signal_counts_only_if_the_holder_never_confirmed_after_the_takeover() {
        // a was paused from 1 to 7: b entered at 5, a learned the loss at 7.
        let mut a = iv("a", 10, 1, 0, 8);
        a.last_held = Some(MS);
        a.lost_at = Some(7 * MS);
        a.outcome = Outcome::Lost;
        let b = iv("b", 11, 2, 5, 9);
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.late_signalled_overlaps, r.unsignalled_overlaps), (1, 0));
        assert_eq!(r.max_late_signal, Duration::from_millis(2));
        assert!(r.is_clean());
        // The same, but a confirmed holding the lock at 6, after b entered: a violation.
        a.last_held = Some(6 * MS);
        let r = check(&[a, b], &[]);
        assert_eq!(r.unsignalled_overlaps, 1);
        assert!(!r.is_clean());
    }

    #[test]
    fn the_older_holder_is_the_lower_fence_even_if_it_stamped_its_enter_later() {
        // a acquired first (fence 10) but was paused before stamping its enter (at 6); b
        // acquired after a's lease ran out and entered at 5. a never confirmed holding.
        let mut a = iv("a", 10, 2, 6, 8);
        a.last_held = None;
        a.lost_at = Some(7 * MS);
        a.outcome = Outcome::Lost;
        let b = iv("b", 11, 1, 5, 9);
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.overlaps, r.late_signalled_overlaps), (1, 1));
        // Its enter came after b's with a lower token: a late claim, as it was marked lost.
        assert_eq!((r.late_claims, r.fence_regressions), (1, 0));
        assert!(r.is_clean(), "{r:?}");
        // Not marked lost, it would be a fence regression (and an unsignalled overlap).
        a.lost_at = None;
        a.outcome = Outcome::Completed;
        let r = check(&[a, b], &[]);
        assert_eq!((r.late_claims, r.fence_regressions), (0, 1));
    }

    #[test]
    fn occupancy_collisions_are_attributed_to_the_older_holder() {
        let mut a = iv("a", 10, 1, 0, 8);
        let mut b = iv("b", 11, 2, 5, 9);
        b.occupancy = 2;
        b.collided_with = vec!["a".to_owned()];
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 1));
        // Later marked lost: a raw collision, not a violation.
        a.lost_at = Some(8 * MS);
        a.outcome = Outcome::Lost;
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 0));
        // A killed holder whose clean-up was late (b entered after a's death): not a violation.
        a.lost_at = None;
        a.outcome = Outcome::Killed;
        a.t_exit = 4 * MS;
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!(r.occupancy_violations, 0);
        // An unknown co-occupant is a violation.
        b.collided_with = vec!["ghost".to_owned()];
        let r = check(&[a, b], &[]);
        assert_eq!(r.occupancy_violations, 1);
    }

    #[test]
    fn a_killed_holder_is_excused_only_without_a_confirmation_after_the_takeover() {
        // a was stalled from 1 (its last check) and SIGKILLed at 8; b entered at 5.
        let mut a = iv("a", 10, 1, 0, 8);
        a.last_held = Some(MS);
        a.outcome = Outcome::Killed;
        let mut b = iv("b", 11, 2, 5, 9);
        b.occupancy = 2;
        b.collided_with = vec!["a".to_owned()];
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.killed_overlaps, r.unsignalled_overlaps), (1, 0));
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 0));
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.killed, 1);
        // a confirmed holding at 6, after b entered, and was killed later: a violation.
        a.last_held = Some(6 * MS);
        let r = check(&[a, b], &[]);
        assert_eq!((r.killed_overlaps, r.unsignalled_overlaps), (0, 1));
        assert_eq!(r.occupancy_violations, 1);
    }

    #[test]
    fn stale_writes_are_recounted_from_the_log() {
        let log = [iv("a", 10, 1, 0, 4), iv("b", 11, 3, 5, 9)];
        let writes = [
            write(2, 10, true),  // a, before b entered: fresh
            write(4, 11, true),  // b: fresh
            write(5, 10, false), // a again, after b entered: stale, rejected
        ];
        let r = check(&log, &writes);
        assert_eq!((r.writes, r.writes_accepted), (3, 2));
        assert_eq!(
            (r.stale_attempted, r.stale_rejected, r.stale_accepted),
            (1, 1, 0)
        );
        assert!(r.is_clean());
        let writes = [write(5, 10, true)];
        let r = check(&log, &writes);
        assert_eq!(r.stale_accepted, 1);
        assert!(!r.is_clean());
    }

    #[test]
    fn fence_regressions_are_found_in_acquisition_order() {
        let log = [iv("a", 10, 1, 0, 4), iv("b", 9, 2, 5, 9)];
        let r = check(&log, &[]);
        assert_eq!(r.fence_regressions, 1);
        assert!(!r.is_clean());
    }

    fn reader(id: &str, seq: u64, enter_ms: u64, exit_ms: u64) -> Interval {
        Interval {
            access: Kind::Shared,
            ..iv(id, 0, seq, enter_ms, exit_ms)
        }
    }

    fn permit(id: &str, n: u32, seq: u64, enter_ms: u64, exit_ms: u64) -> Interval {
        Interval {
            access: Kind::Permits(n),
            ..iv(id, 0, seq, enter_ms, exit_ms)
        }
    }

    #[test]
    fn readers_overlapping_each_other_are_counted_not_judged() {
        let mut b = reader("b", 2, 1, 6);
        b.occupancy = 2;
        let log = [
            reader("a", 1, 0, 5),
            b,
            reader("c", 3, 2, 7),
            iv("w", 10, 4, 8, 9),
        ];
        let r = check(&log, &[]);
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.overlaps, r.shared_overlaps, r.max_inside), (0, 3, 3));
        // Readers have no token: theirs (0) is no regression of the writer's, nor the other way.
        assert_eq!((r.fence_regressions, r.occupancy_collisions), (0, 0));
    }

    #[test]
    fn a_reader_inside_with_a_writer_is_a_violation_whoever_entered_first() {
        // The writer was inside from 0 to 8 when a reader entered at 5...
        let r = check(&[iv("w", 10, 1, 0, 8), reader("r", 2, 5, 9)], &[]);
        assert_eq!((r.overlaps, r.unsignalled_overlaps), (1, 1), "{r}");
        assert!(!r.is_clean());
        assert!(r.violations[0].contains("unsignalled overlap"), "{r:?}");
        // ... or a reader was inside from 0 to 8 when the writer entered at 5 (the reader,
        // without a token, is the older one because it entered first).
        let r = check(&[reader("r", 1, 0, 8), iv("w", 10, 2, 5, 9)], &[]);
        assert_eq!(r.unsignalled_overlaps, 1, "{r}");
        assert!(r.violations[0].contains("r (Shared"), "{r:?}");
        // The writer had been told at 4 that its lock was lost: signalled, clean. Had the
        // older holder been chosen by token, the reader (token 0) would have been blamed.
        let mut w = iv("w", 10, 1, 0, 8);
        w.lost_at = Some(4 * MS);
        w.outcome = Outcome::Lost;
        let r = check(&[w, reader("r", 2, 5, 9)], &[]);
        assert_eq!(
            (r.signalled_overlaps, r.unsignalled_overlaps),
            (1, 0),
            "{r}"
        );
        assert!(r.is_clean());
    }

    #[test]
    fn a_reader_colliding_with_a_writer_on_the_referee_is_a_violation() {
        let w = iv("w", 10, 1, 0, 4);
        let mut r = reader("r", 2, 5, 9);
        r.occupancy = 2;
        r.collided_with = vec!["w".to_owned()];
        let c = check(&[w.clone(), r.clone()], &[]);
        assert_eq!(
            (c.occupancy_collisions, c.occupancy_violations),
            (1, 1),
            "{c}"
        );
        assert!(!c.is_clean());
        // Inside with another reader only (occupancy 2, nobody named): no collision at all.
        let mut alone = reader("r2", 3, 5, 9);
        alone.occupancy = 2;
        let c = check(&[reader("r", 2, 5, 9), alone], &[]);
        assert_eq!(c.occupancy_collisions, 0, "{c}");
        // A writer marked lost is an explained collision.
        let mut lost = w;
        lost.lost_at = Some(3 * MS);
        lost.outcome = Outcome::Lost;
        let c = check(&[lost, r], &[]);
        assert_eq!(
            (c.occupancy_collisions, c.occupancy_violations),
            (1, 0),
            "{c}"
        );
    }

    #[test]
    fn more_permit_holders_than_permits_is_a_violation() {
        // Two permits: a and b together are fine, c entering at 3 while both are inside is not.
        let two = [permit("a", 2, 1, 0, 8), permit("b", 2, 2, 1, 8)];
        let r = check(&two, &[]);
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.shared_overlaps, r.max_inside, r.over_limit), (1, 2, 0));
        let mut three = two.to_vec();
        three.push(permit("c", 2, 3, 3, 9));
        let r = check(&three, &[]);
        assert_eq!((r.over_limit, r.max_inside), (1, 3), "{r}");
        assert!(!r.is_clean());
        assert!(r.violations[0].contains("over the limit"), "{r:?}");
        // a had been told it lost its permit before c entered: c had a free permit.
        three[0].lost_at = Some(2 * MS);
        three[0].outcome = Outcome::Lost;
        let r = check(&three, &[]);
        assert_eq!(r.over_limit, 0, "{r}");
        assert!(r.is_clean());
        // A permit holder inside with an exclusive holder is an ordinary unsignalled overlap.
        let r = check(&[permit("a", 5, 1, 0, 8), iv("x", 3, 2, 1, 9)], &[]);
        assert_eq!((r.unsignalled_overlaps, r.over_limit), (1, 0), "{r}");
    }

    #[test]
    fn a_permit_enter_counted_over_the_limit_on_the_referee_is_a_violation() {
        let (a, b) = (permit("a", 2, 1, 0, 8), permit("b", 2, 2, 1, 8));
        let mut c = permit("c", 2, 3, 3, 9);
        c.occupancy = 3;
        c.collided_with = vec!["a".to_owned(), "b".to_owned()];
        let r = check(&[a.clone(), b.clone(), c.clone()], &[]);
        assert_eq!(
            (r.occupancy_collisions, r.occupancy_violations),
            (1, 1),
            "{r}"
        );
        // One of the two inside was marked lost: within the limit.
        let mut lost = a;
        lost.lost_at = Some(2 * MS);
        lost.outcome = Outcome::Lost;
        let r = check(&[lost, b, c], &[]);
        assert_eq!(
            (r.occupancy_collisions, r.occupancy_violations),
            (1, 0),
            "{r}"
        );
    }

    #[test]
    fn each_kind_of_violation_alone_fails_the_check() {
        let mut ghost = iv("b", 11, 2, 5, 9);
        ghost.occupancy = 2;
        ghost.collided_with = vec!["ghost".to_owned()];
        let mut shared_ghost = reader("r", 2, 5, 9);
        shared_ghost.occupancy = 2;
        shared_ghost.collided_with = vec!["w".to_owned()];
        let cases = [
            // Two holders inside at once, the referee's counter having missed it.
            (
                vec![iv("a", 10, 1, 0, 8), iv("b", 11, 2, 5, 9)],
                vec![],
                [1, 0, 0, 0, 0],
            ),
            // A collision on the counter with a section that is not in the log.
            (vec![iv("a", 10, 1, 0, 4), ghost], vec![], [0, 1, 0, 0, 0]),
            // A token that went backwards.
            (
                vec![iv("a", 10, 1, 0, 4), iv("b", 9, 2, 5, 9)],
                vec![],
                [0, 0, 1, 0, 0],
            ),
            // A write with a's token accepted after b had entered.
            (
                vec![iv("a", 10, 1, 0, 4), iv("b", 11, 2, 5, 9)],
                vec![write(3, 10, true)],
                [0, 0, 0, 1, 0],
            ),
            // A reader inside while a writer was, the referee's counter having missed it.
            (
                vec![iv("w", 10, 1, 0, 8), reader("r", 2, 5, 9)],
                vec![],
                [1, 0, 0, 0, 0],
            ),
            // A reader that the referee saw enter while a writer was inside.
            (
                vec![iv("w", 10, 1, 0, 4), shared_ghost],
                vec![],
                [0, 1, 0, 0, 0],
            ),
            // A third holder of two permits, the referee's counter having missed it.
            (
                vec![
                    permit("a", 2, 1, 0, 8),
                    permit("b", 2, 2, 1, 8),
                    permit("c", 2, 3, 3, 9),
                ],
                vec![],
                [0, 0, 0, 0, 1],
            ),
        ];
        for (log, writes, expected) in cases {
            let r = check(&log, &writes);
            let found = [
                r.unsignalled_overlaps,
                r.occupancy_violations,
                r.fence_regressions,
                r.stale_accepted,
                r.over_limit,
            ];
            assert_eq!(found, expected, "{r}");
            assert!(!r.is_clean());
            assert_eq!(r.violations.len(), 1, "{r:?}");
        }
    }

    fn wipe(kind: &str, key: Option<&str>, begin_ms: u64, end_ms: u64, notice_ms: u64) -> Wipe {
        Wipe {
            key: key.map(str::to_owned),
            kind: kind.to_owned(),
            begin: begin_ms * MS,
            end: end_ms * MS,
            notice: notice_ms * MS,
        }
    }

    fn released(mut iv: Interval, answer: Release) -> Interval {
        iv.release = Some(answer);
        if answer == Release::Lost && iv.lost_at.is_none() {
            iv.lost_at = Some(iv.t_exit);
            iv.outcome = Outcome::Lost;
        }
        iv
    }

    #[test]
    fn an_ok_release_of_the_older_of_two_overlapping_holders_is_false() {
        // b got the key (token 11) at 5 while a (token 10) was inside until 8, having been
        // told at 4: a signalled overlap, but a's release then said Ok.
        let mut a = iv("a", 10, 1, 0, 8);
        a.lost_at = Some(4 * MS);
        let b = released(iv("b", 11, 2, 5, 9), Release::Ok);
        let r = check(&[released(a.clone(), Release::Ok), b.clone()], &[]);
        assert_eq!((r.signalled_overlaps, r.false_ok_releases), (1, 1), "{r}");
        assert_eq!(r.false_ok_by_key.get("k"), Some(&1));
        assert!(!r.is_clean());
        assert!(r.violations[0].contains("release said Ok"), "{r:?}");
        // a's release said Lost: clean; b's Ok is its own lock's.
        let r = check(&[released(a.clone(), Release::Lost), b.clone()], &[]);
        assert_eq!(r.false_ok_releases, 0, "{r}");
        assert!(r.is_clean(), "{r}");
        // Ordered by enter times (b entered without a token), a's Ok is not judged: which of
        // the two acquired first is not known.
        let mut untokened = b;
        untokened.fence = 0;
        let r = check(&[released(a, Release::Ok), untokened], &[]);
        assert_eq!(r.false_ok_releases, 0, "{r}");
    }

    #[test]
    fn an_ok_release_of_a_section_inside_across_a_wipe_is_false() {
        // a was inside from 0 to 8 when its key was deleted (3 to 4): nobody else entered,
        // but its release (after 8) cannot have found its key.
        let a = released(iv("a", 10, 1, 0, 8), Release::Ok);
        let del = wipe("del", Some("k"), 3, 4, 400);
        let r = check_with_wipes(std::slice::from_ref(&a), &[], std::slice::from_ref(&del));
        assert_eq!(r.false_ok_releases, 1, "{r}");
        assert!(!r.is_clean());
        assert!(r.violations[0].contains("del took the key"), "{r:?}");
        // A FLUSHALL (every key) counts too; the same section unjudged without wipes.
        let flush = wipe("flushall", None, 3, 4, 400);
        assert_eq!(
            check_with_wipes(std::slice::from_ref(&a), &[], &[flush]).false_ok_releases,
            1
        );
        assert!(check(std::slice::from_ref(&a), &[]).is_clean());
        // Not across it: entered after the wipe began, or left before it was answered; a
        // wipe of another key; a release that said Lost.
        for (section, w) in [
            (released(iv("a", 10, 1, 3, 8), Release::Ok), del.clone()),
            (released(iv("a", 10, 1, 0, 4), Release::Ok), del.clone()),
            (a.clone(), wipe("del", Some("other"), 3, 4, 400)),
            (released(iv("a", 10, 1, 0, 8), Release::Lost), del.clone()),
        ] {
            let r = check_with_wipes(&[section], &[], &[w]);
            assert!(r.is_clean(), "{r}");
        }
    }

    #[test]
    fn a_holder_caught_by_a_wipe_is_excused_only_if_it_noticed_in_time() {
        // a (token 10) was inside from 0 to 50 when its key was force-unlocked (10 to 11); b
        // got it (token 11) and entered at 12. a learned it at its next renewal, at 25 (within
        // the 20 ms notice), and its release said Lost.
        let force = wipe("force-unlock", Some("k"), 10, 11, 20);
        let mut a = iv("a", 10, 1, 0, 50);
        a.last_held = Some(20 * MS); // confirmed after b entered: it could not know yet
        a.lost_at = Some(25 * MS);
        let b = released(iv("b", 11, 2, 12, 30), Release::Ok);
        let r = check_with_wipes(
            &[released(a.clone(), Release::Lost), b.clone()],
            &[],
            std::slice::from_ref(&force),
        );
        assert_eq!((r.overlaps, r.wiped_overlaps), (1, 1), "{r}");
        assert_eq!(r.max_wipe_notice, Duration::from_millis(14));
        assert!(r.is_clean(), "{r}");
        // Without the wipe on record it is an unsignalled overlap.
        let r = check(&[released(a.clone(), Release::Lost), b.clone()], &[]);
        assert_eq!(r.unsignalled_overlaps, 1, "{r}");
        // Noticed at 40, past the notice: a violation.
        let mut late = a.clone();
        late.lost_at = Some(40 * MS);
        let r = check_with_wipes(
            &[released(late, Release::Lost), b.clone()],
            &[],
            std::slice::from_ref(&force),
        );
        assert_eq!((r.wiped_overlaps, r.unsignalled_overlaps), (0, 1), "{r}");
        // Never noticed, its release saying Ok (a local handoff of the deleted lock): both a
        // false Ok and an unsignalled overlap.
        let mut untold = a;
        untold.lost_at = None;
        let r = check_with_wipes(
            &[released(untold, Release::Ok), b.clone()],
            &[],
            std::slice::from_ref(&force),
        );
        assert_eq!((r.unsignalled_overlaps, r.false_ok_releases), (1, 1), "{r}");
        // A holder that entered after the wipe began is not excused by it.
        let mut after = iv("c", 9, 3, 11, 50);
        after.lost_at = Some(13 * MS);
        after.last_held = Some(14 * MS);
        let r = check_with_wipes(&[after, b], &[], &[force]);
        assert_eq!((r.wiped_overlaps, r.unsignalled_overlaps), (0, 1), "{r}");
    }

    #[test]
    fn an_untold_successor_of_a_wiped_lock_is_a_violation() {
        // The local handoff of a deleted lock: a (token 10) held k when it was deleted (10 to
        // 11); b of another process got it (token 11) and entered at 12; a left at 15 and its
        // release handed the lock to t2 of its process and said Ok; t2, which asked for no
        // token, entered at 16 with is_held() true and stayed until 30 beside b.
        let force = wipe("force-unlock", Some("k"), 10, 11, 20);
        let mut a = released(iv("a", 10, 1, 0, 15), Release::Ok);
        a.last_held = Some(14 * MS);
        let b = released(iv("b", 11, 2, 12, 40), Release::Ok);
        let mut t2 = released(iv("t2", 0, 3, 16, 30), Release::Ok);
        t2.last_held = Some(29 * MS);
        let log = [a, b.clone(), t2];
        let r = check_with_wipes(&log, &[], std::slice::from_ref(&force));
        // a's release; a beside b (never told), and b beside t2: both entered after the wipe,
        // neither told.
        assert_eq!(r.false_ok_releases, 1, "{r}");
        assert_eq!((r.overlaps, r.unsignalled_overlaps), (2, 2), "{r}");
        assert_eq!(r.untold_after_wipe, 1, "{r}");
        assert_eq!(r.unsignalled_by_key.get("k"), Some(&2));
        assert!(!r.is_clean());
        // The fixed kit: a's release says Lost (it noticed nothing before, but its release
        // goes to Redis), and t2 waits for b instead (enters at 41): clean.
        let mut a = iv("a", 10, 1, 0, 15);
        a.last_held = Some(14 * MS);
        let a = released(a, Release::Lost);
        let t2 = released(iv("t2", 0, 3, 41, 50), Release::Ok);
        let r = check_with_wipes(&[a, b.clone(), t2], &[], std::slice::from_ref(&force));
        assert!(r.is_clean(), "{r}");
        assert_eq!(r.wiped_overlaps, 1, "{r}");
        // A successor that entered knowing it had lost (its enter check said so) was told.
        let mut told = iv("t2", 0, 3, 16, 30);
        told.last_held = None;
        told.lost_at = Some(16 * MS);
        told.outcome = Outcome::Lost;
        let r = check_with_wipes(&[b, told], &[], &[force]);
        assert_eq!(
            (r.signalled_overlaps, r.unsignalled_overlaps),
            (1, 0),
            "{r}"
        );
    }

    fn granted(mut iv: Interval, granted_ms: u64) -> Interval {
        iv.t_granted = Some(granted_ms * MS);
        iv
    }

    #[test]
    fn a_holder_granted_before_a_wipe_and_entering_after_it_is_judged_by_its_grant() {
        // b's lock was granted at 9 (a local handoff, then its token's round trip), the key
        // was force-unlocked from 10 to 11, b entered at 12, c of another process got the key
        // (token 12) and entered at 13; b noticed at its next renewal, at 25 (within the
        // notice), and its release said Lost. A soak under heavy load.
        let force = wipe("force-unlock", Some("k"), 10, 11, 20);
        let mut b = iv("b", 11, 1, 12, 30);
        b.last_held = Some(20 * MS);
        b.lost_at = Some(25 * MS);
        let b = released(b, Release::Lost);
        let c = released(granted(iv("c", 12, 2, 13, 40), 13), Release::Ok);
        // Stamped at its enter only, b looks as if it got the lock after the wipe.
        let r = check_with_wipes(&[b.clone(), c.clone()], &[], std::slice::from_ref(&force));
        assert_eq!((r.unsignalled_overlaps, r.untold_after_wipe), (1, 1), "{r}");
        // Its grant stamp says it held the lock the wipe took: excused.
        let r = check_with_wipes(
            &[granted(b.clone(), 9), c.clone()],
            &[],
            std::slice::from_ref(&force),
        );
        assert_eq!((r.wiped_overlaps, r.unsignalled_overlaps), (1, 0), "{r}");
        assert!(r.is_clean(), "{r}");
        // Granted after the wipe ended, the overlap is b's own: not excused.
        let r = check_with_wipes(&[granted(b, 11), c], &[], &[force]);
        assert_eq!((r.wiped_overlaps, r.unsignalled_overlaps), (0, 1), "{r}");
        assert_eq!(r.untold_after_wipe, 1, "{r}");
    }

    #[test]
    fn holders_without_a_token_are_ordered_by_their_grants() {
        // p's lock (token 5) was granted at 9; the key was force-unlocked from 10 to 11; u got
        // the free key at 12 and entered at 13 without a token (the key's real holder); p
        // entered at 16 (slow), colliding with u, and noticed at 25, its release Lost.
        let force = wipe("force-unlock", Some("k"), 10, 11, 20);
        let u = released(granted(iv("u", 0, 1, 13, 40), 12), Release::Ok);
        let mut p = iv("p", 5, 2, 16, 30);
        p.last_held = Some(20 * MS);
        p.lost_at = Some(25 * MS);
        p.occupancy = 2;
        p.collided_with = vec!["u".to_owned()];
        let p = released(p, Release::Lost);
        // By enter times u is the older one, never told: an unsignalled overlap and an
        // unexplained collision.
        let r = check_with_wipes(&[u.clone(), p.clone()], &[], std::slice::from_ref(&force));
        assert_eq!(
            (r.unsignalled_overlaps, r.occupancy_violations),
            (1, 1),
            "{r}"
        );
        assert!(r.violations[0].contains("u (Exclusive, fence 0"), "{r:?}");
        // By grants p is, and the wipe took its lock.
        let r = check_with_wipes(&[u, granted(p, 9)], &[], &[force]);
        assert_eq!((r.wiped_overlaps, r.occupancy_violations), (1, 0), "{r}");
        assert!(r.is_clean(), "{r}");
    }

    #[test]
    fn an_ok_release_of_a_lock_granted_before_a_wipe_is_false_however_late_it_entered() {
        // Granted at 2, wiped from 3 to 4, entered at 5, left at 8, its release said Ok.
        let a = released(iv("a", 10, 1, 5, 8), Release::Ok);
        let del = wipe("del", Some("k"), 3, 4, 400);
        assert!(
            check_with_wipes(std::slice::from_ref(&a), &[], std::slice::from_ref(&del)).is_clean()
        );
        let r = check_with_wipes(&[granted(a, 2)], &[], &[del]);
        assert_eq!(r.false_ok_releases, 1, "{r}");
        assert!(
            r.violations[0].contains("(granted 2000000, exit 8000000)"),
            "{r:?}"
        );
    }

    #[test]
    fn sections_without_a_token_claim_nothing_and_are_ordered_by_enter_time() {
        // t (no token) between two tokened holders: no fence regression, no stale write.
        let log = [
            iv("a", 10, 1, 0, 4),
            iv("t", 0, 2, 5, 6),
            iv("b", 11, 3, 7, 9),
        ];
        let r = check(&log, &[write(4, 11, true)]);
        assert!(r.is_clean(), "{r}");
        assert_eq!((r.fence_regressions, r.stale_attempted), (0, 0));
        // t inside while a is (both confirmed): a, which entered first, is the older one.
        let r = check(&[iv("a", 10, 1, 0, 8), iv("t", 0, 2, 5, 9)], &[]);
        assert_eq!(r.unsignalled_overlaps, 1, "{r}");
        assert!(r.violations[0].contains("a (Exclusive, fence 10"), "{r:?}");
        // On the referee: t collided with a; t entered knowing it had lost: excused.
        let mut t = iv("t", 0, 2, 5, 9);
        t.occupancy = 2;
        t.collided_with = vec!["a".to_owned()];
        let r = check(&[iv("a", 10, 1, 0, 4), t.clone()], &[]);
        assert_eq!(r.occupancy_violations, 1, "{r}");
        t.last_held = None;
        t.lost_at = Some(5 * MS);
        let r = check(&[iv("a", 10, 1, 0, 4), t], &[]);
        assert_eq!(
            (r.occupancy_collisions, r.occupancy_violations),
            (1, 0),
            "{r}"
        );
    }
}
