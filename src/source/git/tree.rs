//! The files under a source path at one commit, read from the mirror's tree.

use super::command::Git;
use super::{GitError, SourceFile};

impl Git<'_> {
    pub(super) async fn read_files(
        &self,
        commit: &str,
        path: &str,
    ) -> Result<Vec<SourceFile>, GitError> {
        let mut args = vec!["ls-tree", "-r", "-z", "--full-tree", commit, "--"];
        if !path.is_empty() {
            args.push(path);
        }
        let listing = self.run_checked(&args, None, "ls-tree").await?;
        let prefix = format!("{path}/");
        let mut blobs = Vec::new();
        for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            let Some((mode, kind, id, name)) = parse_tree_entry(entry) else {
                return Err(self.unexpected(&args, "unexpected ls-tree output"));
            };
            if !path.is_empty() && name == path {
                return Err(GitError::NotADirectory {
                    path: path.to_owned(),
                    commit: commit.to_owned(),
                });
            }
            if !path.is_empty() && !name.starts_with(&prefix) {
                continue;
            }
            // Symlinks could point outside the path, and submodules are
            // another repository: neither is part of the source.
            if kind == "blob" && mode != "120000" {
                blobs.push((name, id));
            }
        }
        if blobs.is_empty() && !path.is_empty() {
            return Err(GitError::PathNotFound {
                path: path.to_owned(),
                commit: commit.to_owned(),
            });
        }
        if blobs.is_empty() {
            return Ok(Vec::new());
        }

        let mut input = Vec::with_capacity(blobs.len() * 41);
        for (_, id) in &blobs {
            input.extend_from_slice(id.as_bytes());
            input.push(b'\n');
        }
        let args = ["cat-file", "--batch"];
        let batch = self.run_checked(&args, Some(input), "cat-file").await?;
        let contents = parse_batch(&batch, blobs.len())
            .ok_or_else(|| self.unexpected(&args, "unexpected cat-file output"))?;
        let mut files: Vec<SourceFile> = blobs
            .into_iter()
            .zip(contents)
            .map(|((path, _), contents)| SourceFile { path, contents })
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    fn unexpected(&self, args: &[&str], what: &str) -> GitError {
        GitError::Git {
            command: args.join(" "),
            stderr: what.to_owned(),
        }
    }
}

/// `<mode> SP <type> SP <id> TAB <path>`.
fn parse_tree_entry(entry: &[u8]) -> Option<(&str, &str, &str, String)> {
    let tab = entry.iter().position(|b| *b == b'\t')?;
    let meta = std::str::from_utf8(&entry[..tab]).ok()?;
    let mut fields = meta.split(' ');
    let (mode, kind, id) = (fields.next()?, fields.next()?, fields.next()?);
    // Git allows any bytes in a path; the rest of Setpoint works with text.
    let name = String::from_utf8_lossy(&entry[tab + 1..]).into_owned();
    Some((mode, kind, id, name))
}

/// `<id> SP <type> SP <size> LF <contents> LF`, once per object asked for.
fn parse_batch(mut batch: &[u8], expected: usize) -> Option<Vec<Vec<u8>>> {
    let mut contents = Vec::with_capacity(expected);
    while contents.len() < expected {
        let newline = batch.iter().position(|b| *b == b'\n')?;
        let header = std::str::from_utf8(&batch[..newline]).ok()?;
        let size: usize = header.rsplit(' ').next()?.parse().ok()?;
        let body = batch.get(newline + 1..newline + 1 + size)?;
        contents.push(body.to_vec());
        batch = batch.get(newline + 1 + size + 1..)?;
    }
    Some(contents)
}
