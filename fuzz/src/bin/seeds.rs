//! Writes the seed corpora of the fuzz targets, made by the real encoders, into
//! `corpus/<target>/seed-<n>` under the directory given (the fuzz crate's own by default):
//! `scripts/fuzz --seeds`.

use std::path::PathBuf;
use std::ptr::NonNull;

use netless_fuzz::Region;
use netless_ring::{ConsumerHead, ReceiveQueue, ResponseRing};

fn main() {
    let dir: PathBuf = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus"),
        PathBuf::from,
    );
    let mut seeds = netless::fuzzing::seeds();
    seeds.extend(netless_pool::fuzzing::seeds());
    seeds.extend(grpc_seeds());
    seeds.extend(ring_seeds());
    seeds.extend(memnode_seeds());
    let mut counts = std::collections::BTreeMap::new();
    for (target, bytes) in seeds {
        let n = counts.entry(target).or_insert(0);
        *n += 1;
        let target_dir = dir.join(target);
        std::fs::create_dir_all(&target_dir).expect("the corpus directory");
        std::fs::write(target_dir.join(format!("seed-{n}")), bytes).expect("a seed file");
    }
    for (target, n) in counts {
        println!("{target}: {n} seeds");
    }
}

/// Paths, timeouts, metadata, stream payloads, tokens and error messages as gRPC clients,
/// backends and netless send them.
fn grpc_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut md = netless::Metadata::new();
    md.insert("x-request-id", "42");
    md.insert("trailer/grpc-status", "5");
    md.insert("trailer/grpc-message", "no such thing");
    md.insert(":netless-session", "7");
    let mut metadata = vec![2];
    md.encode_into(&mut metadata);
    let mut stream = vec![3];
    stream.extend_from_slice(&7u64.to_le_bytes());
    stream.extend_from_slice(b"request bytes");
    [
        [&[0u8][..], b"/helloworld.Greeter/SayHello"].concat(),
        [&[0u8][..], b"kv.Store#12.sock"].concat(),
        [&[1u8][..], b"100m"].concat(),
        [&[1u8][..], b"99999999S"].concat(),
        metadata,
        stream,
        [&[0u8][..], b"/netless.ctl/Set"].concat(),
        [&[4u8][..], b"Bearer s3cret-token"].concat(),
        [
            &[5u8, 14][..],
            b"not found in /nonexistent/netless-fuzz: is its server running?",
        ]
        .concat(),
        [
            &[5u8, 14][..],
            b"at %2Fnonexistent%2Fnetless-fuzz/a.B.sock: gone",
        ]
        .concat(),
        [
            &[5u8, 7][..],
            b"uid 1000 (pid: 42) may not connect to /run/user/7/x.sock; uids [0, 7] may",
        ]
        .concat(),
    ]
    .into_iter()
    .map(|seed| ("grpc_mapping", seed))
    .collect()
}

/// A memory-node reference shaped as a node issues it (the MAC is the node's secret: any 16
/// bytes do), one of a version not known, and one cut short.
fn memnode_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut issued = b"nlmr\x01\0\0\0".to_vec();
    issued.extend_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
    issued.extend_from_slice(&7u64.to_le_bytes());
    issued.extend_from_slice(&((1u64 << 20) + 3).to_le_bytes());
    issued.extend_from_slice(&[0xa5; 16]);
    let mut other_version = issued.clone();
    other_version[4] = 2;
    let short = issued[..47].to_vec();
    [issued, other_version, short]
        .into_iter()
        .map(|seed| ("memnode_ref", seed))
        .collect()
}

/// Operation sequences of an honest ring and queue, and regions as `init` lays them out.
fn ring_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut seeds = Vec::new();
    // Push 10 and 100 bytes, peek and release both, then one more: a 16-slot ring at 0 and
    // one whose tags wrap.
    for start in [0u64, u64::from(u32::MAX) - 2] {
        let mut ops = vec![0u8, 2];
        ops.extend_from_slice(&start.to_le_bytes());
        ops.extend_from_slice(&[0, 10, 0, 0, 100, 0, 1, 1, 0, 200, 0, 2, 1]);
        seeds.push(("response_ring", ops));
    }
    // A client's ring as it hands it to the server, with a record in it.
    let nslots = 8;
    let len = ResponseRing::bytes_needed(nslots);
    let region = Region::new(len);
    // SAFETY: the region outlives both ends and is reached only through them.
    let consumer = unsafe { ResponseRing::init(region.ptr(), len, nslots) }.expect("a ring");
    // SAFETY: the same region, alive and `len` bytes long past both ends; this is the
    // ring's one producer, the consumer above its one consumer.
    let mut producer = unsafe { ResponseRing::attach(region.ptr(), len) }.expect("a ring");
    producer.try_push(&[b"a record"]).expect("room");
    drop(consumer);
    seeds.push(("response_ring", region_seed(&region)));

    // Enqueue three, dequeue each way, repair: an 8-cell queue.
    let mut ops = vec![0u8, 2];
    for value in [1u32, 2, 3] {
        ops.push(0);
        ops.extend_from_slice(&value.to_le_bytes());
    }
    ops.extend_from_slice(&[1, 2, 0x83, 5, 4]);
    seeds.push(("receive_queue", ops));
    let capacity = 8;
    let len = ReceiveQueue::bytes_needed(capacity);
    let region = Region::new(len);
    // SAFETY: the region outlives the view and is reached only through it.
    let queue = unsafe { ReceiveQueue::init(region.ptr(), len, capacity) }.expect("a queue");
    queue.try_enqueue(5).expect("room");
    let _ = queue.try_dequeue(&ConsumerHead::new());
    queue.try_enqueue(6).expect("room");
    seeds.push(("receive_queue", region_seed(&region)));
    seeds
}

/// A target's attach form (`form` 1): the region's length and bytes.
fn region_seed(region: &Region) -> Vec<u8> {
    let mut seed = vec![1u8];
    seed.extend_from_slice(&(region.len() as u16).to_le_bytes());
    let ptr: NonNull<u8> = region.ptr();
    // SAFETY: the region's bytes, read while nothing writes them.
    seed.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), region.len()) });
    seed
}
