//! A chart archive (`.tgz`) unpacked for `helm template`, confined like a
//! Git tree: only regular files and directories, every path inside the
//! target (no absolute path, no `..`), within a size limit for the whole
//! unpacked tree and a limit on the number of entries. The chart is the one
//! top-level directory the archive holds.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// What an archive may unpack to.
#[derive(Clone, Copy, Debug)]
pub struct UnpackLimits {
    pub max_bytes: u64,
    pub max_entries: usize,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_bytes: 64 * 1024 * 1024,
            max_entries: 10_000,
        }
    }
}

/// `sha256:<hex>` of `bytes`'s hex part.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Unpacks `archive` under `into` and returns the chart's directory.
pub fn unpack(archive: &[u8], into: &Path, limits: UnpackLimits) -> Result<PathBuf, String> {
    let gzip = flate2::read::GzDecoder::new(archive);
    // The decompressed stream is bounded too (a gzip bomb stops here).
    let mut tar = tar::Archive::new(gzip.take(limits.max_bytes + 1024 * 1024));
    let mut total: u64 = 0;
    let mut top: Option<String> = None;
    let entries = tar
        .entries()
        .map_err(|e| format!("not a tar archive: {e}"))?;
    for (n, entry) in entries.enumerate() {
        if n >= limits.max_entries {
            return Err(format!("more than {} entries", limits.max_entries));
        }
        let mut entry = entry.map_err(|e| format!("unreadable entry: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("unreadable path: {e}"))?
            .into_owned();
        let shown = path.display().to_string();
        if path
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!("{shown}: leaves the archive"));
        }
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            continue;
        }
        let Some(Component::Normal(first)) =
            path.components().find(|c| !matches!(c, Component::CurDir))
        else {
            continue;
        };
        let first = first.to_string_lossy().to_string();
        match &top {
            None => top = Some(first),
            Some(top) if *top != first => {
                return Err(format!("{shown}: outside the chart's directory {top}"));
            }
            Some(_) => {}
        }
        let target = into.join(&path);
        if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(|e| format!("{shown}: {e}"))?;
            continue;
        }
        if !kind.is_file() {
            return Err(format!(
                "{shown}: a {} (only files and directories are unpacked)",
                describe(kind)
            ));
        }
        total += entry.size();
        if total > limits.max_bytes {
            return Err(format!("unpacks to more than {} bytes", limits.max_bytes));
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{shown}: {e}"))?;
        }
        let mut contents = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut contents)
            .map_err(|e| format!("{shown}: {e}"))?;
        std::fs::write(&target, contents).map_err(|e| format!("{shown}: {e}"))?;
    }
    let top = top.ok_or("the archive is empty")?;
    let chart = into.join(&top);
    if !chart.join("Chart.yaml").is_file() {
        return Err(format!("{top}/Chart.yaml is missing"));
    }
    Ok(chart)
}

fn describe(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Symlink => "symlink",
        tar::EntryType::Link => "hard link",
        tar::EntryType::Char | tar::EntryType::Block => "device",
        tar::EntryType::Fifo => "fifo",
        _ => "special entry",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        let tar = builder.into_inner().unwrap();
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gzip, &tar).unwrap();
        gzip.finish().unwrap()
    }

    fn file(builder: &mut tar::Builder<Vec<u8>>, path: &str, contents: &[u8]) {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        // `append_data` refuses `..`; the raw name reaches the reader as is.
        header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, contents).unwrap();
    }

    #[test]
    fn a_chart_unpacks_to_its_directory() {
        let bytes = archive(|b| {
            file(b, "web/Chart.yaml", b"name: web\nversion: 1.0.0\n");
            file(b, "web/templates/cm.yaml", b"kind: ConfigMap\n");
        });
        let dir = tempfile::tempdir().unwrap();
        let chart = unpack(&bytes, dir.path(), UnpackLimits::default()).unwrap();
        assert_eq!(chart, dir.path().join("web"));
        assert!(chart.join("templates/cm.yaml").is_file());
    }

    #[test]
    fn escapes_links_and_bombs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let climbing = archive(|b| file(b, "web/../../etc/x", b"x"));
        let error = unpack(&climbing, dir.path(), UnpackLimits::default()).unwrap_err();
        assert!(error.contains("leaves the archive"), "{error}");

        let linked = archive(|b| {
            file(b, "web/Chart.yaml", b"name: web\n");
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            b.append_link(&mut header, "web/values.yaml", "/etc/passwd")
                .unwrap();
        });
        let error = unpack(&linked, dir.path(), UnpackLimits::default()).unwrap_err();
        assert!(error.contains("symlink"), "{error}");

        let big = archive(|b| file(b, "web/Chart.yaml", &vec![b'a'; 4096]));
        let limits = UnpackLimits {
            max_bytes: 1000,
            max_entries: 10,
        };
        let error = unpack(&big, dir.path(), limits).unwrap_err();
        assert!(error.contains("more than 1000 bytes"), "{error}");

        let two = archive(|b| {
            file(b, "web/Chart.yaml", b"name: web\n");
            file(b, "other/x", b"x");
        });
        let error = unpack(&two, dir.path(), UnpackLimits::default()).unwrap_err();
        assert!(error.contains("outside the chart's directory"), "{error}");

        let error = unpack(b"not gzip", dir.path(), UnpackLimits::default()).unwrap_err();
        assert!(!error.is_empty());
        assert!(!dir.path().parent().unwrap().join("etc/x").exists());
    }
}
