//! The records the referee keeps and their stored form.

/// How a critical section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The holder finished and released the lock while still holding it.
    Completed,
    /// The holder learned that it had lost the lock (the lost signal, `is_held()` false, or a
    /// release answering "lost").
    Lost,
    /// The section ran to its end but the release failed with a backend error (the key then
    /// expires with its lease).
    ReleaseFailed,
    /// The holder's process was SIGKILLed; the interval was closed by
    /// [`Oracle::close_worker`](super::Oracle::close_worker).
    Killed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Lost => "lost",
            Self::ReleaseFailed => "release-failed",
            Self::Killed => "killed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "completed" => Self::Completed,
            "lost" => Self::Lost,
            "release-failed" => Self::ReleaseFailed,
            "killed" => Self::Killed,
            _ => return None,
        })
    }
}

/// One critical section, as logged on the referee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// Unique id: `<worker>#<n>`.
    pub id: String,
    /// The user's lock key.
    pub key: String,
    /// The fencing token of the acquisition.
    pub fence: u64,
    /// Position of the enter in the referee's global sequence (shared with fenced writes).
    pub enter_seq: u64,
    /// `CLOCK_MONOTONIC` ns, stamped after the acquire returned.
    pub t_enter: u64,
    /// `CLOCK_MONOTONIC` ns, stamped before leaving (before the release was sent).
    pub t_exit: u64,
    /// Stamped before the last `is_held()` that answered true, if any.
    pub last_held: Option<u64>,
    /// Stamped after the holder first observed that the lock was lost, if it did.
    pub lost_at: Option<u64>,
    /// What `INCR occ:<key>` returned on enter (1 unless someone else was inside).
    pub occupancy: u64,
    /// Ids of the holders that were inside when this one entered.
    pub collided_with: Vec<String>,
    /// How the section ended.
    pub outcome: Outcome,
}

pub(super) fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

pub(super) fn parse_opt(s: &str) -> Option<Option<u64>> {
    if s == "-" {
        Some(None)
    } else {
        s.parse().ok().map(Some)
    }
}

pub(super) fn parse_list(s: &str) -> Vec<String> {
    if s.is_empty() || s == "-" {
        Vec::new()
    } else {
        s.split(',').map(str::to_owned).collect()
    }
}

impl Interval {
    /// The tab-separated line stored in the referee's log.
    pub fn to_line(&self) -> String {
        let collided = if self.collided_with.is_empty() {
            "-".to_owned()
        } else {
            self.collided_with.join(",")
        };
        [
            "v1",
            &self.id,
            &self.key,
            &self.fence.to_string(),
            &self.enter_seq.to_string(),
            &self.t_enter.to_string(),
            &self.t_exit.to_string(),
            &opt(self.last_held),
            &opt(self.lost_at),
            &self.occupancy.to_string(),
            &collided,
            self.outcome.as_str(),
        ]
        .join("\t")
    }

    /// Parses a line written by [`to_line`](Self::to_line).
    pub fn from_line(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 12 || f[0] != "v1" {
            return None;
        }
        Some(Self {
            id: f[1].to_owned(),
            key: f[2].to_owned(),
            fence: f[3].parse().ok()?,
            enter_seq: f[4].parse().ok()?,
            t_enter: f[5].parse().ok()?,
            t_exit: f[6].parse().ok()?,
            last_held: parse_opt(f[7])?,
            lost_at: parse_opt(f[8])?,
            occupancy: f[9].parse().ok()?,
            collided_with: parse_list(f[10]),
            outcome: Outcome::parse(f[11])?,
        })
    }
}

/// One write to the fenced resource, as logged by the script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    /// Position in the referee's global sequence (shared with enters).
    pub seq: u64,
    /// The user's lock key.
    pub key: String,
    /// The fencing token the write carried.
    pub fence: u64,
    /// Whether the resource accepted it.
    pub accepted: bool,
    /// The writer's interval id.
    pub id: String,
}

impl FencedWrite {
    pub(super) fn from_line(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 5 {
            return None;
        }
        Some(Self {
            seq: f[0].parse().ok()?,
            key: f[1].to_owned(),
            fence: f[2].parse().ok()?,
            accepted: f[3] == "1",
            id: f[4].to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let mut a = Interval {
            id: "w1#7".to_owned(),
            key: "k".to_owned(),
            fence: 1_700_000_000_123_456,
            enter_seq: 42,
            t_enter: 3_000_000,
            t_exit: 4_000_000,
            last_held: Some(3_000_000),
            lost_at: None,
            occupancy: 1,
            collided_with: Vec::new(),
            outcome: Outcome::Completed,
        };
        a.lost_at = Some(5);
        a.collided_with = vec!["w2#1".to_owned(), "w3#9".to_owned()];
        a.outcome = Outcome::ReleaseFailed;
        assert_eq!(Interval::from_line(&a.to_line()), Some(a.clone()));
        a.last_held = None;
        a.collided_with.clear();
        assert_eq!(Interval::from_line(&a.to_line()), Some(a));
        assert_eq!(Interval::from_line("garbage"), None);
    }
}
