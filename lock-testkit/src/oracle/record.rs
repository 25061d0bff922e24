//! The records the referee keeps, and their stored form: one JSON object per record, its
//! fields named and typed by the struct it is read into (serde), so a record's field list is
//! its struct and nothing else.
//!
//! Two records are completed by a script, which adds the fields the referee assigns to the
//! holder's JSON object without decoding it (Lua numbers are doubles and would round 64-bit
//! tokens and times): [`OpenSection`] is [`Entered`] plus the fields `enter.lua` adds, and a
//! [`FencedWrite`] is a [`WriteRequest`] plus the fields `write.lua` adds.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// How a critical section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
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

/// What the holder's release answered, recorded with
/// [`Entry::record_release`](super::Entry::record_release); absent when no release ran (a
/// killed holder) or nobody recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Release {
    /// `Ok`: the lock was ours until the release gave it up (in Redis, or by a local handoff).
    Ok,
    /// The lock had been lost (`LockError::Lost`).
    Lost,
    /// Any other error (a backend failure).
    Failed,
}

/// A lock server event that took lock keys away from their holders (`DEL`, a forced unlock,
/// `FLUSHALL`, a restart without persistence), recorded by whoever caused it
/// ([`Oracle::wipe`](super::Oracle::wipe)). A holder inside when it happened did not lose its
/// lock by its own fault: it may go on believing it holds until it notices (its next renewal),
/// so an overlap with a holder that entered after the wipe is excused if it noticed within
/// `notice` of the wipe; but its release must not answer `Ok` (see [`check`](super::check)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wipe {
    /// The user key whose lock went, or `None` for every key.
    pub key: Option<String>,
    /// What happened (for reports): `force-unlock`, `del`, `flushall`, `restart-empty`, ...
    pub kind: String,
    /// `CLOCK_MONOTONIC` ns before the command (or the restart) was sent.
    pub begin: u64,
    /// `CLOCK_MONOTONIC` ns after it was answered (the restarted server answers again).
    pub end: u64,
    /// How long after `end` a holder inside may take to notice the loss, in ns (e.g. one
    /// renewal interval plus a round trip and scheduling).
    pub notice: u64,
}

impl Wipe {
    /// Whether the wipe took the lock of `key`.
    pub fn covers(&self, key: &str) -> bool {
        self.key.as_deref().is_none_or(|k| k == key)
    }
}

/// The kind of lock a critical section is entered under, as lock-core's kinds (a fair lock is
/// `Exclusive`): which other sections of the same key may be inside at the same time. Stored
/// (in the `access` field) as `"exclusive"`, `"shared"` or `{"permit":n}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Alone: the holder of a mutex or of a write lock. The default, and the access of a
    /// record written without the field.
    #[default]
    Exclusive,
    /// Together with other shared sections only: a reader of a read-write lock (readers xor
    /// one writer).
    Shared,
    /// Together with other permit sections, at most `n` at once: a holder of one of the `n`
    /// permits of a semaphore (`n` is at least 1; 0 counts as 1). Stored as `{"permit":n}`.
    #[serde(rename = "permit")]
    Permits(u32),
}

impl Kind {
    /// Whether a section of this access and one of `other` may be inside together (permits
    /// within their number).
    pub fn compatible(self, other: Self) -> bool {
        matches!(
            (self, other),
            (Self::Shared, Self::Shared) | (Self::Permits(_), Self::Permits(_))
        )
    }

    /// How many compatible sections may be inside besides this one before one too many is:
    /// `n - 1` for a permit, unbounded for a shared section, none for an exclusive one.
    pub(super) fn others_allowed(self) -> u64 {
        match self {
            Self::Exclusive => 0,
            Self::Shared => u64::MAX,
            Self::Permits(n) => u64::from(n.max(1)) - 1,
        }
    }

    /// The code the referee's scripts store per occupant (`x`, `s`, `p`) and, for a permit,
    /// the number of permits.
    pub(super) fn code(self) -> (&'static str, u32) {
        match self {
            Self::Exclusive => ("x", 1),
            Self::Shared => ("s", 0),
            Self::Permits(n) => ("p", n.max(1)),
        }
    }
}

/// One critical section, as logged on the referee (stored as JSON with these field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interval {
    /// Unique id: `<worker>#<n>`.
    pub id: String,
    /// The user's lock key.
    pub key: String,
    /// How it was entered (absent in records of exclusive sections written before the field
    /// existed).
    #[serde(default)]
    pub access: Kind,
    /// The fencing token of the acquisition; 0 for none: shared and permit sections (fencing
    /// orders exclusive holders), and exclusive holders that did not ask for one (they are
    /// ordered by their enter times, and take no part in the fenced resource).
    pub fence: u64,
    /// Position of the enter in the referee's global sequence (shared with fenced writes).
    pub enter_seq: u64,
    /// `CLOCK_MONOTONIC` ns, stamped after the acquire returned.
    pub t_enter: u64,
    /// `CLOCK_MONOTONIC` ns, stamped as soon as the acquire returned, before anything else the
    /// holder did before it entered (a fencing token's round trip): the closest upper bound of
    /// when the lock was granted, for the checker's rules on who held a lock before a [`Wipe`]
    /// and on the order of holders without tokens. Absent when the holder entered with
    /// [`Oracle::enter_as`](super::Oracle::enter_as) (and in records written before the field
    /// existed): then [`granted_at`](Self::granted_at) is `t_enter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_granted: Option<u64>,
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
    /// What its release answered, if it was recorded.
    #[serde(default)]
    pub release: Option<Release>,
}

