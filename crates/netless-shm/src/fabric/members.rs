//! The member table: who is in the fabric, and whether they still are.
//!
//! A member claims a free slot (one compare-and-swap on its state word), then beats: it
//! bumps its heartbeat word every tick. Another member judges it alive while its state
//! names the generation it knows and, on the same kernel (the same boot id), while the
//! member holds its liveness token (a lock byte of the fabric file that the kernel drops
//! when it dies, in any namespace); across kernels, while its heartbeat moved within the
//! lease. Observers keep their own clock of when they last saw a heartbeat move, so no two
//! hosts need synchronised clocks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::layout::{Geometry, Words, LINE, MEMBERS};
use crate::sync::Ordering;

// Words of a member slot. Line 0 is the member's own; the state word (line 1) is the one
// others swap (joining, reclaiming).
pub(crate) const M_HEARTBEAT: usize = 0;
pub(crate) const M_BOOT_ID: usize = 8;
pub(crate) const M_PID_UID: usize = 24;
pub(crate) const M_LEASE_NS: usize = 32;
pub(crate) const M_STATE: usize = LINE;

/// Phases in the low byte of a state word; the generation is above it.
pub(crate) const FREE: u64 = 0;
pub(crate) const LIVE: u64 = 1;
pub(crate) const LEFT: u64 = 2;
pub(crate) const RECLAIMING: u64 = 3;

/// Liveness tokens of members are these bytes of the fabric file, past any region's end.
pub(crate) const TOKEN_BASE: u64 = 1 << 50;

/// One occupancy of a member slot: its index and the generation it was claimed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemberId {
    /// Slot index, below [`MEMBERS`].
    pub index: u32,
    /// Generation of the slot's occupancy (low 32 bits).
    pub generation: u32,
}

impl MemberId {
    /// The owner word the unit table and directory store for this member.
    pub(crate) fn owner_word(self) -> u64 {
        (u64::from(self.generation) << 32) | (u64::from(self.index) + 1)
    }

    /// The member an owner word names, if it names one.
    pub(crate) fn from_owner_word(word: u64) -> Option<MemberId> {
        let low = (word & 0xffff_ffff) as u32;
        (low >= 1 && (low as usize) <= MEMBERS).then(|| MemberId {
            index: low - 1,
            generation: (word >> 32) as u32,
        })
    }

    pub(crate) fn token(self) -> u64 {
        TOKEN_BASE + u64::from(self.index)
    }
}

/// A member slot as its words say now (for tools; nothing here is trusted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberSlot {
    /// The occupancy.
    pub id: MemberId,
    /// `live`, `left` (gone, its memory not yet reclaimed) or `reclaiming`.
    pub state: &'static str,
    /// The process id it wrote when it joined, in its own pid namespace.
    pub pid: u32,
    /// The effective uid it wrote when it joined, in its own user namespace.
    pub uid: u32,
    /// Its heartbeat count.
    pub heartbeat: u64,
}

/// The slots not free now.
pub(crate) fn occupied(words: &Words, g: &Geometry) -> Vec<MemberSlot> {
    (0..MEMBERS)
        .filter_map(|index| {
            let slot = g.member(index);
            let s = words.word(slot + M_STATE).load(Ordering::Acquire);
            let state = match phase(s) {
                LIVE => "live",
                LEFT => "left",
                RECLAIMING => "reclaiming",
                _ => return None,
            };
            let pid_uid = words.word(slot + M_PID_UID).load(Ordering::Relaxed);
            Some(MemberSlot {
                id: MemberId {
                    index: index as u32,
                    generation: generation(s),
                },
                state,
                pid: pid_uid as u32,
                uid: (pid_uid >> 32) as u32,
                heartbeat: words.word(slot + M_HEARTBEAT).load(Ordering::Relaxed),
            })
        })
        .collect()
}

pub(crate) fn phase(state: u64) -> u64 {
    state & 0xff
}

pub(crate) fn generation(state: u64) -> u32 {
    (state >> 8) as u32
}

/// What a member knows of the others: when each one's heartbeat last moved, by its own
/// clock, and since when it has thought one dead.
#[derive(Debug, Default)]
pub(crate) struct Observer {
    seen: HashMap<MemberId, (u64, Instant)>,
    dead_since: HashMap<MemberId, Instant>,
}

/// What the observer needs to judge a member.
pub(crate) struct Judge<'a> {
    pub(crate) words: &'a Words,
    pub(crate) geometry: &'a Geometry,
    pub(crate) boot_id: [u8; 16],
    pub(crate) lease: Duration,
    /// An open file of the region, to ask whether a member's liveness token is held.
    pub(crate) token_file: &'a std::fs::File,
}

