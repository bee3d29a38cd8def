use std::time::{Duration, Instant};

use super::*;
use crate::Segment;

fn segment(len: usize) -> Segment {
    Segment::create("coherence-test", len).unwrap()
}

#[test]
fn coherence_parses_and_displays_its_names() {
    for mode in [Coherence::Hardware, Coherence::Software] {
        assert_eq!(mode.to_string().parse::<Coherence>(), Ok(mode));
    }
    assert_eq!(Coherence::default(), Coherence::Hardware);
    let err = "Software".parse::<Coherence>().unwrap_err();
    assert!(err.to_string().contains("\"Software\""), "{err}");
}

#[test]
fn lines_cover_exactly_the_range() {
    assert_eq!(lines(0, 0), 0..0);
    assert_eq!(lines(100, 0), 0..0);
    assert_eq!(lines(0, 1), 0..1);
    assert_eq!(lines(63, 2), 0..2);
    assert_eq!(lines(64, 64), 1..2);
    assert_eq!(lines(65, 64), 1..3);
}

fn refuses_outside_accesses(view: &mut View<'_>) {
    let len = view.len();
    let mut two = [0; 2];
    let out = |offset, len2| ViewError::OutOfBounds {
        offset,
        len: len2,
        region: len,
    };
    assert_eq!(view.read(len - 1, &mut two), Err(out(len - 1, 2)));
    assert_eq!(view.write(len, &[1]), Err(out(len, 1)));
    assert_eq!(view.write(usize::MAX, &[1]), Err(out(usize::MAX, 1)));
    assert_eq!(view.load_u64(len), Err(out(len, 8)));
    assert_eq!(view.store_u64(len - 8, 1), Ok(()));
    assert_eq!(
        view.store_u64(12, 1),
        Err(ViewError::Misaligned { offset: 12 })
    );
    assert_eq!(view.load_u64(usize::MAX - 7), Err(out(usize::MAX - 7, 8)));
    assert_eq!(view.flush(len - 8, 9), Err(out(len - 8, 9)));
    assert_eq!(view.invalidate(1, usize::MAX), Err(out(1, usize::MAX)));
    assert_eq!(view.flush(len, 0), Ok(()));
    assert_eq!(view.read(len, &mut []), Ok(()));
}

#[test]
fn accesses_outside_a_view_are_errors() {
    let segment = segment(4096);
    for coherence in [Coherence::Hardware, Coherence::Software] {
        refuses_outside_accesses(&mut Direct::of_segment(&segment, coherence).unwrap().into());
    }
    refuses_outside_accesses(&mut Emulated::of_segment(&segment).unwrap().into());
}

#[test]
fn regions_that_are_not_whole_lines_are_refused() {
    let segment = segment(4096);
    let bad = |addr: *mut u8, len| ViewError::BadRegion {
        addr: addr as usize,
        len,
    };
    // SAFETY: every range is inside the segment's mapping, which outlives the views.
    unsafe {
        let base = segment.as_ptr();
        let misaligned = base.add(8);
        assert_eq!(
            Direct::from_raw(misaligned, 64, Coherence::Software).unwrap_err(),
            bad(misaligned, 64)
        );
        assert_eq!(Emulated::from_raw(base, 100).unwrap_err(), bad(base, 100));
        assert_eq!(
            Direct::from_raw(base, 0, Coherence::Hardware).unwrap_err(),
            bad(base, 0)
        );
        assert_eq!(
            Direct::from_raw(base, 128, Coherence::Hardware)
                .unwrap()
                .len(),
            128
        );
    }
    let odd = Segment::create("coherence-odd", 100).unwrap();
    assert!(Emulated::of_segment(&odd).is_err());
}

#[test]
fn a_direct_software_view_flushes_and_invalidates_real_memory() {
    let segment = segment(1 << 16);
    let mut writer = Direct::of_segment(&segment, Coherence::Software).unwrap();
    let mut reader = Direct::of_segment(&segment, Coherence::Software).unwrap();
    // Every line, at every alignment a flush or invalidation may start and end at.
    let bytes: Vec<u8> = (0..segment.len()).map(|i| (i * 7 + 3) as u8).collect();
    writer.write(0, &bytes).unwrap();
    writer.flush(0, bytes.len()).unwrap();
    writer.flush(1, 200).unwrap();
    writer.store_u64(8, u64::MAX - 1).unwrap();
    writer.flush(8, 8).unwrap();
    reader.invalidate(0, bytes.len()).unwrap();
    reader.invalidate(63, 2).unwrap();
    reader.fence();
    assert_eq!(reader.load_u64(8).unwrap(), u64::MAX - 1);
    let mut back = vec![0; bytes.len()];
    reader.read(0, &mut back).unwrap();
    assert_eq!(back[16..], bytes[16..]);
    #[cfg(target_arch = "x86_64")]
    assert_ne!(writer.flush_instruction(), FlushInstruction::FenceOnly);
}

