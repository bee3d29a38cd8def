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
//! with the mappings. This module owns those two calls; it never chooses tokens or decides
//! what a dead holder's resources are.

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
/// token's holder still runs.
///
/// # Errors
/// [`Error::Io`] if `token` is out of range or the query fails.
pub fn liveness_token_held(file: &File, token: u64) -> Result<bool, Error> {
    let mut lock = byte_lock(token, libc::F_WRLCK)?;
    fcntl_lock(
        file,
        libc::F_OFD_GETLK,
        &mut lock,
        "F_OFD_GETLK of a liveness token",
    )?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
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
