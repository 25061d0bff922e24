//! The Redis side: each script as one atomic step on the data set, and the ghost bookkeeping
//! of what it did to the holds of each token.

use crate::config::{Config, Mutation, Tick};
use crate::state::{
    AcquireReply, FenceKey, Latch, LockKey, Op, Owner, Phase, ReleaseReply, RenewReply, Reply,
    State, Token, FENCE_SCALE, TASKS,
};

/// One bit of the waiting writers' set.
fn bit(token: Token) -> u8 {
    1 << token
}

impl State {
    /// Runs `op` in Redis now, for `owner` (a task whose ghosts record the proof or the fence
    /// it got); returns the reply and whether the command ran after an unseen loss of its
    /// token's key (see [`Ghosts`](crate::state::Ghosts)).
    pub fn run(&mut self, config: &Config, op: Op, owner: Owner) -> (Reply, bool) {
        match op {
            Op::Acquire { token } => (Reply::Acquire(self.acquire(config, token)), false),
            Op::Release { token } => (Reply::Release(self.release(config, token, owner)), false),
            Op::Renew {
                token,
                lease,
                exact,
            } => {
                let reply = self.renew(config, token, lease, exact, owner);
                (
                    Reply::Renew(reply),
                    self.ran_after_unseen_loss(token, reply),
                )
            }
            Op::Confirm { token } => {
                let reply = self.confirm(token, owner);
                (
                    Reply::Renew(reply),
                    self.ran_after_unseen_loss(token, reply),
                )
            }
            Op::Fence { token } => {
                let reply = self.fence(config, token);
                let fresh = reply.is_none() && self.unseen_loss_of(token);
                (Reply::Fence(reply), fresh)
            }
            Op::Withdraw { token } => {
                self.withdraw(token);
                (Reply::Withdrawn, false)
            }
        }
    }

    fn ran_after_unseen_loss(&mut self, token: Token, reply: RenewReply) -> bool {
        reply != RenewReply::Renewed && self.unseen_loss_of(token)
    }

    fn unseen_loss_of(&mut self, token: Token) -> bool {
        self.holds_of(token).iter().any(|g| g.unseen_loss)
    }

    /// `acquire.lua` with the restart guard (`guard.lua`) prepended.
    fn acquire(&mut self, config: &Config, token: Token) -> AcquireReply {
        if config.restart_guard.is_some() && self.now < self.redis.guard_until {
            self.trace.guard_refused = true;
            return AcquireReply::Guarded;
        }
        let now = self.now;
        let data = &mut self.redis.data;
        match data.lock {
            None => {
                // SET NX PX; the winner leaves the waiting writers.
                data.lock = Some(LockKey {
                    token,
                    expires: now + config.lease,
                });
                data.waiting &= !bit(token);
                if data.waiting == 0 {
                    data.waiting_expires = 0;
                }
                self.granted(token);
                AcquireReply::Acquired
            }
            Some(ref mut lock) if lock.token == token => {
                // A retry of our own acquire: the lease is applied again.
                lock.expires = now + config.lease;
                AcquireReply::Acquired
            }
            Some(_) => {
                // Busy: the caller joins the waiting writers (it waits); the set's TTL is only
                // ever lengthened.
                data.waiting |= bit(token);
                data.waiting_expires = data.waiting_expires.max(now + config.waiting_ttl);
                AcquireReply::Busy
            }
        }
    }

    /// `release.lua` (compare-and-delete, latch, publish when another locker waits).
    fn release(&mut self, config: &Config, token: Token, owner: Owner) -> ReleaseReply {
        let now = self.now;
        let latch_written = !config.has(Mutation::ReleaseWithoutLatch);
        let data = &mut self.redis.data;
        if data.lock.is_some_and(|l| l.token == token) {
            data.lock = None;
            let waited = data.waiting != 0;
            data.waiting = 0;
            data.waiting_expires = 0;
            if latch_written {
                data.latches[usize::from(token)] = Some(Latch {
                    waited,
                    expires: now + config.latch_ttl,
                });
            }
            if waited {
                self.publish();
            }
            if let Owner::Task(task) = owner {
                if let Phase::Releasing(hold, _) = &mut self.tasks[usize::from(task)] {
                    if hold.token == token && hold.proof.is_none() {
                        hold.proof = Some(hold.ghosts.kept);
                    }
                }
            }
            return ReleaseReply::Deleted { waited };
        }
        // Not ours: an abandoned acquire's waiting entry goes; the last one's leaving, with
        // the lock free, is told on the channel.
        let was_waiting = data.waiting & bit(token) != 0;
        data.waiting &= !bit(token);
        if was_waiting && data.waiting == 0 {
            data.waiting_expires = 0;
            if data.lock.is_none() {
                self.publish();
            }
        }
        let data = &mut self.redis.data;
        if let Some(latch) = data.latches[usize::from(token)] {
            return ReleaseReply::Latched {
                waited: latch.waited,
            };
        }
        match data.lock {
            None => ReleaseReply::Absent,
            Some(_) => ReleaseReply::Replaced,
        }
    }

