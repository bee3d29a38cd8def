//! The acceptor's audit of every trust group's block table, a few times a second: a block
//! whose word carries a tag no connection of the group owns (a faulty member wrote it, or a
//! closed client went on claiming) is freed once the same word has stood that way for a
//! grace period, and a live connection that holds more blocks than its quota for longer
//! than a grace period is closed (its blocks are then reclaimed like any dead
//! connection's). An honest client never does either: its lease stays within the quota.
//!
//! The audit only reads the table and frees, by CAS, words no live connection owns: a word a
//! worker may be validating or serving carries a live connection's tag.
//!
//! A round reads every word of every table, so it runs when it may find something: a client
//! was refused for want of blocks (a group's NACK count moved), a connection ended in the
//! last second (its last claims may race its reclaiming), words or connections are under
//! watch from the last round, or a few seconds passed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::state::ServerState;
use crate::segment::layout::block_state;
use crate::status::Status;
use crate::sync::Ordering;

/// How often the tables are audited while something may be amiss.
pub(super) const AUDIT_PERIOD: Duration = Duration::from_millis(200);
/// How often they are audited anyway.
const IDLE_AUDIT_PERIOD: Duration = Duration::from_secs(2);
/// How long after a connection ends the audit keeps its quick pace.
const AFTER_DEATH: Duration = Duration::from_secs(1);
/// How long a word must carry a tag nobody owns before it is freed.
const SCRUB_GRACE: Duration = Duration::from_millis(350);
/// How long a connection may hold more than its quota before it is closed.
const QUOTA_GRACE: Duration = Duration::from_secs(1);

/// What the audit remembers from one round to the next.
pub(super) struct Audit {
    /// When the last round ran.
    last: Instant,
    /// When a round was last considered (it may have found nothing to make it run).
    checked: Instant,
    /// Until when rounds are due every `AUDIT_PERIOD` (a connection ended).
    eager_until: Instant,
    /// The groups' NACK counts summed at the last round.
    nacks: u64,
    /// Per group: the words seen carrying a tag nobody owns, `block → (tag, first seen)`.
    suspects: Vec<HashMap<u32, (u32, Instant)>>,
    /// Connections over their quota, by tag, and since when.
    over: HashMap<u32, Instant>,
    /// Blocks held per connection index (scratch).
    held: Vec<u32>,
}

/// A live connection as the audit sees it.
#[derive(Clone)]
struct Live {
    tag: u32,
    group: u32,
    conn: Option<Arc<Conn>>,
}

impl Audit {
    pub(super) fn new() -> Audit {
        Audit {
            last: Instant::now(),
            checked: Instant::now(),
            eager_until: Instant::now(),
            nacks: 0,
            suspects: Vec::new(),
            over: HashMap::new(),
            held: Vec::new(),
        }
    }

    /// How long until the next round is due.
    pub(super) fn due_in(&self) -> Duration {
        AUDIT_PERIOD.saturating_sub(self.checked.elapsed())
    }

    /// A connection ended: audit at the quick pace for a while.
    pub(super) fn connection_ended(&mut self) {
        self.eager_until = Instant::now() + AFTER_DEATH;
    }

    /// Runs a round if one is due. `dying`: the tags of connections retired and not yet
    /// reclaimed (their words are the reclaimer's).
    pub(super) fn run(&mut self, server: &ServerState, dying: &[u32]) {
        if self.checked.elapsed() < AUDIT_PERIOD {
            return;
        }
        let now = Instant::now();
        self.checked = now;
        let since = now.duration_since(self.last);
        // A hint clients write: it can only make rounds more frequent.
        let nacks = server
            .groups
            .iter()
            .map(|g| g.replica.client_control().nacks.load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add);
        let refused = std::mem::replace(&mut self.nacks, nacks) != nacks;
        // Words or connections under watch finish their grace at the quick pace.
        let watching = !self.over.is_empty() || self.suspects.iter().any(|s| !s.is_empty());
        if !refused && !watching && now >= self.eager_until && since < IDLE_AUDIT_PERIOD {
            return;
        }
        self.last = now;
        let slots = server.conns.len();
        let live: Vec<Live> = (0..slots as u32)
            .map(|i| {
                let tag = server
                    .conns
                    .tag_word(i)
                    .map_or(0, |w| w.load(Ordering::Acquire));
                let conn = (tag != 0).then(|| server.conns.get(i)).flatten();
                Live {
                    tag,
                    group: conn.as_ref().map_or(u32::MAX, |c| c.group),
                    conn,
                }
            })
            .collect();
        let quota = server.spec.quota_blocks;
        self.suspects
            .resize_with(server.groups.count(), HashMap::new);
        let mut scrubbed = 0u64;
        let mut still_over = Vec::new();
        for group in server.groups.iter() {
            self.held.clear();
            self.held.resize(slots, 0);
            let previous = std::mem::take(&mut self.suspects[group.index as usize]);
            let mut suspects = HashMap::new();
            for (block, word) in group.replica.table().iter().enumerate() {
                let tag = word.load(Ordering::Relaxed);
                if tag == block_state::FREE {
                    continue;
                }
                let index = (tag & 0xffff).wrapping_sub(1) as usize;
                if let Some(l) = live.get(index).filter(|l| l.tag == tag) {
                    if l.group == group.index {
                        self.held[index] += 1;
                        continue;
                    }
                }
                if dying.contains(&tag) {
                    continue;
                }
                let block = block as u32;
                let since = match previous.get(&block) {
                    Some(&(seen, since)) if seen == tag => since,
                    _ => now,
                };
                if now.duration_since(since) >= SCRUB_GRACE {
                    let freed = word
                        .compare_exchange(
                            tag,
                            block_state::FREE,
                            Ordering::Release,
                            Ordering::Relaxed,
                        )
                        .is_ok();
                    scrubbed += u64::from(freed);
                } else {
                    suspects.insert(block, (tag, since));
                }
            }
            self.suspects[group.index as usize] = suspects;
            for (index, &held) in self.held.iter().enumerate() {
                let l = &live[index];
                if held <= quota || l.group != group.index {
                    continue;
                }
                still_over.push(l.tag);
                let since = *self.over.entry(l.tag).or_insert(now);
                if now.duration_since(since) >= QUOTA_GRACE {
                    if let Some(conn) = &l.conn {
                        server.violations.fetch_add(1, Ordering::Relaxed);
                        conn.close(Status::resource_exhausted(format!(
                            "connection closed by service `{}`: it held {held} blocks of the \
                             receive buffer for over {QUOTA_GRACE:?}, more than its quota of \
                             {quota}",
                            server.service
                        )));
                    }
                }
            }
        }
        // Forget connections no longer over (or gone).
        self.over.retain(|tag, _| still_over.contains(tag));
        if scrubbed != 0 {
            server.dropped.fetch_add(scrubbed, Ordering::Relaxed);
            tracing::warn!(
                "netless: service `{}`: freed {scrubbed} blocks whose tag no connection owns \
                 (a faulty client wrote them)",
                server.service
            );
        }
    }
}
