//! The domain page pool of netless: 4 KiB pages in shared memory that processes of one
//! domain pass to each other by reference, with page-level copy-on-write (DmRPC).
//!
//! A [`Domain`] is this process's membership of a named domain. The first process to join
//! founds it (creates the pool and serves the domain's socket; no daemon needed); the others
//! receive the pool over that socket. [`SharedBuf`] is an owned buffer of pool pages;
//! [`SharedBuf::share`] makes a 32-byte [`Ref`] that any message can carry and any process
//! can forward without touching the data; [`Domain::map`] turns it back into a buffer that
//! reads the same pages in place. The DmRPC calls (`ralloc`, `rfree`, `create_ref`, `map_ref`,
//! `rread`, `rwrite`) are methods of [`Domain`].
//!
//! No page leaks: which members hold each page is recorded in the pool, so when a member dies
//! (any signal) the coordinator sees its socket close and releases its pages and Refs.
//!
//! ```
//! use netless_pool::{Domain, DomainConfig};
//!
//! let dir = std::env::temp_dir().join(format!("nl-pool-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let mut config = DomainConfig::new("doc");
//! config.dir = Some(dir.clone());
//! let domain = Domain::join(&config)?;
//! let buf = domain.alloc_from(b"a large argument")?;
//! let r = buf.share()?;                    // send r.to_bytes() in any message
//! let received = domain.map(&r)?;          // in the receiving process
//! assert_eq!(received.to_vec(), b"a large argument");
//! # drop((buf, received, domain)); std::fs::remove_dir_all(dir).ok();
//! # Ok::<(), netless_pool::PoolError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod buf;
mod coordinator;
mod domain;
mod error;
mod fabric;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod layout;
mod members;
mod pages;
mod peer;
mod refs;
mod view;

pub use buf::SharedBuf;
pub use domain::{Domain, DomainConfig, PoolStats, RAddr, MAX_LOCAL_REFS};
pub use error::PoolError;
pub use layout::{PoolGeometry, MAX_MEMBERS, MAX_REF_BYTES, PAGE_SIZE};
pub use peer::{MemberClaim, PeerMember};
pub use refs::Ref;
pub use view::PagesView;

impl Domain {
    /// Joins the domain `config.name` in the socket directory, founding it (and coordinating
    /// it from a thread of this process) if nobody does yet.
    ///
    /// # Errors
    /// [`PoolError::Join`] if the coordinator refuses us (ACL, domain full), or none
    /// finishes its handshake with us within `join_timeout` (and this process may not found
    /// the domain, or members are alive); [`PoolError::Shm`] for socket or memfd failures.
    pub fn join(config: &DomainConfig) -> Result<Domain, PoolError> {
        coordinator::join(config)
    }

    /// A domain of this process alone: a pool no other process can join (no socket). For
    /// tests and single-process use.
    pub fn private(geometry: PoolGeometry) -> Result<Domain, PoolError> {
        let map = std::sync::Arc::new(layout::PoolMap::create(geometry, 0)?);
        let member = 0;
        members::claim_private_row(&map, member);
        let pid_ns = members::pid_namespace();
        Ok(Domain::from_parts(
            map,
            member,
            &DomainConfig::new("private"),
            None,
            members::Tokens::private(),
            pid_ns,
        ))
    }
}