impl Interval {
    /// The interval of a section that has just been entered: it ends where it starts until
    /// it leaves, and counts as completed until it finishes otherwise.
    pub(super) fn open(id: String, section: OpenSection) -> Self {
        let OpenSection {
            entered,
            enter_seq,
            occupancy,
            collided_with,
            below_high_water: _,
        } = section;
        Self {
            id,
            key: entered.key,
            access: entered.access,
            fence: entered.fence,
            enter_seq,
            t_enter: entered.t_enter,
            t_granted: entered.t_granted,
            t_exit: entered.t_enter,
            last_held: entered.last_held,
            lost_at: entered.lost_at,
            occupancy,
            collided_with,
            outcome: Outcome::Completed,
            release: None,
        }
    }

    /// When the lock was granted at the latest: the grant stamp, or the enter stamp where the
    /// holder recorded none.
    pub fn granted_at(&self) -> u64 {
        self.t_granted.unwrap_or(self.t_enter)
    }

    /// What the holder recorded when it left.
    pub(super) fn left(&self) -> Left {
        Left {
            t_exit: self.t_exit,
            last_held: self.last_held,
            lost_at: self.lost_at,
        }
    }

    /// Takes the exit and the observations recorded on leave.
    pub(super) fn set_left(&mut self, left: Left) {
        self.t_exit = left.t_exit;
        self.last_held = left.last_held;
        self.lost_at = left.lost_at;
    }
}

/// One write to the fenced resource, as logged by `write.lua`: the writer's `key`, `fence`
/// and `id`, with `seq` and `accepted` added by the script.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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

/// The writer's part of a [`FencedWrite`], sent to `write.lua`.
#[derive(Debug, Serialize)]
pub(super) struct WriteRequest<'a> {
    pub(super) key: &'a str,
    pub(super) fence: u64,
    pub(super) id: &'a str,
}

/// What a holder knows of its section when it enters, sent to `enter.lua`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Entered {
    pub(super) key: String,
    #[serde(default)]
    pub(super) access: Kind,
    pub(super) fence: u64,
    pub(super) t_enter: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) t_granted: Option<u64>,
    pub(super) last_held: Option<u64>,
    pub(super) lost_at: Option<u64>,
}

/// A section in progress as `enter.lua` stores it in `open:<worker>` and returns it: the
/// holder's [`Entered`] and what the referee assigned.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct OpenSection {
    #[serde(flatten)]
    pub(super) entered: Entered,
    /// Position of the enter in the run's sequence.
    pub(super) enter_seq: u64,
    /// The occupancy counter after the increment.
    pub(super) occupancy: u64,
    /// The sections that were inside. Absent when there were none: cjson encodes an empty
    /// table as `{}`, not `[]`.
    #[serde(default)]
    pub(super) collided_with: Vec<String>,
    /// The token was not above the fenced resource's high-water mark.
    pub(super) below_high_water: bool,
}

/// What a holder recorded when it left, kept by `leave.lua` in `left:<worker>` until the
/// section finishes (for [`Oracle::close_worker`](super::Oracle::close_worker)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Left {
    pub(super) t_exit: u64,
    pub(super) last_held: Option<u64>,
    pub(super) lost_at: Option<u64>,
}

/// The stored form of a record.
///
/// # Errors
///
/// Never for the records of this module (their fields are plain values); the error is mapped
/// to a client error rather than assumed away.
pub(super) fn encode(record: &impl Serialize) -> redis::RedisResult<String> {
    serde_json::to_string(record).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::Client,
            "oracle record not encodable",
            e.to_string(),
        ))
    })
}

