//! Liveness tokens: a process proves it is alive by holding one byte of a shared lock file
//! locked, with an open file description lock (`F_OFD_SETLK`), for as long as it keeps that
//! file open.
//!
//! The kernel releases the lock when the last descriptor of that open file goes, so at the
//! latest when the process dies, however it dies; and any process that opened the same file
//! can ask whether the byte is still locked (`F_OFD_GETLK`), whatever pid namespace either
//! lives in, with no pid to translate and none that can be reused. The byte's offset is the
//! token. A child forked without `exec` shares the open file (and its mappings), so the
//! token stays held while it runs; `exec` closes the descriptor (it is close-on-exec) along
//! with the mappings. A token's holder locks exactly its byte, shared; a lock over other
//! bytes too, or an exclusive one, is someone else's doing, and the answer then says so
//! ([`TokenLock::Covered`]) rather than pass it off as the holder's. This module owns those
//! calls; it never chooses tokens or decides what a dead holder's resources are.

use std::fs::File;
use std::os::fd::AsRawFd;

use crate::Error;

/// The largest token: a byte offset well inside `off_t`.
pub const MAX_LIVENESS_TOKEN: u64 = (1 << 62) - 1;

/// Holds byte `token` of `file` (which must be open for reading) with a shared lock for as long
/// as this open file stays open. Other holders of other tokens, and of the same one, do not
/// conflict.
///
/// # Errors
/// [`Error::Io`] if `token` is 0 or above [`MAX_LIVENESS_TOKEN`], or the file system has no
/// such locks.
///
/// ```
/// let path = std::env::temp_dir().join(format!("netless-doc-token-{}", std::process::id()));
/// std::fs::write(&path, b"").unwrap();
/// let file = std::fs::File::open(&path).unwrap();
/// netless_shm::hold_liveness_token(&file, 42)?;
/// let other = std::fs::File::open(&path).unwrap(); // another open file: as another process
/// assert!(netless_shm::liveness_token_held(&other, 42)?);
/// assert!(!netless_shm::liveness_token_held(&other, 43)?);
/// drop(file);
/// assert!(!netless_shm::liveness_token_held(&other, 42)?);
/// # std::fs::remove_file(path).ok();
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn hold_liveness_token(file: &File, token: u64) -> Result<(), Error> {
    let mut lock = byte_lock(token, libc::F_RDLCK)?;
    fcntl_lock(
        file,
        libc::F_OFD_SETLK,
        &mut lock,
        "F_OFD_SETLK of a liveness token",
    )
}

/// Whether some open file other than `file` holds byte `token` of the same file locked: the
/// token's holder still runs (or someone covers its byte: see [`liveness_token_lock`]).
///
/// # Errors
/// [`Error::Io`] if `token` is out of range or the query fails.
pub fn liveness_token_held(file: &File, token: u64) -> Result<bool, Error> {
    Ok(liveness_token_lock(file, token)? != TokenLock::Free)
}

/// What locks byte `token` of `file`, as another open file than `file` holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenLock {
    /// Nothing: nobody holds the token.
    Free,
    /// A shared lock of exactly that byte, as [`hold_liveness_token`] takes it: the token's
    /// holder.
    Held,
    /// A lock that no token's holder takes (one that spans other bytes too, or an exclusive
    /// one) covers the byte. Whoever can open the file is interfering, and whether the
    /// token's holder is there as well cannot be told: the kernel names one conflicting
    /// lock, the first it finds.
    Covered,
}

/// What locks byte `token` of `file` (see [`TokenLock`]).
///
/// # Errors
/// [`Error::Io`] if `token` is out of range or the query fails.
///
/// ```
/// use netless_shm::TokenLock;
///
/// let path = std::env::temp_dir().join(format!("netless-doc-lock-{}", std::process::id()));
/// std::fs::write(&path, b"").unwrap();
/// let holder = std::fs::File::open(&path).unwrap();
/// let other = std::fs::File::open(&path).unwrap();
/// netless_shm::hold_liveness_token(&holder, 7)?;
/// assert_eq!(netless_shm::liveness_token_lock(&other, 7)?, TokenLock::Held);
/// assert_eq!(netless_shm::liveness_token_lock(&other, 8)?, TokenLock::Free);
/// # std::fs::remove_file(path).ok();
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn liveness_token_lock(file: &File, token: u64) -> Result<TokenLock, Error> {
    let mut lock = byte_lock(token, libc::F_WRLCK)?;
    fcntl_lock(
        file,
        libc::F_OFD_GETLK,
        &mut lock,
        "F_OFD_GETLK of a liveness token",
    )?;
    Ok(match lock.l_type as libc::c_int {
        libc::F_UNLCK => TokenLock::Free,
        libc::F_RDLCK if lock.l_start == token as libc::off_t && lock.l_len == 1 => TokenLock::Held,
        _ => TokenLock::Covered,
    })
}

