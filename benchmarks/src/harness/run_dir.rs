//! A run's private socket directory ([`RunDir`]): where its servers' sockets and its domain
//! live, so that two runs (or a run and the user's services) never meet. It never decides
//! what goes in it.

use std::path::PathBuf;

use anyhow::Context as _;

/// A benchmark run's private socket directory (mode 0700, under the user's netless socket
/// directory, named `TAG-PID`), removed on drop. Short: socket paths must fit in 108 bytes.
#[derive(Debug)]
pub struct RunDir {
    /// The directory.
    pub path: PathBuf,
}

impl RunDir {
    /// Creates `TAG-PID` afresh (removing what a killed run of the same pid left).
    pub fn create(tag: &str) -> anyhow::Result<RunDir> {
        use std::os::unix::fs::DirBuilderExt as _;
        let path = netless_shm::socket_dir()?.join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(RunDir { path })
    }

    /// The path as UTF-8, to pass to a peer's command line.
    pub fn to_str(&self) -> anyhow::Result<&str> {
        self.path.to_str().context("socket directory is not UTF-8")
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