/// Reads a stored record; `what` names it in the error.
///
/// # Errors
///
/// When `json` is not a `T`.
pub(super) fn decode<T: DeserializeOwned>(what: &'static str, json: &str) -> redis::RedisResult<T> {
    serde_json::from_str(json).map_err(|e| {
        redis::RedisError::from((redis::ErrorKind::Client, what, format!("{e}: {json}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval() -> Interval {
        Interval {
            id: "w1#7".to_owned(),
            key: "k".to_owned(),
            access: Kind::Exclusive,
            fence: u64::MAX,
            enter_seq: 42,
            t_enter: 1_700_000_000_123_456_789,
            t_granted: Some(1_700_000_000_123_456_000),
            t_exit: 1_700_000_000_123_456_790,
            last_held: None,
            lost_at: Some(5),
            occupancy: 2,
            collided_with: vec!["w2#1".to_owned(), "w3#9".to_owned()],
            outcome: Outcome::ReleaseFailed,
            release: Some(Release::Failed),
        }
    }

    #[test]
    fn intervals_round_trip_with_named_fields() {
        let mut a = interval();
        let json = encode(&a).expect("encodes");
        assert!(
            json.contains(r#""fence":18446744073709551615"#)
                && json.contains(r#""last_held":null"#)
                && json.contains(r#""outcome":"release-failed""#),
            "{json}"
        );
        assert_eq!(decode::<Interval>("interval", &json).ok(), Some(a.clone()));
        assert!(json.contains(r#""release":"failed""#), "{json}");
        assert!(
            json.contains(r#""t_granted":1700000000123456000"#),
            "{json}"
        );
        a.collided_with.clear();
        a.outcome = Outcome::Killed;
        a.release = None;
        a.t_granted = None;
        let json = encode(&a).expect("encodes");
        assert!(!json.contains("t_granted"), "{json}");
        assert_eq!(decode::<Interval>("interval", &json).ok(), Some(a));
        assert!(decode::<Interval>("interval", "garbage").is_err());
        assert!(decode::<Interval>("interval", r#"{"id":"w1#7"}"#).is_err());
    }

    #[test]
    fn the_access_is_stored_by_name_and_defaults_to_exclusive() {
        let mut a = interval();
        for (access, stored) in [
            (Kind::Shared, r#""access":"shared""#),
            (Kind::Permits(3), r#""access":{"permit":3}"#),
            (Kind::Exclusive, r#""access":"exclusive""#),
        ] {
            a.access = access;
            let json = encode(&a).expect("encodes");
            assert!(json.contains(stored), "{json}");
            assert_eq!(decode::<Interval>("interval", &json).ok(), Some(a.clone()));
        }
        // A record of an exclusive section written before the field existed.
        let old = r#"{"id":"a#1","key":"k","fence":10,"enter_seq":1,"t_enter":0,"t_exit":8,"last_held":0,"lost_at":null,"occupancy":1,"collided_with":[],"outcome":"completed"}"#;
        let old: Interval = decode("interval", old).expect("decodes");
        assert_eq!((old.access, old.release), (Kind::Exclusive, None));
        // ... and before the grant stamp existed: granted when it entered.
        assert_eq!((old.t_granted, old.granted_at()), (None, old.t_enter));
        assert!(decode::<Interval>("interval", &old_with_access("\"nonsense\"")).is_err());
    }

    fn old_with_access(access: &str) -> String {
        format!(
            r#"{{"id":"a#1","key":"k","access":{access},"fence":10,"enter_seq":1,"t_enter":0,"t_exit":8,"last_held":0,"lost_at":null,"occupancy":1,"collided_with":[],"outcome":"completed"}}"#
        )
    }

    #[test]
    fn compatibility_and_allowance_of_the_accesses() {
        use Kind::{Exclusive, Permits, Shared};
        assert!(Shared.compatible(Shared) && Permits(2).compatible(Permits(2)));
        for (a, b) in [
            (Exclusive, Exclusive),
            (Exclusive, Shared),
            (Shared, Permits(4)),
        ] {
            assert!(!a.compatible(b) && !b.compatible(a), "{a:?} {b:?}");
        }
        assert_eq!(
            [Exclusive, Shared, Permits(3), Permits(0)].map(Kind::others_allowed),
            [0, u64::MAX, 2, 0]
        );
    }

    #[test]
    fn the_scripts_fields_complete_the_holders_records() {
        // What enter.lua and write.lua store: the holder's object with the referee's fields
        // appended (in any order; `collided_with` absent when empty).
        let entered = Entered {
            key: "k".to_owned(),
            access: Kind::Exclusive,
            fence: u64::MAX,
            t_enter: 3,
            t_granted: Some(2),
            last_held: Some(3),
            lost_at: None,
        };
        let json = encode(&entered).expect("encodes");
        let stored = format!(
            "{},\"below_high_water\":false,\"occupancy\":1,\"enter_seq\":7}}",
            &json[..json.len() - 1]
        );
        let section: OpenSection = decode("open section", &stored).expect("decodes");
        let iv = Interval::open("w#1".to_owned(), section);
        assert_eq!((iv.fence, iv.enter_seq, iv.occupancy), (u64::MAX, 7, 1));
        assert_eq!((iv.t_enter, iv.t_exit, iv.last_held), (3, 3, Some(3)));
        assert_eq!((iv.t_granted, iv.granted_at()), (Some(2), 2));
        assert!(iv.collided_with.is_empty());

        let json = encode(&WriteRequest {
            key: "k",
            fence: 12,
            id: "w#1",
        })
        .expect("encodes");
        let stored = format!("{},\"accepted\":true,\"seq\":8}}", &json[..json.len() - 1]);
        let write: FencedWrite = decode("write", &stored).expect("decodes");
        assert_eq!(
            write,
            FencedWrite {
                seq: 8,
                key: "k".to_owned(),
                fence: 12,
                accepted: true,
                id: "w#1".to_owned(),
            }
        );
    }
}
