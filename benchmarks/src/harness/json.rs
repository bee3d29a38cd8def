//! The benchmarks' JSON files: the machine the figures were taken on ([`Machine`]) and the
//! writing of a document ([`write()`]). The field names and the shape of each document are
//! the benchmark's (other tools read them); this module never renames or reorders a field.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

/// The machine the figures were taken on, read from `/proc`.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Machine {
    /// `model name` of the first CPU in `/proc/cpuinfo`, or `unknown`.
    pub cpu_model: String,
    /// Number of online CPUs (`processor` entries in `/proc/cpuinfo`).
    pub nproc: usize,
    /// Kernel release (`/proc/sys/kernel/osrelease`), or `unknown`.
    pub kernel: String,
}

impl Machine {
    /// Reads the current machine's description. Never fails: missing fields are `unknown`.
    pub fn current() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".to_string(), |(_, v)| v.trim().to_string());
        // Online CPUs of the machine, not of this thread (which may be pinned).
        let nproc = Some(
            cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
        )
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        Machine {
            cpu_model,
            nproc,
            kernel,
        }
    }
}

/// Writes `doc` pretty printed, with a final newline, to `path`, synced to disk, and says
/// so on stderr.
pub fn write(path: &Path, doc: &impl Serialize) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(doc)?;
    text.push('\n');
    let mut file =
        std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_document_as_given() {
        #[derive(Serialize)]
        struct Doc {
            experiment: &'static str,
            machine: Machine,
        }
        let path = std::env::temp_dir().join(format!("netless-json-{}.json", std::process::id()));
        let doc = Doc {
            experiment: "x",
            machine: Machine::current(),
        };
        write(&path, &doc).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(text.ends_with("}\n"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["experiment"], "x");
        assert!(v["machine"]["nproc"].as_u64().is_some_and(|n| n > 0));
        assert!(
            text.find("\"experiment\"") < text.find("\"machine\""),
            "{text}"
        );
    }
}