#[test]
fn an_emulated_host_reads_stale_lines_until_it_invalidates_them() {
    let segment = segment(4096);
    let mut a = Emulated::of_segment(&segment).unwrap();
    let mut b = Emulated::of_segment(&segment).unwrap();
    a.write(100, b"fresh").unwrap();
    let mut got = [0; 5];
    b.read(100, &mut got).unwrap();
    assert_eq!(got, [0; 5], "a's write is still in a's cache");
    a.flush(100, 5).unwrap();
    b.read(100, &mut got).unwrap();
    assert_eq!(got, [0; 5], "b has not invalidated its line");
    b.invalidate(64, 1).unwrap();
    b.read(100, &mut got).unwrap();
    assert_eq!(&got, b"fresh");
    // A view made now starts from the shared region as it is.
    let c = Emulated::of_segment(&segment).unwrap();
    c.read(100, &mut got).unwrap();
    assert_eq!(&got, b"fresh");
}

#[test]
fn an_emulated_flush_writes_back_whole_lines_clobbering_other_hosts() {
    let segment = segment(4096);
    let mut a = Emulated::of_segment(&segment).unwrap();
    let mut b = Emulated::of_segment(&segment).unwrap();
    let mut reader = Emulated::of_segment(&segment).unwrap();
    a.store_u64(0, 1).unwrap();
    b.store_u64(8, 2).unwrap();
    a.flush(0, 8).unwrap();
    b.flush(8, 8).unwrap();
    reader.invalidate(0, 16).unwrap();
    assert_eq!(reader.load_u64(8).unwrap(), 2);
    assert_eq!(
        reader.load_u64(0).unwrap(),
        0,
        "b's write-back of the line lost a's word"
    );
    // Words on another line survive.
    a.store_u64(64, 3).unwrap();
    a.flush(64, 8).unwrap();
    b.flush(0, 8).unwrap();
    reader.invalidate(0, 128).unwrap();
    assert_eq!(reader.load_u64(64).unwrap(), 3);
}

#[test]
fn an_emulated_invalidation_discards_unflushed_writes() {
    let segment = segment(4096);
    let mut a = Emulated::of_segment(&segment).unwrap();
    a.store_u64(0, 9).unwrap();
    a.invalidate(0, 8).unwrap();
    assert_eq!(a.load_u64(0).unwrap(), 0);
}

#[test]
fn emulated_faults_leave_out_flushes_and_invalidations() {
    let segment = segment(4096);
    let mut a = Emulated::of_segment(&segment).unwrap();
    let mut b = Emulated::of_segment(&segment).unwrap();
    a.set_faults(Faults {
        skip_flush: true,
        skip_invalidate: false,
    });
    a.store_u64(0, 5).unwrap();
    a.flush(0, 8).unwrap();
    b.invalidate(0, 8).unwrap();
    assert_eq!(b.load_u64(0).unwrap(), 0, "the flush was left out");

    a.set_faults(Faults::default());
    a.flush(0, 8).unwrap();
    b.set_faults(Faults {
        skip_flush: false,
        skip_invalidate: true,
    });
    assert!(b.faults().skip_invalidate);
    b.invalidate(0, 8).unwrap();
    assert_eq!(b.load_u64(0).unwrap(), 0, "the invalidation was left out");
    b.set_faults(Faults::default());
    b.invalidate(0, 8).unwrap();
    assert_eq!(b.load_u64(0).unwrap(), 5);
}

#[test]
fn emulated_hosts_on_two_threads_see_what_is_flushed() {
    const ROUNDS: u64 = if cfg!(miri) { 20 } else { 2000 };
    let segment = segment(4096);
    let mut writer: View<'_> = Emulated::of_segment(&segment).unwrap().into();
    let mut reader: View<'_> = Emulated::of_segment(&segment).unwrap().into();
    std::thread::scope(|s| {
        s.spawn(move || {
            for i in 1..=ROUNDS {
                writer.write(128, &i.to_le_bytes()).unwrap();
                writer.flush(128, 8).unwrap();
                writer.store_u64(0, i).unwrap();
                writer.flush(0, 8).unwrap();
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while seen < ROUNDS {
            assert!(Instant::now() < deadline, "the reader saw only {seen}");
            reader.invalidate(0, 8).unwrap();
            let published = reader.load_u64(0).unwrap();
            assert!(published >= seen);
            reader.invalidate(128, 8).unwrap();
            let mut data = [0; 8];
            reader.read(128, &mut data).unwrap();
            // Data flushed before the index is never older than the index.
            assert!(u64::from_le_bytes(data) >= published);
            seen = published;
        }
    });
}