impl Observer {
    /// Whether `member` is alive now.
    pub(crate) fn alive(&mut self, judge: &Judge<'_>, member: MemberId) -> bool {
        let alive = self.judge(judge, member);
        if alive {
            self.dead_since.remove(&member);
        } else if names(judge, member) {
            self.dead_since.entry(member).or_insert_with(Instant::now);
        } else {
            // Not (or no longer) the slot's occupant: nothing to remember, however many
            // made-up ids the region's words name.
            self.forget(member);
        }
        alive
    }

    fn judge(&mut self, judge: &Judge<'_>, member: MemberId) -> bool {
        if member.index as usize >= MEMBERS {
            return false;
        }
        let slot = judge.geometry.member(member.index as usize);
        let state = judge.words.word(slot + M_STATE).load(Ordering::Acquire);
        if phase(state) != LIVE || generation(state) != member.generation {
            return false;
        }
        if read_boot_id(judge.words, slot) == judge.boot_id {
            // One kernel: the lock it holds is proof either way, however slowly it beats.
            if let Ok(held) = crate::liveness_token_held(judge.token_file, member.token()) {
                return held;
            }
        }
        let beat = judge.words.load(slot + M_HEARTBEAT);
        let now = Instant::now();
        let (last, since) = self.seen.entry(member).or_insert((beat, now));
        if *last != beat {
            *last = beat;
            *since = now;
        }
        now.duration_since(*since) < judge.lease
    }

    /// How long `member` has been known dead here, if it is.
    pub(crate) fn dead_for(&self, member: MemberId) -> Option<Duration> {
        self.dead_since.get(&member).map(Instant::elapsed)
    }

    /// Forgets a member whose slot was reclaimed.
    pub(crate) fn forget(&mut self, member: MemberId) {
        self.seen.remove(&member);
        self.dead_since.remove(&member);
    }
}

/// Whether `member`'s slot is occupied by it (alive, left or being reclaimed).
fn names(judge: &Judge<'_>, member: MemberId) -> bool {
    if member.index as usize >= MEMBERS {
        return false;
    }
    let slot = judge.geometry.member(member.index as usize);
    let state = judge.words.word(slot + M_STATE).load(Ordering::Acquire);
    phase(state) != FREE && generation(state) == member.generation
}

pub(crate) fn read_boot_id(words: &Words, slot: usize) -> [u8; 16] {
    let mut id = [0u8; 16];
    words.read(slot + M_BOOT_ID, &mut id);
    id
}

/// A boot id no kernel has (for a member that plays another host).
pub(crate) fn random_boot_id() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut id = [0u8; 16];
    for half in id.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    id
}

/// This kernel's boot id (random per boot, the same in every namespace), or zeros.
pub(crate) fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: Vec<u8> = text
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .map(|c| match c {
            b'0'..=b'9' => c - b'0',
            _ => (c | 0x20) - b'a' + 10,
        })
        .collect();
    let mut id = [0u8; 16];
    if hex.len() == 32 {
        for (i, b) in id.iter_mut().enumerate() {
            *b = (hex[2 * i] << 4) | hex[2 * i + 1];
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_words_round_trip_and_zero_names_nobody() {
        let m = MemberId {
            index: 63,
            generation: 0xdead_beef,
        };
        assert_eq!(MemberId::from_owner_word(m.owner_word()), Some(m));
        assert_eq!(MemberId::from_owner_word(0), None);
        assert_eq!(MemberId::from_owner_word(65), None);
    }

    #[test]
    fn a_member_of_another_kernel_lives_while_it_beats_and_dies_a_lease_after() {
        let mut region = vec![0u64; (super::super::layout::MIN_SIZE / 8) as usize];
        let g = Geometry::of(super::super::layout::MIN_SIZE).unwrap();
        // SAFETY: the vector outlives `words` and is 8-aligned; only this thread uses it.
        let words = unsafe { Words::new(region.as_mut_ptr().cast(), region.len() * 8, None) };
        let member = MemberId {
            index: 3,
            generation: 7,
        };
        let slot = g.member(3);
        words
            .word(slot + M_STATE)
            .store((7 << 8) | LIVE, Ordering::Relaxed);
        words.write(slot + M_BOOT_ID, &[0xee; 16]);
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let judge = Judge {
            words: &words,
            geometry: &g,
            boot_id: boot_id(),
            lease: Duration::from_millis(100),
            token_file: &file,
        };
        let mut observer = Observer::default();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            words.store(slot + M_HEARTBEAT, words.load(slot + M_HEARTBEAT) + 1);
            assert!(observer.alive(&judge, member), "it beats");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(observer.alive(&judge, member), "within its lease");
        std::thread::sleep(Duration::from_millis(150));
        assert!(!observer.alive(&judge, member), "a lease without a beat");
        assert!(observer.dead_for(member).is_some());
        let other_generation = MemberId {
            index: 3,
            generation: 8,
        };
        assert!(!observer.alive(&judge, other_generation));
    }

    #[test]
    fn boot_id_is_read() {
        assert_ne!(boot_id(), [0u8; 16]);
    }
}