    /// `renew.lua` for one key: renewed only while the key holds the token, and (unless
    /// `exact`) only where the lease grows; a fence key is kept alive past the lock's end by
    /// its window.
    fn renew(
        &mut self,
        config: &Config,
        token: Token,
        lease: Tick,
        exact: bool,
        owner: Owner,
    ) -> RenewReply {
        let now = self.now;
        match self.redis.data.lock {
            Some(ref mut lock) if lock.token == token => {
                let ttl = lock.expires - now;
                if exact || ttl < lease || config.has(Mutation::RenewalsShorten) {
                    lock.expires = now + lease;
                }
                let until = lock.expires + config.fence_window;
                if let Some(fence) = self.redis.data.fence.as_mut() {
                    fence.expires = fence.expires.max(until);
                }
                self.prove_handoff(owner);
                RenewReply::Renewed
            }
            None => RenewReply::Absent,
            Some(_) => RenewReply::Replaced,
        }
    }

    /// A confirmation (`renew.lua` or `GET`) found the key holding the token: when `owner` is
    /// a task confirming its handoff, that is the handoff's proof.
    fn prove_handoff(&mut self, owner: Owner) {
        if let Owner::Task(task) = owner {
            if let Phase::Releasing(hold, crate::state::Finish::Confirm(_)) =
                &mut self.tasks[usize::from(task)]
            {
                // The handoff's proof: the key holds the token now.
                hold.proof = Some(hold.ghosts.kept);
                hold.ghosts.unseen_loss = false;
            }
        }
    }

    /// `GET` of the lock key, compared with the token by the caller: nothing changes in Redis
    /// (neither the lock's end nor its fence key's).
    fn confirm(&mut self, token: Token, owner: Owner) -> RenewReply {
        match self.redis.data.lock {
            Some(lock) if lock.token == token => {
                self.prove_handoff(owner);
                RenewReply::Renewed
            }
            None => RenewReply::Absent,
            Some(_) => RenewReply::Replaced,
        }
    }

    /// `fence.lua`: the next fencing token, only while the key holds the caller's token.
    fn fence(&mut self, config: &Config, token: Token) -> Option<u8> {
        let holds = self.redis.data.lock.is_some_and(|l| l.token == token);
        if !holds {
            return None;
        }
        let last = self.redis.data.fence.map_or(0, |f| f.last);
        let clock = self.now * FENCE_SCALE + self.redis.fences_this_tick;
        let value = clock.max(last + 1);
        // The fence key outlives the lock by the window, and never ends sooner than it did.
        let lock_end = self.redis.data.lock.map_or(self.now, |l| l.expires);
        let expires = self
            .redis
            .data
            .fence
            .map_or(0, |f| f.expires)
            .max(lock_end + config.fence_window);
        self.redis.data.fence = Some(FenceKey {
            last: value,
            expires,
        });
        self.redis.fences_this_tick += 1;
        // Ghost: in grant order, the holder's token is larger than every one issued before
        // (each was issued to an earlier holder, or earlier to this one), and it goes only to
        // the key's current holder.
        if !holds || self.trace.max_fence.is_some_and(|max| value <= max) {
            self.trace.fence_out_of_order = true;
        }
        self.trace.max_fence = Some(value);
        Some(value)
    }

    /// `withdraw.lua`: leaves the waiting writers; the last one to leave, with the lock free,
    /// tells the channel.
    fn withdraw(&mut self, token: Token) {
        let data = &mut self.redis.data;
        if data.waiting & bit(token) == 0 {
            return;
        }
        data.waiting &= !bit(token);
        if data.waiting == 0 {
            data.waiting_expires = 0;
            if data.lock.is_none() {
                self.publish();
            }
        }
    }

    /// `PUBLISH` on the release channel: every subscribed waiter wakes (`release_messages.rs`).
    fn publish(&mut self) {
        for phase in &mut self.tasks {
            if let Phase::Acquiring(attempt) = phase {
                if attempt.seen_busy {
                    attempt.woken = true;
                }
            }
        }
    }

    /// Ghosts: the lock key now holds `token` (a grant, or a restart that brought it back).
    pub fn granted(&mut self, token: Token) {
        for other in 0..TASKS as Token {
            for ghosts in self.holds_of(other) {
                if other == token {
                    ghosts.kept = true;
                    ghosts.unseen_loss = false;
                } else {
                    ghosts.kept = false;
                }
            }
        }
    }

    /// Ghosts: the key holding `token` was lost behind its holders' backs.
    pub fn lost_unseen(&mut self, token: Token) {
        for ghosts in self.holds_of(token) {
            ghosts.unseen_loss = true;
        }
    }

    /// Ghosts: the key holding `token` expired.
    pub fn expired(&mut self, token: Token) {
        for ghosts in self.holds_of(token) {
            ghosts.kept = false;
        }
    }

    /// Ghosts: an answer of a command that ran after the unseen loss reached the holders of
    /// `token`.
    pub fn loss_answered(&mut self, token: Token) {
        for ghosts in self.holds_of(token) {
            ghosts.unseen_loss = false;
        }
    }
}