/// A lock of type `kind` on byte `token`.
fn byte_lock(token: u64, kind: libc::c_int) -> Result<libc::flock, Error> {
    if token == 0 || token > MAX_LIVENESS_TOKEN {
        return Err(Error::Io {
            op: "a liveness token",
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("token {token} is outside 1..={MAX_LIVENESS_TOKEN}"),
            ),
        });
    }
    // SAFETY: `flock` is a plain C struct of integers, for which all zeroes is valid.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = token as libc::off_t;
    lock.l_len = 1;
    // Open file description locks require l_pid 0.
    lock.l_pid = 0;
    Ok(lock)
}

/// Locks byte `byte` of `file` (open for writing) exclusively, waiting at most `timeout` for
/// another open file to let go of it: a mutex between the processes of one kernel, in any
/// namespace, held until `file` closes (or its holder dies).
#[cfg(not(loom))]
pub(crate) fn lock_byte_exclusive(
    file: &File,
    byte: u64,
    timeout: std::time::Duration,
) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let mut lock = byte_lock(byte, libc::F_WRLCK)?;
        match fcntl_lock(file, libc::F_OFD_SETLK, &mut lock, "F_OFD_SETLK (F_WRLCK)") {
            Ok(()) => return Ok(()),
            Err(Error::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::EAGAIN | libc::EACCES))
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}

fn fcntl_lock(
    file: &File,
    command: libc::c_int,
    lock: &mut libc::flock,
    op: &'static str,
) -> Result<(), Error> {
    loop {
        // SAFETY: the descriptor is open for the call (borrowed from `file`), and `lock`
        // points to a live, initialised `flock` that the kernel reads and (GETLK) writes.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), command, lock as *mut libc::flock) };
        if r != -1 {
            return Ok(());
        }
        let source = std::io::Error::last_os_error();
        if source.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::Io { op, source });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes a shared lock of `len` bytes from `start` (0: to the end of the file, and
    /// beyond) on `file`, as an interfering process would.
    fn lock_range(file: &File, start: u64, len: u64) {
        let mut lock = byte_lock(1, libc::F_RDLCK).unwrap();
        lock.l_start = start as libc::off_t;
        lock.l_len = len as libc::off_t;
        fcntl_lock(file, libc::F_OFD_SETLK, &mut lock, "F_OFD_SETLK of a range").unwrap();
    }

    #[test]
    fn a_lock_over_more_than_the_token_is_told_from_the_holders() {
        let path = std::env::temp_dir().join(format!("netless-covered-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let open = || File::open(&path).unwrap();
        let (holder, interferer, asker) = (open(), open(), open());
        hold_liveness_token(&holder, 5).unwrap();
        assert_eq!(liveness_token_lock(&asker, 5).unwrap(), TokenLock::Held);
        // Every token from 1 on, as one lock. The holder's own lock is still found (the
        // kernel reports the first conflicting lock, and the holder's came first), but no
        // other token passes for held, and once the holder is gone, neither does its own.
        lock_range(&interferer, 1, 0);
        assert_eq!(liveness_token_lock(&asker, 5).unwrap(), TokenLock::Held);
        for token in [6, MAX_LIVENESS_TOKEN] {
            assert_eq!(
                liveness_token_lock(&asker, token).unwrap(),
                TokenLock::Covered,
                "token {token}"
            );
        }
        drop(holder);
        assert_eq!(liveness_token_lock(&asker, 5).unwrap(), TokenLock::Covered);
        // An exclusive lock of exactly one byte is no token's either.
        drop(interferer);
        assert_eq!(liveness_token_lock(&asker, 5).unwrap(), TokenLock::Free);
        let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut lock = byte_lock(5, libc::F_WRLCK).unwrap();
        fcntl_lock(&writer, libc::F_OFD_SETLK, &mut lock, "F_OFD_SETLK").unwrap();
        assert_eq!(liveness_token_lock(&asker, 5).unwrap(), TokenLock::Covered);
        std::fs::remove_file(&path).ok();
    }
}
